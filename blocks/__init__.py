"""
The engine side: what a user configures, and what lives as long as a flow run.

Public names
------------
CudfPolarsEngine
    The Prefect block (type slug ``cudf-polars-engine``) configuring the engine.
CudfPolarsTaskRunner
    Thread-pool task runner that opens a session for each flow run.
EngineSession
    One engine for one flow run (owner thread, result registry, teardown).
get_engine_session
    The active session, from a flow body or any of its task threads.
GPUResult
    The handle a GPU task returns (also exported by :mod:`prefect_cudf_polars.tasks`).
NoEngineSessionError, NoGPUError, SessionError
    Errors of session lookup, GPU availability and session lifecycle.
BlockNotFoundError
    No saved engine block has that name (a ``LookupError`` and a ``ValueError``).

Rooms
-----
Each room imports only the rooms listed below it (imports under
``typing.TYPE_CHECKING``, which never run, may name any room for annotations);
``tests/test_layering.py`` fails when an import goes the other way. The
package never imports :mod:`prefect_cudf_polars.tasks` or
:mod:`prefect_cudf_polars.flows`.

``task_runner``
    :class:`CudfPolarsTaskRunner`.
``engine_block``
    :class:`CudfPolarsEngine`, the configuration.
``session/``
    :class:`EngineSession`, split by job: the session and its lifecycle rules,
    the owner thread, the result registry, memory readings, log lines.
``monitoring/``
    What the Prefect UI shows: events, artifacts, task run names.
``results/``
    :class:`GPUResult`, its lineage, splitting, and the one walker over task
    arguments.
``backends/``
    The engines: one adapter per backend (``cpu``, ``spmd``, ``dask/``,
    ``ray/``), the GPU probe, the backend choice, engine error translation.
``active``
    Which session is active here.
``errors``
    The errors the engine side raises.
"""

from prefect_cudf_polars.blocks.active import get_engine_session
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import (
    BlockNotFoundError,
    NoEngineSessionError,
    NoGPUError,
    SessionError,
)
from prefect_cudf_polars.blocks.results.result import GPUResult
from prefect_cudf_polars.blocks.session import EngineSession
from prefect_cudf_polars.blocks.task_runner import CudfPolarsTaskRunner

__all__ = [
    "BlockNotFoundError",
    "CudfPolarsEngine",
    "CudfPolarsTaskRunner",
    "EngineSession",
    "GPUResult",
    "NoEngineSessionError",
    "NoGPUError",
    "SessionError",
    "get_engine_session",
]
