"""
Benchmarks of prefect-cudf-polars on TPC-H pipelines.

Run ``python -m benchmarks --help`` from the repository root; see ``benchmarks/README.md``.
Modules: ``tpchgen`` data (``tpch_data``), the pipelines (``pipelines``), interleaved
timed rounds (``timing``), the engine's thread (``engine_thread``), the variants
without Prefect (``bare_variants``: b-e), plain Prefect tasks (``plain_tasks``: g, h),
the flow run of every variant (``prefect_flows``: a and the rest interleaved, f), the
tiny-query overhead (``task_overhead``) and its profile (``overhead_profile``), the
per-step breakdown (``breakdown``), the session's start (``session_start``),
``machine``, ``results_file`` (JSON, merge), ``figures`` (what the reports read),
``goals``, ``report`` (markdown), ``chart``, ``variant_names``, ``cli`` (the command)
and ``device-bench.sh`` (the steps on a GPU machine).
"""
