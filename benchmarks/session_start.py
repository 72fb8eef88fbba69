"""
The engine session's start, split into ours and cudf-polars' parts.

``python -m benchmarks --session-start --out DIR`` starts the block's backend
``--runs`` times in one process, in one flow run, and times each public call
the session's start makes with ``time.perf_counter``:

==================  ===========================================================  ===================
piece               call                                                         whose
==================  ===========================================================  ===================
``probe``           ``resolve_backend(block)``: backend choice, GPU probe        ours
``import``          ``import cudf_polars.engine.<backend>``                      cudf-polars'
``options``         ``engine_kwargs(block)``: the block as engine options        ours
``engine``          ``start_backend(backend, block)``: the engine's constructor  cudf-polars'
``describe``        ``RunningEngine.describe()``: GPU names, ranks, versions     ours, on cudf-polars' rank calls
``versions``        ``rapids_versions()`` alone (``importlib.metadata``; also    ours
                    inside ``describe()``), timed before it
``memory``          the first memory reading (``MemoryTracker.record``)          ours
``owner-thread``    ``OwnerThread(name)``: the engine's thread                   ours
``announce``        ``EngineSession.announce()``: start line, ``engine.started``  ours
``open``            the whole ``with block.session():`` entry, in a flow run      both
``shutdown``        ``RunningEngine.shutdown()`` (not part of the start)         cudf-polars'
==================  ===========================================================  ===================

The pieces from ``probe`` to ``memory`` run one after another on this thread,
which creates, uses and shuts down that engine; ``announce`` is timed on a
session opened outside the flow run's context (so that its opening announces
nothing) and announced in it; ``open`` is a fresh session entered in the flow
run. The first start is the first in the process, with cold imports, as for a
deployment's flow run in a new process; later starts show what is left once
everything is imported (their median is reported).
"""

from __future__ import annotations

import contextvars
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

from prefect import flow

from benchmarks.results_file import error_text

#: cudf-polars' engine module of each backend (cudf-polars 26.10).
ENGINE_MODULES = {
    "spmd": "cudf_polars.engine.spmd",
    "dask": "cudf_polars.engine.dask",
    "ray": "cudf_polars.engine.ray",
}

#: Piece name, readable call, whose time it is: in table order.
PIECES: tuple[tuple[str, str, str], ...] = (
    ("probe", "backend choice and GPU probe (resolve_backend)", "ours"),
    ("import", "import of cudf-polars' engine module", "cudf-polars"),
    ("options", "block fields as engine options (engine_kwargs)", "ours"),
    ("engine", "engine creation (start_backend: the engine's constructor)", "cudf-polars"),
    ("describe", "describe(): GPU names on the ranks, versions", "ours"),
    ("versions", "versions lookup alone (importlib.metadata; also inside describe())", "ours"),
    ("memory", "first memory reading", "ours"),
    ("owner-thread", "owner thread start", "ours"),
    ("announce", "announce: start line, engine.started event", "ours"),
    ("open", "whole session entry (with block.session(), in a flow run)", "both"),
    ("shutdown", "engine shutdown (not part of the start)", "cudf-polars"),
)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def start_pieces(block: Any) -> tuple[str, dict[str, float | None]]:
    """
    One start of the block's backend, piece by piece, on this thread; shut down after.

    Returns
    -------
    (backend, seconds)
        The resolved backend, and piece name to seconds (``None`` where the
        backend has no such piece).

    Raises
    ------
    NoGPUError, Exception
        What the backend choice or the engine's start raises.
    """
    from prefect_cudf_polars.blocks.backends.choice import resolve_backend, start_backend
    from prefect_cudf_polars.blocks.session.memory import MemoryTracker

    seconds: dict[str, float | None] = {}
    seconds["probe"], (backend, _) = _timed(lambda: resolve_backend(block))
    module = ENGINE_MODULES.get(backend)
    seconds["import"] = _timed(lambda: importlib.import_module(module))[0] if module else None
    if module:
        from prefect_cudf_polars.blocks.backends.streaming import rapids_versions
        from prefect_cudf_polars.blocks.backends.streaming_options import engine_kwargs

        seconds["options"] = _timed(lambda: engine_kwargs(block))[0]
        seconds["versions"] = _timed(rapids_versions)[0]
    else:
        seconds["options"] = seconds["versions"] = None
    seconds["engine"], running = _timed(lambda: start_backend(backend, block))
    try:
        seconds["describe"] = _timed(running.describe)[0]
        seconds["memory"] = _timed(lambda: MemoryTracker().record("at_start", running))[0]
    finally:
        seconds["shutdown"] = _timed(running.shutdown)[0]
    return backend, seconds


def owner_thread_start() -> float:
    """Seconds to start a session's owner thread (stopped after, untimed)."""
    from prefect_cudf_polars.blocks.session.owner import OwnerThread

    seconds, owner = _timed(lambda: OwnerThread("cudf-polars-engine-owner-bench"))
    owner.stop()
    return seconds


def announce_seconds(block: Any) -> float:
    """
    Seconds of ``EngineSession.announce()`` in this flow run, on a session opened outside its context.

    The session is opened in an empty context (no flow run visible, so opening
    announces nothing), announced here, and closed after, untimed.
    """
    from prefect_cudf_polars.blocks.session.session import EngineSession

    session = EngineSession(block)
    contextvars.Context().run(session.open, activate=False)
    try:
        return _timed(session.announce)[0]
    finally:
        session.close()


def open_seconds(block: Any) -> float:
    """Seconds to enter ``block.session()`` in this flow run (closed after, untimed)."""
    session = block.session()
    seconds = _timed(session.__enter__)[0]
    session.__exit__(None, None, None)
    return seconds


def measure(block: Any, *, repeats: int) -> dict[str, Any]:
    """
    Start the block's backend ``repeats`` times, piece by piece, in one flow run.

    Returns
    -------
    dict
        ``status`` (``ok`` or ``failed``, with ``error``), ``backend``,
        ``repeats``, and ``pieces``: per piece ``label``, ``whose``,
        ``first_ms`` (the first start in this process), ``later_median_ms``
        (median of the later starts, ``None`` with one start) and ``runs_ms``.
    """
    runs: dict[str, list[float | None]] = {name: [] for name, _, _ in PIECES}

    @flow(name="tpch-session-start", validate_parameters=False)
    def session_start() -> str:
        backend = "?"
        for _ in range(max(1, repeats)):
            backend, seconds = start_pieces(block)
            seconds["owner-thread"] = owner_thread_start()
            seconds["announce"] = announce_seconds(block)
            seconds["open"] = open_seconds(block)
            for name in runs:
                runs[name].append(seconds.get(name))
        return backend

    try:
        backend = session_start()
    except Exception as exc:
        return {"status": "failed", "error": error_text(exc), "repeats": repeats, "pieces": {}}
    pieces = {}
    for name, label, whose in PIECES:
        if backend not in ENGINE_MODULES and whose == "cudf-polars":
            whose = f"ours ({backend} backend)"
        values = [v * 1000 if v is not None else None for v in runs[name]]
        later = [v for v in values[1:] if v is not None]
        pieces[name] = {
            "label": label,
            "whose": whose,
            "first_ms": values[0] if values else None,
            "later_median_ms": statistics.median(later) if later else None,
            "runs_ms": values,
        }
    return {"status": "ok", "backend": backend, "repeats": repeats, "pieces": pieces}
