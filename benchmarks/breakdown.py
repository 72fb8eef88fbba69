"""
Where the per-step time of a GPU pipeline goes: each step timed with and without each piece of ours.

``python -m benchmarks --breakdown --scale-factors 10 --out DIR`` runs, in one
flow run and one engine session per scale factor, these modes of every
pipeline, round-robin (:func:`benchmarks.timing.interleave`), and times each
step:

==================  ===================================================================
``bare``            the engine calls alone ((b)), on the engine's thread
``session``         ``EngineSession.execute`` / ``collect`` in the flow body, no Prefect
``plain-tasks``     plain Prefect tasks making the bare calls ((h)), on the engine's thread
``gpu-tasks``       our ``gpu_task`` per step ((a))
``gpu-tasks -X``    the same with one piece of ours switched off (:data:`PIECES`)
``gpu-tasks -all``  the same with every piece switched off
==================  ===================================================================

``gpu-tasks`` minus ``plain-tasks`` is our cost per step; ``gpu-tasks`` minus
``gpu-tasks -X`` what piece X costs on a task's critical path. After each run
of a mode that produces GPU results the harness waits for the session's pending
artifacts (``session.monitor.flush()``), outside the timing and with the mode's
pieces still off.

Switching pieces off goes through the product's public seams where there is
one (:attr:`Piece.seam` says which); where there is none, the piece's function
is monkeypatched with :func:`unittest.mock.patch.object` for the length of one
run and restored after it. Each replacement counts its calls, and a mode whose
replacement was never called is marked ``ineffective``: the product no longer
calls what the harness patches, and this module needs adapting to its layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from prefect import flow
from prefect.context import FlowRunContext

from benchmarks.bare_variants import chained
from benchmarks.engine_thread import EngineThread
from benchmarks.pipelines import Paths, Pipeline
from benchmarks.plain_tasks import chain, floor_tasks
from benchmarks.prefect_flows import VariantRunner, settle, step_tasks
from benchmarks.results_file import error_text
from benchmarks.timing import Budget, BudgetSpentError, RunOutcome, interleave


class PieceUnavailableError(RuntimeError):
    """What the harness patches to switch a piece off is not in the product any more."""


#: ``(target, attribute, replacement)``: ``target`` is ``"module"`` or ``"module:Class"``.
Patch = tuple[str, str, Callable[..., Any]]


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _inputs_as_given(obj: Any, session: Any, fresh: list[Any]) -> Any:
    return obj


@dataclass(frozen=True)
class Piece:
    """
    One piece of our per-step work, and how the breakdown switches it off.

    Attributes
    ----------
    name, label
        Short id and readable name.
    seam
        How it is switched off: the product's public seam, or what is
        monkeypatched for want of one.
    patches
        The monkeypatches (none for a piece switched off through a seam); the
        first one's calls are counted.
    option
        The :class:`~prefect_cudf_polars.blocks.monitoring.monitor.MonitorOptions`
        field set to ``False`` on the session's monitor for the run, or ``None``.
    """

    name: str
    label: str
    seam: str
    patches: tuple[Patch, ...] = ()
    option: str | None = None


#: The pieces of ours on a GPU task's path. Patched names checked against this
#: project's layout (blocks/monitoring, blocks/session, blocks/results, tasks/gpu_task.py).
PIECES: tuple[Piece, ...] = (
    Piece(
        "artifact",
        "artifact writing",
        "seam SessionMonitor.options.result_artifacts = False (no result artifact is built or written)",
        option="result_artifacts",
    ),
    Piece(
        "plan",
        "plan rendering",
        "seam SessionMonitor.options.plans = False (result artifacts are written without the plan)",
        option="plans",
    ),
    Piece(
        "events",
        "events",
        "seam SessionMonitor.options.events = False (no prefect_cudf_polars.* event)",
        option="events",
    ),
    Piece(
        "memory",
        "memory reading",
        "no seam: MemoryTracker.read is monkeypatched (no rmm reading after each engine call)",
        (("prefect_cudf_polars.blocks.session.memory:MemoryTracker", "read", _nothing),),
    ),
    Piece(
        "lineage",
        "lineage recording",
        "no seam: gpu_task's Lineage, Lineage.of_query and recompute_for_retry are monkeypatched "
        "(no lineage is recorded, no retry-input walk)",
        (
            ("prefect_cudf_polars.tasks.gpu_task", "Lineage", _nothing),
            ("prefect_cudf_polars.blocks.results.lineage:Lineage", "of_query", staticmethod(_nothing)),
            ("prefect_cudf_polars.tasks.gpu_task", "recompute_for_retry", _inputs_as_given),
        ),
    ),
    Piece(
        "hop",
        "owner-thread hop",
        "seam EngineSession.run: the tasks are called on the session's owner thread, where "
        "the session's engine calls run in place",
    ),
)
PIECE_NAMES = tuple(p.name for p in PIECES)


@dataclass(frozen=True)
class Mode:
    """One way of running a pipeline in the breakdown (see the module docstring)."""

    name: str
    label: str
    kind: str  # "bare", "session", "plain" or "tasks"
    off: tuple[str, ...] = field(default=())


MODES: tuple[Mode, ...] = (
    Mode("bare", "bare engine calls ((b), engine's thread)", "bare"),
    Mode("session", "EngineSession.execute / collect, no Prefect", "session"),
    Mode("plain-tasks", "plain Prefect tasks, bare calls ((h), engine's thread)", "plain"),
    Mode("gpu-tasks", "gpu_tasks ((a))", "tasks"),
    *(Mode(f"gpu-tasks -{p.name}", f"gpu_tasks, {p.label} off", "tasks", (p.name,)) for p in PIECES),
    Mode("gpu-tasks -all", "gpu_tasks, all of these off", "tasks", PIECE_NAMES),
)


def _resolve(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise PieceUnavailableError(
            f"{module_name} cannot be imported ({exc}): adapt benchmarks/breakdown.py "
            "to the product's layout"
        ) from None
    if attr:
        if not hasattr(obj, attr):
            raise PieceUnavailableError(
                f"{module_name} has no {attr}: adapt benchmarks/breakdown.py to the product's layout"
            )
        obj = getattr(obj, attr)
    return obj


class CallCounter:
    """Calls of the replacements, per piece (the monitor's writer thread calls some)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: dict[str, int] = {}

    def counted(self, piece: str, replacement: Callable[..., Any]) -> Callable[..., Any]:
        """``replacement`` that counts its calls under ``piece`` (a staticmethod stays one)."""
        inner = replacement.__func__ if isinstance(replacement, staticmethod) else replacement

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.add(piece)
            return inner(*args, **kwargs)

        return staticmethod(counting) if isinstance(replacement, staticmethod) else counting

    def add(self, piece: str) -> None:
        """Count one call of ``piece``."""
        with self._lock:
            self.calls[piece] = self.calls.get(piece, 0) + 1


@contextlib.contextmanager
def switched_off(pieces: tuple[Piece, ...], counter: CallCounter) -> Iterator[None]:
    """
    Apply the pieces' monkeypatches for the ``with`` block; restore them after.

    The first patch of each piece counts its calls in ``counter``, under the piece's name.

    Raises
    ------
    PieceUnavailableError
        When a patched module or attribute is gone (nothing is patched then).
    """
    planned = []
    for piece in pieces:
        for i, (target, attr, replacement) in enumerate(piece.patches):
            owner = _resolve(target)
            if not hasattr(owner, attr):
                raise PieceUnavailableError(
                    f"{target} has no {attr}: adapt benchmarks/breakdown.py to the product's layout"
                )
            planned.append((owner, attr, counter.counted(piece.name, replacement) if i == 0 else replacement))
    with contextlib.ExitStack() as stack:
        for owner, attr, replacement in planned:
            stack.enter_context(mock.patch.object(owner, attr, replacement))
        yield


@contextlib.contextmanager
def monitor_options(session: Any, off: dict[str, bool], counter: CallCounter) -> Iterator[None]:
    """
    Set the session monitor's options in ``off`` for the ``with`` block; restore them after.

    Each piece switched off this way counts one call per run when the session's
    monitor has the option (a renamed option fails here, not silently).
    """
    if not off:
        yield
        return
    monitor = session.monitor
    before = monitor.options
    monitor.options = dataclasses.replace(before, **off)
    for piece in PIECES:
        if piece.option in off:
            counter.add(piece.name)
    try:
        yield
    finally:
        monitor.options = before


def session_chained(session: Any, pipeline: Pipeline, paths: Paths) -> RunOutcome:
    """One pipeline run through ``EngineSession.execute`` / ``collect`` in the flow body, no Prefect task."""
    steps_s: dict[str, float] = {}
    started = time.perf_counter()
    value: Any = None
    last = len(pipeline.steps) - 1
    for i, step in enumerate(pipeline.steps):
        t = time.perf_counter()
        lf = step.build(value.lazy() if value is not None else None, paths)
        new = session.collect(lf) if i == last else session.execute(lf, name=step.name)
        if value is not None:
            value.release()  # already read: frees what its scan left
        value = new
        steps_s[step.name] = time.perf_counter() - t
    return RunOutcome(time.perf_counter() - started, value, steps_s)


class BreakdownRunner:
    """The callables of each mode for one pipeline, on one open session."""

    def __init__(self, session: Any, paths: Paths, counters: dict[str, CallCounter]) -> None:
        self.session = session
        self.paths = paths
        self.counters = counters
        self.variants = VariantRunner(paths, session, gpu=False)
        self.thread: EngineThread = self.variants.thread  # type: ignore[assignment]

    def for_mode(self, mode: Mode, p: Pipeline) -> Callable[[], RunOutcome]:
        """The callable that runs ``p`` once in ``mode``."""
        session, paths, thread = self.session, self.paths, self.thread
        engine = self.variants.engine
        if mode.kind == "bare":
            return lambda: thread.call(chained, engine, p, paths)
        if mode.kind == "plain":
            floor = floor_tasks(p, paths, engine, thread)  # type: ignore[arg-type]
            return lambda: thread.call(chain, p, floor)
        if mode.kind == "session":
            return lambda: self._settled(session_chained(session, p, paths))
        tasks = step_tasks(p, paths)
        counter = self.counters[mode.name]
        patched = tuple(p for p in PIECES if p.name in mode.off and p.patches)

        def on_owner_thread() -> RunOutcome:
            thread.check(f"breakdown mode {mode.name!r}")
            counter.add("hop")
            return chain(p, tasks)

        options_off = {p.option: False for p in PIECES if p.name in mode.off and p.option}

        def run() -> RunOutcome:
            with switched_off(patched, counter), monitor_options(session, options_off, counter):
                outcome = thread.call(on_owner_thread) if "hop" in mode.off else chain(p, tasks)
                settle(session)  # the artifacts are written with the pieces still off
            return outcome

        return run

    def _settled(self, outcome: RunOutcome) -> RunOutcome:
        settle(self.session)
        return outcome


def run_breakdown(
    *,
    label: str,
    block: Any,
    pipelines: list[Pipeline],
    paths: Paths,
    runs: int,
    warmups: int,
    budget: Budget,
) -> dict[str, Any]:
    """
    Run every mode of every pipeline, interleaved, in one flow run and one engine session.

    Parameters
    ----------
    label
        Goes into the flow run's name (the scale factor).
    block
        The engine block.
    pipelines, paths
        What to run, on which tables.
    runs, warmups, budget
        See :func:`benchmarks.timing.interleave` (rounds per pipeline).

    Returns
    -------
    dict
        ``pipelines``, ``steps`` (per pipeline), ``pieces`` (label and seam of
        each), ``modes`` (per mode: ``label``, ``off``, ``status`` — ``ok``,
        ``failed``, ``skipped``, ``unavailable`` or ``ineffective`` — ``error``,
        ``switch_calls`` and ``pipelines``: per pipeline the
        :class:`~benchmarks.timing.Timing` fields), ``session`` (its summary),
        ``flow_run_id``, ``runs``, ``warmups``.

    Raises
    ------
    NoGPUError, SessionError, Exception
        When the session cannot start; a mode's own errors are recorded in it.
    """

    @flow(name="tpch-breakdown", flow_run_name=f"breakdown-sf{label}", validate_parameters=False)
    def tpch_breakdown() -> dict[str, Any]:
        counters = {m.name: CallCounter() for m in MODES}
        modes: dict[str, dict[str, Any]] = {
            m.name: {"label": m.label, "off": list(m.off), "status": "ok", "pipelines": {}}
            for m in MODES
        }
        with block.session() as session:
            runner = BreakdownRunner(session, paths, counters)
            for p in pipelines:
                outcomes = interleave(
                    {m.name: runner.for_mode(m, p) for m in MODES},
                    runs=runs,
                    warmups=warmups,
                    budget=budget,
                )
                for name, outcome in outcomes.items():
                    _record(modes[name], p.name, outcome)
            summary = session.summary()
        for m in MODES:
            entry = modes[m.name]
            entry["switch_calls"] = dict(counters[m.name].calls)
            idle = [piece for piece in m.off if not counters[m.name].calls.get(piece)]
            if entry["status"] == "ok" and idle:
                entry["status"] = "ineffective"
                entry["error"] = (
                    f"switched off {idle}, but the product never called the replacement: "
                    "adapt benchmarks/breakdown.py to the product's layout"
                )
        return {
            "pipelines": [p.name for p in pipelines],
            "steps": {p.name: [s.name for s in p.steps] for p in pipelines},
            "pieces": {p.name: {"label": p.label, "seam": p.seam} for p in PIECES},
            "modes": modes,
            "session": summary,
            "flow_run_id": str(FlowRunContext.get().flow_run.id),
            "runs": runs,
            "warmups": warmups,
        }

    return tpch_breakdown()


def _record(entry: dict[str, Any], pipeline: str, outcome: Any) -> None:
    if isinstance(outcome, BaseException):
        status = (
            "unavailable"
            if isinstance(outcome, PieceUnavailableError)
            else "skipped"
            if isinstance(outcome, BudgetSpentError)
            else "failed"
        )
        entry["pipelines"][pipeline] = {"status": status, "error": error_text(outcome)}
        if entry["status"] == "ok":
            entry["status"], entry["error"] = status, error_text(outcome)
        return
    entry["pipelines"][pipeline] = {"status": "ok", **outcome.as_dict()}
