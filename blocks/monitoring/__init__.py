"""
What the Prefect UI shows of engine sessions and results: events, artifacts, task run names.

:mod:`~prefect_cudf_polars.blocks.monitoring.monitor` (the session's one link
to the UI), :mod:`~prefect_cudf_polars.blocks.monitoring.events` (event names
and resources), :mod:`~prefect_cudf_polars.blocks.monitoring.artifacts` (the
markdown a user reads instead of the data),
:mod:`~prefect_cudf_polars.blocks.monitoring.run_names` (task runs named after
their query).
"""
