"""
``GPUResult``: the handle a GPU task returns, one locked state machine over what the engine holds.

A ``GPUResult`` wraps a backend's persisted result (cudf-polars'
``PersistedQueryResult`` behind its adapter, or the ``cpu`` backend's host
counterpart), or, for a deferred step, the step's plan. It adds the rules
cudf-polars states but does not guard. Its states and every transition, each
made under the result's lock::

    live ──claim (lazy, hand_over)──▶ consumed ──free (its query ran, or failed)──▶ consumed, holding nothing
      │                                  │
      └──release, session end──▶ released ◀──release before its query read the frame

* **One claim.** The first :meth:`GPUResult.lazy` claims the result for the
  task run attempt (or flow run) here and builds the frame that reads it,
  inside the lock; every thread of that attempt (each in a copy of its
  context) gets the same frame until a query has read it. Any other claim
  raises :class:`~prefect_cudf_polars.blocks.errors.ResultConsumedError`.
  :meth:`GPUResult.claimed_in` is the one rule for "consumed by this run".
* **One session.** A claim asks the result's own session, through
  :class:`~prefect_cudf_polars.blocks.result_owner.ResultOwner`, which session would read it here; another one is refused
  (``WrongEngineError``). A result never looks up the active session itself.
* **Reads are checked on the engine's thread.** The engine call that runs a
  frame checks it there (:meth:`GPUResult.check_scan`) before the engine
  starts: a released result or a frame an earlier query read is refused, so a
  ``release()`` racing a claim gives either the right rows (the free queues
  behind the engine call) or ``ResultReleasedError``, never a read of freed data.
* **Never persisted, replayable, deferred.** Pickling and every serializer raise
  ``HostPersistenceError`` (:mod:`~prefect_cudf_polars.blocks.persistence`); each result
  keeps the lineage that produced it (:mod:`~prefect_cudf_polars.blocks.lineage`); a
  deferred one holds its step's plan and inputs, which its reader's one engine call runs and frees.
* **Nothing of the engine after use.** Once released, or read, a handle holds no partition;
  once its session has ended it holds nothing of the engine at all, so the handles Prefect's
  states keep cannot keep an engine alive.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import polars as pl
from prefect.cache_policies import STABLE_TRANSFORMS
from pydantic_core import SchemaSerializer, core_schema

from prefect_cudf_polars.blocks import errors
from prefect_cudf_polars.blocks.backends.base import PersistedResult
from prefect_cudf_polars.blocks.backends.plans import cache_id
from prefect_cudf_polars.blocks.deferred import FusedStep, HeldPlan
from prefect_cudf_polars.blocks.persistence import cache_key_form, refuse_host_persistence
from prefect_cudf_polars.blocks.result_owner import EndedSession, ResultOwner
from prefect_cudf_polars.blocks.runs import RunIdentity, current_run

ResultState = Literal["live", "consumed", "released"]


class Replayable(Protocol):
    """What a result asks of its lineage (:class:`prefect_cudf_polars.blocks.lineage.Lineage` provides it)."""

    deferred: bool

    def unreplayable_reason(self) -> str | None:
        """Why the lineage cannot be run again, or ``None`` when it can."""


class GPUResult:
    """
    A query result kept where the engine produced it (GPU memory, or host memory on ``cpu``).

    Returned by :func:`~prefect_cudf_polars.tasks.execute` and by
    :func:`~prefect_cudf_polars.tasks.gpu_task` tasks; never built by users.
    A *deferred* result (``deferred`` is True) holds its step's plan instead
    of data (see the module notes).

    Attributes
    ----------
    id : str
        Unique id (32 hex characters); the stable hash Prefect cache keys use.
    name : str
        Readable name: the query or task that produced it.
    backend : str
        Backend of the producing session.
    session_id : str
        Id of the producing :class:`~prefect_cudf_polars.blocks.EngineSession`.
    schema : polars.Schema
        Column names and dtypes (of a deferred result: resolved from its plan).
    ranks : list of int
        Ranks holding a partition (one partition per rank); empty for a deferred result.
    rows : int or None
        Rows, counted on the ranks when it was produced; ``None`` for a deferred result.
    bytes : int or None
        Its size in bytes (device buffers on GPU backends; polars'
        ``estimated_size`` on ``cpu``); ``None`` for a deferred result.
    rank_bytes : tuple of int
        Its bytes on each of the engine's ranks, in rank order; empty for a deferred result.
    engine_seconds : float
        Seconds the engine call that produced it took (wall clock); 0 for a deferred result.
    produced_by : str
        The task run or flow run that produced it.
    produced_by_task_run_id : str or None
        That task run's id (``None`` outside a task run).
    cache_id : str or None
        The id of the cache its frame is, once claimed (a logical plan shows ``CACHE[id: ...]``).
    lineage : Lineage or None
        The plan that produced it (dropped when its session ends).
    deferred : bool
        Whether it holds a plan that runs fused into its reader's engine call.
    fused : tuple of FusedStep
        The deferred steps whose plans ran inside the engine call that produced
        it, upstream first; for a deferred result, the steps its plan holds,
        its own last.
    """

    __slots__ = ("__weakref__", "_claim", "_frame", "_held", "_lock", "_owner", "_persisted", "_plan", "_state",
                 "backend", "bytes", "cache_id", "deferred", "engine_seconds", "fused", "id", "rank_bytes", "lineage",
                 "name", "produced_by", "produced_by_task_run_id", "ranks", "rows", "schema", "session_id")

    def __init__(self, payload: PersistedResult | HeldPlan, *, owner: ResultOwner, name: str, run: RunIdentity,
                 lineage: Replayable | None = None, engine_seconds: float = 0.0, rows: int | None = None,
                 bytes: int | None = None, rank_bytes: Sequence[int] = (), fused: Sequence[FusedStep] = ()) -> None:
        self.id = uuid.uuid4().hex
        self.name, self.backend, self.session_id = name, owner.backend or "unknown", owner.id
        self.deferred = isinstance(payload, HeldPlan)
        self._persisted: PersistedResult | None = None
        self._plan: pl.LazyFrame | None = None
        self._held: tuple[GPUResult, ...] = ()
        if isinstance(payload, HeldPlan):
            self._plan, self._held, self.fused, self.ranks = payload.plan, payload.held_inputs, payload.steps, []
        else:
            self._persisted, self.fused, self.ranks = payload, tuple(fused), list(payload.ranks)
        self.schema, self.rows, self.bytes, self.engine_seconds = payload.schema, rows, bytes, engine_seconds
        self.rank_bytes = tuple(rank_bytes) or ((bytes,) if bytes else ())
        self.produced_by, self.produced_by_task_run_id = run.name, run.task_run_id
        self.lineage, self.cache_id = lineage, None
        self._claim: RunIdentity | None = None  # the run attempt that claimed it
        self._frame: pl.LazyFrame | None = None  # what the claiming attempt reads, until a query has read it
        self._owner = owner
        self._state: ResultState = "live"
        self._lock = threading.Lock()

    # ---- what it is ----------------------------------------------------------
    @property
    def state(self) -> ResultState:
        """``"live"``, ``"consumed"`` or ``"released"``."""
        return self._state

    @property
    def consumed_by(self) -> str | None:
        """The task run or flow run whose claim consumed it (``None`` until claimed)."""
        return None if self._claim is None else self._claim.name

    def claimed_in(self, run: RunIdentity) -> bool:
        """Whether ``run`` claimed this result, in this attempt or an earlier one: the one rule for "consumed by this run"."""
        claim = self._claim
        return claim is not None and claim.run_id == run.run_id  # outside any run, each thread is its own run

    @property
    def frame_out(self) -> bool:
        """Whether a claim built its frame and no query has read it yet (nor was it freed)."""
        return self._frame is not None

    @property
    def deferred_step(self) -> FusedStep | None:
        """For a deferred result, its own step (name and the task run that deferred it); ``None`` otherwise."""
        return self.fused[-1] if self.deferred and self.fused else None

    @property
    def replay_problem(self) -> str | None:
        """Why this result cannot be produced again from its lineage, or ``None`` when it can."""
        lineage = self.lineage  # read once: the session's end may let go of it meanwhile
        if lineage is None:
            return "it has no recorded lineage (its session has ended, or it was made without one)"
        return lineage.unreplayable_reason()

    @property
    def persisted(self) -> PersistedResult | None:
        """The backend's persisted result while this handle holds it (``None`` once read, released, or deferred)."""
        return self._persisted

    @property
    def held_inputs(self) -> tuple[GPUResult, ...]:
        """The inputs a deferred result's plan reads, until its reader's engine call (or its release) frees them."""
        return self._held

    @property
    def holding(self) -> bool:
        """Whether it still holds something to free: partitions, or a deferred plan and its inputs."""
        return self._persisted is not None or self._plan is not None or bool(self._held)

    @property
    def partitions(self) -> int:
        """Number of partitions (one per rank in ``ranks``)."""
        return len(self.ranks)

    # ---- the rules -------------------------------------------------------------
    def _refusal(self, run: RunIdentity, reader: ResultOwner | None) -> Exception | None:
        """Why ``run`` (in ``reader``'s session) may not claim this result now, or ``None``: under the lock."""
        ids = {"result_id": self.id, "result_name": self.name}
        what = f"GPUResult {self.name!r} (id {self.id})"
        if self._state == "released" or (self._state == "live" and self._owner.closed):  # its session's end releases it
            return errors.ResultReleasedError(errors.released_message(what, self._owner), **ids)
        if self._state == "consumed":
            claim = self._claim
            assert claim is not None  # a consumed result has its claim
            same_run = self.claimed_in(run)
            how = "earlier attempt" if same_run and claim.attempt != run.attempt else "same run" if same_run else "other"
            return errors.ResultConsumedError(errors.consumed_message(what, claim.name, how), consumer=claim.name, **ids)
        if reader is not None and reader.id != self.session_id:
            return errors.WrongEngineError(
                errors.wrong_engine_message(what, self.session_id, self.backend, self._owner.served_run, reader),
                producer_session=self.session_id, current_session=reader.id, **ids)
        return None

    def check_readable(self, reader: ResultOwner | None = None) -> None:
        """
        Raise if this result cannot be claimed now, by the run here in the session ``reader`` (the task's engine
        call checks its inputs against its session); claim nothing.

        Raises
        ------
        ResultReleasedError
            If it was released (explicitly, or by the end of its session).
        ResultConsumedError
            If it was already claimed.
        WrongEngineError
            If ``reader`` is another session than the one that produced it.
        """
        with self._lock:
            refusal = self._refusal(current_run(), reader)
        if refusal is not None:
            raise refusal

    def check_scan(self, run: RunIdentity) -> None:
        """
        Before an engine call reads this result's claimed frame (on the engine's owner thread): refuse a read that
        cannot be, else mark the frame read (a release from now on leaves the result ``"consumed"``).

        Raises
        ------
        ResultReleasedError
            It was released, also after it was claimed.
        ResultConsumedError
            An earlier query read its frame.
        """
        with self._lock:
            if self._state == "consumed" and self._frame is not None:
                self._frame = None  # read by this query: no other query, and no release, takes it now
                return
            refusal = self._refusal(run, None) if self._state == "released" else None
        raise refusal or errors.ResultConsumedError(errors.read_again_message(f"GPUResult {self.name!r} (id {self.id})"),
                                                    consumer=self.consumed_by, result_id=self.id, result_name=self.name)

    # ---- claiming ----------------------------------------------------------------
    def lazy(self) -> pl.LazyFrame:
        """
        Claim the result and return a LazyFrame that reads it.

        The frame must be run by the producing session (the ``execute`` and
        ``collect`` tasks and ``gpu_task`` tasks do this) in one query: running
        it moves the partitions out of the engine's store. That query may read
        it several times (a self-join, a ``concat`` of two filters): the frame
        is a ``cache()`` (polars 1.44 then keeps a filter above the scan rather
        than in it), and every later call in the same task run attempt, on any
        thread, returns the same frame until a query has run it. For a deferred
        result it is the deferred step's plan itself, so the reader's engine
        call runs both steps as one query.

        Returns
        -------
        polars.LazyFrame

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            See :meth:`check_readable` (the reader is the session active here).
        """
        return self._claimed(hand_over=False)

    def hand_over(self) -> PersistedResult | HeldPlan:
        """Claim the result without reading it, and give up what it holds (``tee``'s first copy); raises as
        :meth:`check_readable` does (``ResultReleasedError``, ``ResultConsumedError``, ``WrongEngineError``)."""
        return self._claimed(hand_over=True)

    def _claimed(self, *, hand_over: bool) -> Any:
        """
        A claim by the run here: its transition under the lock (``live`` to ``consumed``, or a refusal), then what
        the claim reads: the frame, built inside the lock and shared by the claiming attempt's threads until a query
        has read it, or, with ``hand_over``, what the result held, given up.
        """
        run, reader = current_run(), self._owner.reader_here()
        with self._lock:
            if not hand_over and self._frame is not None and self.claimed_in(run) \
                    and self._claim.attempt == run.attempt:  # a frame is set with its claim
                return self._frame  # this attempt's claim, shared by its threads
            if (refusal := self._refusal(run, reader)) is not None:
                raise refusal
            self._state, self._claim = "consumed", run
            out: Any = HeldPlan(self._plan, self.schema, self._held, self.fused) if self.deferred else self._persisted
            self._plan = None  # the reader holds a deferred plan now
            if hand_over:
                self._persisted, self._held = None, ()
            else:
                self._frame = out = out.plan if self.deferred else out.lazy().cache()
                self.cache_id = None if self.deferred else cache_id(out)
        self._owner.claimed(self)
        return out

    # ---- freeing ---------------------------------------------------------------
    def release(self) -> None:
        """
        Free the result's memory (idempotent; never raises): queued on the engine's owner thread, not waited for.

        A live result becomes ``"released"``, and so does a claimed one whose
        frame no query has read yet (that query is then refused with
        ``ResultReleasedError``). A consumed one that was read keeps its state.
        A deferred result frees the inputs it held.
        """
        self._let_go(release=True)

    def free(self) -> None:
        """After the engine call that claimed it ran (or failed): free what its read left, close its frame; the state stays."""
        self._let_go(release=False)

    def _let_go(self, *, release: bool) -> None:
        """Let go of what it holds (:meth:`_take_all`), then free it; with ``release``, a live result, or a claimed one
        whose frame no query read, becomes ``"released"``."""
        with self._lock:
            was_live = release and self._state == "live"
            if was_live or (release and self._frame is not None):
                self._state = "released"
            persisted, held = self._take_all()
        if was_live:
            self._owner.released(self)
        if persisted is not None:
            self._owner.free(persisted)
        for result in held:
            result.free()

    def _take_all(self) -> tuple[PersistedResult | None, tuple[GPUResult, ...]]:
        """Under the lock: let go of the partitions, the plan, the held inputs and the frame. Returns the partitions
        and the held inputs, for the caller to free."""
        taken = self._persisted, self._held
        self._persisted, self._held, self._plan, self._frame = None, (), None, None
        return taken

    def move(self, mover: Callable[[PersistedResult], PersistedResult | None]) -> PersistedResult | None:
        """While live and holding partitions, hold ``mover(persisted)`` instead (unless ``None``) and return it."""
        with self._lock:
            if self._state != "live" or self._persisted is None:
                return None
            moved = mover(self._persisted)
            self._persisted = self._persisted if moved is None else moved
            return moved

    def drop_partitions(self) -> None:
        """On the engine's owner thread: let go of what it holds (:meth:`_take_all`) and free it now; the state stays."""
        with self._lock:
            persisted, held = self._take_all()
        if persisted is not None:
            persisted.release()
        for result in held:
            result.drop_partitions()

    def end(self, tombstone: EndedSession, *, drop: bool) -> None:
        """
        The session's end: point at ``tombstone`` (what is left of the session); a live result is released.

        With ``drop``, let go of the partitions (without calling the engine: its shutdown closed the
        stores), the plan, the held inputs and the lineage; without, the session's queued teardown frees
        them on the engine's thread if the engine answers.
        """
        with self._lock:
            self._owner = tombstone
            if self._state == "live":
                self._state = "released"
            persisted = None
            if drop:  # its held inputs are results of the session too: the session ends each of them
                persisted, self.lineage = self._take_all()[0], None
        if persisted is not None:
            persisted.forget()

    def __enter__(self) -> GPUResult:
        """Return the result; :meth:`release` runs on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- identity, repr, refusals ---------------------------------------------
    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v}" for k, v in list(self.schema.items())[:8]) + (", ..." if len(self.schema) > 8 else "")
        where = "deferred" if self.deferred else f"partitions={self.partitions}"
        return f"GPUResult(name={self.name!r}, id={self.id[:12]}, state={self._state}, backend={self.backend}, {where}, schema={{{cols}}})"

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GPUResult) and other.id == self.id

    def __reduce__(self) -> Any:
        refuse_host_persistence(self)

    def __copy__(self) -> GPUResult:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> GPUResult:
        return self


def fused_steps(claimed: Sequence[GPUResult]) -> tuple[FusedStep, ...]:
    """The deferred steps that claimed deferred inputs bring into a query, upstream first."""
    return tuple(step for result in claimed if result.deferred for step in result.fused)


def claimed_by(results: Sequence[GPUResult], run: RunIdentity) -> list[GPUResult]:
    """The ``results`` that ``run`` claimed (:meth:`GPUResult.claimed_in`)."""
    return [r for r in results if r.claimed_in(run)]


# Results inside lists and dicts: Prefect hashes inputs as JSON first, and pydantic
# serializes objects that carry a __pydantic_serializer__ with it; the same JSON form
# refuses every other caller (see persistence.py).
GPUResult.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(serialization=core_schema.plain_serializer_function_ser_schema(cache_key_form)))

# What Prefect's cache keys hash for a result: its id, never its data.
STABLE_TRANSFORMS[GPUResult] = lambda result: {"gpu_result_id": result.id}
