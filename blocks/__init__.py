"""
The engine side: what a user configures, and what lives as long as a flow run.

Public names
------------
CudfPolarsEngine
    The Prefect block (type slug ``cudf-polars-engine``) configuring the engine.
CudfPolarsTaskRunner
    Thread-pool task runner that opens a session for each flow run.
EngineSession
    One engine for one flow run: its results, their counts, its end.
get_engine_session
    The active session, from a flow body or any of its task threads.
GPUResult
    The handle a GPU task returns (also exported by :mod:`prefect_cudf_polars.tasks`).
NoEngineSessionError, NoGPUError, SessionError
    Errors of session lookup, GPU availability and session lifecycle.
AdmissionError
    A session's admission slots (``admission_limit``) could not be occupied, or not in time.
BlockNotFoundError
    No saved engine block has that name (a ``LookupError`` and a ``ValueError``).

Layers
------
Each module imports only the layers below it, ``TYPE_CHECKING`` imports
included (``tests/test_layering.py``); a protocol in a lower layer types what
an upper one provides. Bottom to top:

``errors``, ``active``
    The errors; which session provider is innermost here (one context variable),
    and :func:`get_engine_session`, its session.
``engine_block``
    :class:`CudfPolarsEngine`: fields, checks, and the one translation into
    cudf-polars' options.
``admission``
    The session's GiB of device memory held in a Prefect global concurrency
    limit while its engine runs.
``backends/``
    One adapter per engine (``cpu``, ``streaming`` for ``spmd``, ``dask/``,
    ``ray/``); every third-party private access in ``backends/compat``.
``persistence``, ``deferred``, ``results``, ``lineage``
    :class:`GPUResult` and the rules no serializer breaks; what a deferred result holds;
    how a result is produced again.
``engine``, ``telemetry``, ``nesting``, ``exits``
    The engine host (owner thread and exit stack); what Prefect is told;
    which subflows share an engine; sessions open at interpreter exit.
``session``
    :class:`EngineSession`.
``task_runner``
    :class:`CudfPolarsTaskRunner`.
"""

from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import (
    AdmissionError,
    BlockNotFoundError,
    NoEngineSessionError,
    NoGPUError,
    SessionError,
)
from prefect_cudf_polars.blocks.results import GPUResult
from prefect_cudf_polars.blocks.active import get_engine_session
from prefect_cudf_polars.blocks.session import EngineSession
from prefect_cudf_polars.blocks.task_runner import CudfPolarsTaskRunner

__all__ = [
    "AdmissionError",
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
