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

``errors``, ``runs``, ``active``
    The errors and their advice; the run some code runs in; which session
    provider is innermost here (one context variable), and
    :func:`get_engine_session`, its session.
``engine_options``, ``engine_block``
    The one translation of the block's fields into cudf-polars' options;
    :class:`CudfPolarsEngine`: fields, one validator each, load and save.
``admission``
    The session's GiB of device memory held in a Prefect global concurrency
    limit while its engine runs.
``backends/``
    One adapter per engine (``cpu``, ``streaming`` for ``spmd``, ``dask/``,
    ``ray/``); every third-party private access in ``backends/compat``.
``persistence``, ``deferred``, ``result_owner``, ``results``, ``arguments``, ``lineage``
    :class:`GPUResult` (one locked state machine) and the rules no serializer
    breaks; what a deferred result holds; what a result asks of its session;
    the one walk of a task's arguments; how a result is produced again.
``memory``, ``result_book``
    Held results within ``device_memory_limit``; a session's results and their counts.
``engine``, ``engine_call``, ``send_queue``, ``artifact_text``, ``telemetry``, ``nesting``, ``exits``
    The engine host (owner thread and exit stack); one engine call, waited for
    by a thread or a coroutine; the queue that sends events and log lines off
    the caller's path; the text of the artifacts; what Prefect is told; which
    subflows share an engine; sessions open at interpreter exit.
``session_calls``, ``session``
    The session's engine calls; :class:`EngineSession`.
``task_runner``
    :class:`CudfPolarsTaskRunner`.
"""

from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import (AdmissionError, BlockNotFoundError, NoEngineSessionError, NoGPUError,
                                               SessionError)
from prefect_cudf_polars.blocks.results import GPUResult
from prefect_cudf_polars.blocks.active import get_engine_session
from prefect_cudf_polars.blocks.session import EngineSession
from prefect_cudf_polars.blocks.task_runner import CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.backends import compat as _compat

# An admission wait asks Prefect for its slots in requests that time out (admission.py), and
# Prefect logs an ERROR for each one that does: those records are dropped.
_compat.quiet_timed_out_slot_requests()

__all__ = ["AdmissionError", "BlockNotFoundError", "CudfPolarsEngine", "CudfPolarsTaskRunner", "EngineSession",
           "GPUResult", "NoEngineSessionError", "NoGPUError", "SessionError", "get_engine_session"]
