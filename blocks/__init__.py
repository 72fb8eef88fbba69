"""
What a user configures and what lives as long as a flow run.

Public names
------------
CudfPolarsEngine
    The Prefect block (type slug ``cudf-polars-engine``) configuring the engine.
EngineSession
    One engine for one flow run (owner thread, result registry, teardown).
CudfPolarsTaskRunner
    Thread-pool task runner that opens a session for each flow run.
get_engine_session
    The active session, from a flow body or any of its task threads.
NoEngineSessionError, NoGPUError, SessionError
    Errors of session lookup, GPU availability and session lifecycle.
"""

from prefect_cudf_polars.blocks.active import get_engine_session
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.session import EngineSession
from prefect_cudf_polars.blocks.task_runner import CudfPolarsTaskRunner
from prefect_cudf_polars.tasks.errors import NoEngineSessionError, NoGPUError, SessionError

__all__ = [
    "CudfPolarsEngine",
    "CudfPolarsTaskRunner",
    "EngineSession",
    "NoEngineSessionError",
    "NoGPUError",
    "SessionError",
    "get_engine_session",
]
