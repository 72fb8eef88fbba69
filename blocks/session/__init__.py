"""
The engine session, split by job.

:mod:`~prefect_cudf_polars.blocks.session.session` (the session and its
lifecycle rules: start, teardown), :mod:`~prefect_cudf_polars.blocks.session.owner`
(the one thread that runs the engine), :mod:`~prefect_cudf_polars.blocks.session.registry`
(live results; where a claim is recorded), :mod:`~prefect_cudf_polars.blocks.session.memory`
(memory readings and peaks), :mod:`~prefect_cudf_polars.blocks.session.lines`
(the start and end log lines).
"""

from prefect_cudf_polars.blocks.session.session import EngineSession

__all__ = ["EngineSession"]
