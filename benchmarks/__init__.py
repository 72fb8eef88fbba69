"""
Benchmarks of prefect-cudf-polars: TPC-H pipelines, per-task overhead, many small tasks, the session's start.

Run ``python -m benchmarks --help`` from the repository root; ``benchmarks/README.md`` is the manual.
Modules: ``cli`` (the command), ``tpch_data`` (``tpchgen-cli`` parquet), ``pipelines`` (Q1, Q3, Q5
in steps), ``variants`` (what each variant runs), ``flow_run`` (the variants' flow run),
``task_overhead`` ((f)), ``many_tasks``, ``session_start``, ``timing`` (interleaved rounds),
``stats`` (medians and intervals), ``profiling`` (where the time goes), ``machine``,
``results_file`` (``results.json``, merge), ``figures``, ``goals``, ``report`` and ``chart``
(what is written), and ``device-bench.sh`` (the steps on a GPU machine).
"""
