"""
The engine session's start, split into ours and cudf-polars' parts.

``python -m benchmarks --session-start --runs 5 --out DIR`` starts the block's
backend ``--runs`` times in one flow run and times each call of the start with
``time.perf_counter``, in milliseconds:

============  ========================================================================  ============
piece         call                                                                      whose
============  ========================================================================  ============
``probe``     ``resolve_backend(block)``: backend choice, GPU probe                     ours
``import``    ``import cudf_polars.engine.<backend>``                                   cudf-polars'
``engine``    ``start_backend(backend, block, stack)``: the engine's constructor        cudf-polars'
``describe``  ``RunningEngine.describe()``: GPU names on the ranks, versions            ours
``reading``   ``RunningEngine.read()``: the first memory reading                        ours
``shutdown``  closing the exit stack: the engine's shutdown (not part of the start)     cudf-polars'
``open``      the whole ``with block.session():`` entry (owner thread, engine, start    both
              line, ``engine.started`` event), in a flow run
============  ========================================================================  ============

The pieces from ``probe`` to ``shutdown`` run on this thread, which creates,
uses and shuts down that engine. The first start is the first in the process,
with cold imports, as for a deployment's flow run in a new process; the median
of the later starts is what is left once everything is imported.
"""

from __future__ import annotations

import importlib
import statistics
import time
from contextlib import ExitStack
from typing import Any

from prefect import flow

from benchmarks.results_file import error_text

#: cudf-polars' engine module of each GPU backend (cudf-polars 26.10).
ENGINE_MODULES = {"spmd": "cudf_polars.engine.spmd", "dask": "cudf_polars.engine.dask", "ray": "cudf_polars.engine.ray"}

#: Piece, what it times, whose time it is: in table order.
PIECES = (
    ("probe", "backend choice and GPU probe (resolve_backend)", "ours"),
    ("import", "import of cudf-polars' engine module", "cudf-polars"),
    ("engine", "engine creation (start_backend)", "cudf-polars"),
    ("describe", "describe(): GPU names on the ranks, versions", "ours"),
    ("reading", "first memory reading", "ours"),
    ("shutdown", "engine shutdown (not part of the start)", "cudf-polars"),
    ("open", "whole session entry (with block.session(), in a flow run)", "both"),
)


def _ms(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1000, value


def one_start(block: Any) -> tuple[str, dict[str, float | None]]:
    """One start of the block's backend, piece by piece (ms; ``None`` where the backend has no such piece)."""
    from prefect_cudf_polars.blocks.backends.choice import resolve_backend, start_backend

    ms: dict[str, float | None] = {}
    ms["probe"], (backend, _) = _ms(lambda: resolve_backend(block))
    module = ENGINE_MODULES.get(backend)
    ms["import"] = _ms(lambda: importlib.import_module(module))[0] if module else None
    with ExitStack() as stack:
        ms["engine"], running = _ms(lambda: start_backend(backend, block, stack))
        ms["describe"] = _ms(running.describe)[0]
        ms["reading"] = _ms(running.read)[0]
        ms["shutdown"] = _ms(stack.pop_all().close)[0]
    session = block.session()
    ms["open"] = _ms(session.__enter__)[0]
    session.__exit__(None, None, None)
    return backend, ms


def measure(block: Any, *, repeats: int) -> dict[str, Any]:
    """
    Start the block's backend ``repeats`` times in one flow run.

    Returns
    -------
    dict
        ``status`` (``ok``, or ``failed`` with ``error``), ``backend``,
        ``repeats`` and ``pieces``: per piece ``label``, ``whose``, ``first_ms``
        (the first start in this process), ``later_median_ms`` (``None`` with
        one start) and ``runs_ms``.
    """
    runs: dict[str, list[float | None]] = {name: [] for name, _, _ in PIECES}

    @flow(name="tpch-session-start", validate_parameters=False)
    def session_start() -> str:
        backend = "?"
        for _ in range(max(1, repeats)):
            backend, ms = one_start(block)
            for name in runs:
                runs[name].append(ms[name])
        return backend

    try:
        backend = session_start()
    except Exception as exc:
        return {"status": "failed", "error": error_text(exc), "repeats": repeats, "pieces": {}}
    pieces = {}
    for name, label, whose in PIECES:
        later = [v for v in runs[name][1:] if v is not None]
        pieces[name] = {
            "label": label,
            "whose": f"ours ({backend} backend)" if whose == "cudf-polars" and backend not in ENGINE_MODULES else whose,
            "first_ms": runs[name][0],
            "later_median_ms": statistics.median(later) if later else None,
            "runs_ms": runs[name],
        }
    return {"status": "ok", "backend": backend, "repeats": repeats, "pieces": pieces}
