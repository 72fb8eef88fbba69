"""
Benchmarks of prefect-cudf-polars on TPC-H pipelines.

Run ``python -m benchmarks --help`` from the repository root; see ``benchmarks/README.md``.
Modules: ``tpch_data`` (tpchgen-cli parquet), ``pipelines`` (PDS-H derived
steps), ``timing`` (warm-ups, runs, budget), ``bare_variants`` (b-e),
``prefect_flows`` (a and f), ``task_overhead`` (f), ``overhead_profile``
(where a GPU task's time goes), ``machine``, ``results_file`` (JSON),
``report`` (goals, markdown, chart), ``cli`` (the command).
"""
