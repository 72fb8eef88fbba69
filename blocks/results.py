"""
``GPUResult``: the handle a GPU task returns, a small state machine over what the engine holds.

A ``GPUResult`` wraps a backend's persisted result (cudf-polars'
``PersistedQueryResult`` behind its adapter, or the ``cpu`` backend's host
counterpart), or, for a deferred step, the step's plan. It adds the rules
cudf-polars states but does not guard:

* **States.** ``"live"`` until the first :meth:`GPUResult.lazy` claims it,
  then ``"consumed"``; ``"released"`` after :meth:`GPUResult.release`, the end
  of its ``with`` block, or the end of its session.
* **One claim.** The first ``.lazy()`` names its consumer (the task run, or the
  flow run when called in a flow body) and tells the session, which counts it
  (this is where a claim is recorded: :meth:`GPUResult._claim`); a second
  claim raises :class:`~prefect_cudf_polars.blocks.errors.ResultConsumedError`.
* **One session.** A task's engine call checks its inputs against its session
  first (:meth:`GPUResult.check_readable`); a claim asks the result's own
  session, through :class:`ResultOwner`, which session would read it here. A
  result never looks up the active session itself.
* **One process, never persisted.** Pickling and every result serializer
  raise :class:`~prefect_cudf_polars.blocks.errors.HostPersistenceError`
  (:mod:`~prefect_cudf_polars.blocks.persistence`); Prefect's cache keys see
  the result's id only.
* **Lineage.** Each result remembers the plan that produced it
  (:mod:`~prefect_cudf_polars.blocks.lineage`), so a retried task or a ``tee``
  can produce it again after it was read.
* **Deferred results** hold their step's plan and the inputs it reads
  (:attr:`GPUResult.held_inputs`); the reader's claim gets the plan, so its one
  engine call runs both steps, and the reader frees what the plan held.
* **Nothing of the engine after use.** Once released, or consumed and its read
  over, a handle holds no partition; once its session has ended it points at
  an :class:`EndedSession` and holds nothing of the engine at all, so the
  handles Prefect's states keep cannot keep an engine alive.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import polars as pl
from prefect.utilities.collections import visit_collection
from pydantic_core import SchemaSerializer, core_schema

from prefect_cudf_polars.blocks.backends.plans import cache_id
from prefect_cudf_polars.blocks.deferred import FusedStep, HeldPlan
from prefect_cudf_polars.blocks.errors import ResultConsumedError, ResultReleasedError, WrongEngineError
from prefect_cudf_polars.blocks.persistence import cache_key_form, refuse_host_persistence

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult

ResultState = Literal["live", "consumed", "released"]


class RunIdentity(NamedTuple):
    """
    The run some code runs in, read from Prefect's context once.

    Attributes
    ----------
    name : str
        ``"task run 'trips' (id ...)"``, ``"flow run 'brave-fox' (id ...)"``, or
        ``"code outside any Prefect run"``.
    run_id : str or None
        The task run's id (a retried task run keeps it), else the flow run's.
    task_run_id : uuid.UUID or None
        The task run's id, ``None`` outside a task run.
    attempt : int
        The task run's attempt (Prefect's ``run_count``: 1, then 2 on its first retry); 0 outside a task run.
    """

    name: str
    run_id: str | None
    task_run_id: Any
    attempt: int = 0


def current_run() -> RunIdentity:
    """The current task run or, in a flow body, flow run (Prefect's run context; not the engine session)."""
    from prefect.context import FlowRunContext, TaskRunContext

    task_ctx = TaskRunContext.get()
    if task_ctx is not None and task_ctx.task_run is not None:
        run = task_ctx.task_run
        return RunIdentity(f"task run {run.name!r} (id {run.id})", str(run.id), run.id, run.run_count)
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        run = flow_ctx.flow_run
        return RunIdentity(f"flow run {run.name!r} (id {run.id})", str(run.id), None)
    return RunIdentity("code outside any Prefect run", None, None)


class Replayable(Protocol):
    """What a result asks of its lineage (:class:`prefect_cudf_polars.blocks.lineage.Lineage` provides it)."""

    deferred: bool

    def unreplayable_reason(self) -> str | None:
        """Why the lineage cannot be run again, or ``None`` when it can."""
        ...


class ResultOwner(Protocol):
    """What a :class:`GPUResult` asks of the session that produced it (:class:`~prefect_cudf_polars.blocks.EngineSession`)."""

    id: str
    backend: str | None

    @property
    def closed(self) -> bool:
        """Whether the session has ended."""
        ...

    @property
    def served_run(self) -> str | None:
        """``"flow run 'name'"`` or ``"subflow run 'name'"``, once known."""
        ...

    @property
    def subflow(self) -> bool:
        """Whether the run it serves is a subflow run."""
        ...

    def reader_here(self) -> ResultOwner | None:
        """The session that would read a result here (the one active in this context), if any."""
        ...

    def claimed(self, result: GPUResult) -> None:
        """``result`` was claimed by its reader."""
        ...

    def released(self, result: GPUResult) -> None:
        """``result`` was released before anyone read it."""
        ...

    def free(self, persisted: PersistedResult) -> None:
        """Free ``persisted`` on the engine's owner thread while the engine runs, else let it go."""
        ...


class EndedSession:
    """What a result keeps of its session once that session has ended (a :class:`ResultOwner` holding no engine)."""

    __slots__ = ("backend", "id", "served_run", "subflow")

    closed = True

    def __init__(self, id: str, backend: str | None, served_run: str | None, subflow: bool) -> None:
        self.id, self.backend, self.served_run, self.subflow = id, backend, served_run, subflow

    def reader_here(self) -> None:
        """No reader: the session has ended (the result is released)."""

    def claimed(self, result: GPUResult) -> None:
        """Nothing to record: the session has ended."""

    def released(self, result: GPUResult) -> None:
        """Nothing to record: the session has ended."""

    def free(self, persisted: PersistedResult) -> None:
        """The engine's stores are closed: let go without calling it."""
        persisted.forget()


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
    engine_seconds : float
        Seconds the engine call that produced it took (wall clock); 0 for a deferred result.
    produced_by : str
        The task run or flow run that produced it.
    produced_by_task_run_id : str or None
        That task run's id (``None`` outside a task run).
    consumed_by : str or None
        The task run or flow run whose claim consumed it.
    consumed_by_id : str or None
        That run's id (a retried task run keeps its id across attempts).
    cache_id : str or None
        The id of the cache its frame is, once read (a logical plan shows ``CACHE[id: ...]``).
    lineage : Lineage or None
        The plan that produced it (dropped when its session ends).
    deferred : bool
        Whether it holds a plan that runs fused into its reader's engine call.
    fused : tuple of FusedStep
        The deferred steps whose plans ran inside the engine call that produced
        it, upstream first; for a deferred result, the steps its plan holds,
        its own last.
    """

    __slots__ = (
        "__weakref__", "_consumed_attempt", "_frame", "_held", "_lock", "_owner", "_persisted", "_plan", "_state",
        "backend", "bytes", "cache_id", "consumed_by", "consumed_by_id", "deferred", "engine_seconds", "fused", "id",
        "lineage", "name", "produced_by", "produced_by_task_run_id", "ranks", "rows", "schema", "session_id",
    )

    def __init__(self, payload: PersistedResult | HeldPlan, *, owner: ResultOwner, name: str, run: RunIdentity,
                 lineage: Replayable | None = None, engine_seconds: float = 0.0, rows: int | None = None,
                 bytes: int | None = None, fused: Sequence[FusedStep] = ()) -> None:
        self.id = uuid.uuid4().hex
        self.name, self.backend, self.session_id = name, owner.backend or "unknown", owner.id
        self.deferred = isinstance(payload, HeldPlan)
        self._persisted: PersistedResult | None = None if self.deferred else payload  # type: ignore[assignment]
        self._plan: pl.LazyFrame | None = payload.plan if self.deferred else None  # type: ignore[union-attr]
        self._held: tuple[GPUResult, ...] = payload.held_inputs if self.deferred else ()  # type: ignore[union-attr]
        self.schema, self.ranks = payload.schema, [] if self.deferred else list(payload.ranks)  # type: ignore[union-attr]
        self.rows, self.bytes, self.engine_seconds = rows, bytes, engine_seconds
        self.fused = payload.steps if self.deferred else tuple(fused)  # type: ignore[union-attr]
        self.produced_by = run.name
        self.produced_by_task_run_id = None if run.task_run_id is None else str(run.task_run_id)
        self.consumed_by: str | None = None
        self.consumed_by_id: str | None = None
        self._consumed_attempt = 0
        self._frame: pl.LazyFrame | None = None  # what lazy() gave the attempt that claimed it
        self.cache_id: str | None = None
        self.lineage = lineage
        self._owner = owner
        self._state: ResultState = "live"
        self._lock = threading.Lock()

    @property
    def state(self) -> ResultState:
        """``"live"``, ``"consumed"`` or ``"released"``."""
        return self._state

    @property
    def deferred_step(self) -> FusedStep | None:
        """For a deferred result, its own step (name and the task run that deferred it); ``None`` otherwise."""
        return self.fused[-1] if self.deferred and self.fused else None

    @property
    def replay_problem(self) -> str | None:
        """Why this result cannot be produced again from its lineage, or ``None`` when it can."""
        if self.lineage is None:
            return "it has no recorded lineage (its session has ended, or it was made without one)"
        return self.lineage.unreplayable_reason()

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

    # ---- reading -------------------------------------------------------------
    def check_readable(self, reader: ResultOwner | None = None, *, run: RunIdentity | None = None) -> None:
        """
        Raise if this result cannot be read now; claim nothing.

        Parameters
        ----------
        reader : EngineSession, optional
            The session of the task about to read it (the task's engine call checks).
        run : RunIdentity, optional
            The run that would read it (default: the one here).

        Raises
        ------
        ResultReleasedError
            If it was released (explicitly, or by the end of its session).
        ResultConsumedError
            If it was already claimed.
        WrongEngineError
            If ``reader`` is another session than the one that produced it.
        """
        self._check(run or current_run(), reader)

    def _check(self, run: RunIdentity, reader: ResultOwner | None) -> None:
        if self._state == "released":
            raise ResultReleasedError(
                f"GPUResult {self.name!r} (id {self.id}) was released{self._released_because()}; its data is gone. "
                "Run the task that produced it again, inside a flow run with an open engine session.",
                result_id=self.id, result_name=self.name,
            )
        if self._state == "consumed":
            if self.consumed_by_id is not None and self.consumed_by_id == run.run_id and run.attempt != self._consumed_attempt:
                advice = (  # a retry reading a result it was not given: gpu_task's retries recompute arguments first
                    f"already read by an earlier attempt of this {self.consumed_by}, which Prefect is retrying: "
                    "its partitions moved out when that attempt read it, and a retry recomputes only the results "
                    "given to a `gpu_task` (prefect_cudf_polars.tasks.gpu_task) as arguments, from their lineage; "
                    "a plain Prefect task cannot recompute a GPU result. Make the task a `gpu_task` and pass it "
                    "the result as an argument, or collect the result before this task and pass it the host "
                    "DataFrame."
                )
            elif self.consumed_by_id is not None and self.consumed_by_id == run.run_id:
                advice = (  # a read after a query of the run that claimed it ran
                    f"already read by a query that ran in this same {self.consumed_by}: a GPU result is read by "
                    "one query (cudf-polars moves its partitions out when it runs), which may read it several "
                    "times (a self-join runs). To read it in two queries, split it before this step: "
                    "`a, b = tee(result, 2)` (prefect_cudf_polars.tasks.tee) and use both copies."
                )
            else:
                advice = (
                    f"already consumed by {self.consumed_by}: a GPU result is read once (cudf-polars moves its "
                    "partitions out on read). To give one result to several tasks, split it before the first "
                    "read: `a, b = tee(result, 2)` (prefect_cudf_polars.tasks.tee) makes independent results that "
                    "stay on the GPU; or run the producing task again, or collect it once and reuse the host DataFrame."
                )
            raise ResultConsumedError(f"GPUResult {self.name!r} (id {self.id}) was {advice}", result_id=self.id,
                                      result_name=self.name, consumer=self.consumed_by)
        if reader is not None and reader.id != self.session_id:
            where = f"{self.backend}, {self._owner.served_run}" if self._owner.served_run else self.backend
            in_subflow = (reader.served_run or "").startswith("subflow")
            raise WrongEngineError(
                f"GPUResult {self.name!r} (id {self.id}) belongs to engine session {self.session_id} "
                f"({where}), but {reader.served_run or 'the code here'} has its own engine session "
                f"{reader.id} ({reader.backend}): only the engine that produced a result can read it. "
                + (
                    "Pass the subflow a host DataFrame (collect the result before the subflow), or "
                    "give the subflow no task runner so it shares the parent's session."
                    if in_subflow
                    else "Produce the result in this flow run, or collect it in its own flow run "
                    "and pass the host DataFrame."
                ),
                result_id=self.id, result_name=self.name, producer_session=self.session_id, current_session=reader.id,
            )

    def _released_because(self) -> str:
        owner = self._owner
        if not owner.closed:
            return ""
        if owner.subflow:
            return (
                f" when its engine session ended: the session of {owner.served_run}, which ended with that subflow "
                "run (a subflow with its own task runner has its own session, and its GPU results never outlive "
                "it). Collect the result inside the subflow and return the host DataFrame, or give the subflow "
                "no task runner so it shares the parent's session"
            )
        return (
            " when its engine session ended (its flow run is over: a GPU result never outlives its flow run, so "
            "do not return it from a flow or keep it for later; collect it inside the flow run and return the "
            "host DataFrame)"
        )

    def lazy(self) -> pl.LazyFrame:
        """
        Claim the result and return a LazyFrame that reads it.

        The frame must be run by the producing session (the ``execute`` and
        ``collect`` tasks and ``gpu_task`` tasks do this) in one query: running
        it moves the partitions out of the engine's store. That query may read
        it several times (a self-join, a ``concat`` of two filters): the frame
        is a ``cache()`` (polars 1.44 then keeps a filter above the scan rather
        than in it), and later calls in the same task run attempt return the
        same frame until a query has run it. For a deferred result it is the
        deferred step's plan itself, so the reader's engine call runs both
        steps as one query.

        Returns
        -------
        polars.LazyFrame

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            See :meth:`check_readable` (the reader is the session active here).
        """
        run = current_run()
        with self._lock:
            if self._frame is not None and self.holding and (self.consumed_by_id, self._consumed_attempt) == (
                    run.run_id, run.attempt):
                return self._frame  # another read in the query this attempt builds
        handed = self._claim(hand_over=False)  # a deferred plan stays as it is: its inputs' frames are caches
        self._frame = handed.plan if isinstance(handed, HeldPlan) else handed.lazy().cache()
        self.cache_id = None if isinstance(handed, HeldPlan) else cache_id(self._frame)
        return self._frame

    def hand_over(self) -> PersistedResult | HeldPlan:
        """Claim the result without reading it, and give up what it holds (``tee``'s first copy); raises as
        :meth:`check_readable` does (``ResultReleasedError``, ``ResultConsumedError``)."""
        return self._claim(hand_over=True)

    def _claim(self, *, hand_over: bool) -> PersistedResult | HeldPlan:
        run, reader = current_run(), self._owner.reader_here()
        with self._lock:
            self._check(run, reader)
            self._state, self.consumed_by, self.consumed_by_id = "consumed", run.name, run.run_id
            self._consumed_attempt = run.attempt
            if self.deferred:
                assert self._plan is not None  # a live deferred result holds its plan
                handed: Any = HeldPlan(self._plan, self.schema, self._held, self.fused)
                self._plan = None  # its reader holds the plan now
                if hand_over:
                    self._held = ()
            else:
                handed = self._persisted
                if hand_over:
                    self._persisted = None
        self._owner.claimed(self)
        return handed

    # ---- releasing ----------------------------------------------------------
    def release(self) -> None:
        """
        Free the result's memory (idempotent; never raises): queued on the engine's owner thread, not waited for.

        A live result becomes ``"released"``. A consumed one keeps its state,
        and what its read left behind (a failed query, an unread scan) is
        freed. A deferred result frees the inputs it held (and they, theirs).
        """
        with self._lock:
            was_live = self._state == "live"
            if was_live:
                self._state = "released"
            persisted, self._persisted = self._persisted, None
            held, self._held = self._held, ()
            self._plan = self._frame = None
        if was_live:
            self._owner.released(self)
        if persisted is not None:
            self._owner.free(persisted)
        for result in held:
            result.release()

    def move(self, mover: Callable[[PersistedResult], PersistedResult | None]) -> PersistedResult | None:
        """While live and holding partitions, hold ``mover(persisted)`` instead (unless ``None``) and return it."""
        with self._lock:
            if self._state != "live" or self._persisted is None:
                return None
            moved = mover(self._persisted)
            self._persisted = self._persisted if moved is None else moved
            return moved

    def end(self, tombstone: EndedSession, *, drop: bool) -> None:
        """
        The session's end: point at ``tombstone``, and with ``drop`` let go of everything.

        Parameters
        ----------
        tombstone : EndedSession
            What is left of the session.
        drop : bool
            Let go of the partitions (without calling the engine: its shutdown closed the stores), the
            plan, the held inputs and the lineage. False when the engine stopped answering: the session's
            queued teardown frees them on the engine's thread if it answers.
        """
        with self._lock:
            self._owner = tombstone
            if self._state == "live":
                self._state = "released"
            persisted = self._persisted
            if drop:
                self._persisted, self._plan, self._frame, self._held, self.lineage = None, None, None, (), None
        if drop and persisted is not None:
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


def results_in(obj: Any) -> list[GPUResult]:
    """
    Every :class:`GPUResult` in ``obj``, each once, in the order first met.

    The one rule for containers is Prefect's :func:`~prefect.utilities.collections.visit_collection`
    (lists, tuples, sets, dict keys and values, dataclasses, pydantic models;
    a ``polars.LazyFrame`` is a leaf).
    """
    found: dict[str, GPUResult] = {}

    def visit(value: Any) -> None:
        if isinstance(value, GPUResult):
            found.setdefault(value.id, value)

    visit_collection(obj, visit, return_data=False)
    return list(found.values())


def replace_results(obj: Any, fn: Callable[[GPUResult], Any]) -> Any:
    """
    ``obj`` with every :class:`GPUResult` replaced by ``fn(result)``: one walk, ``fn`` once per distinct result.

    Containers are rebuilt only where something inside them changed.

    Raises
    ------
    Exception
        Whatever ``fn`` raises.
    """
    replaced: dict[str, Any] = {}

    def visit(value: Any) -> Any:
        if not isinstance(value, GPUResult):
            return value
        if value.id not in replaced:
            replaced[value.id] = fn(value)
        return replaced[value.id]

    return visit_collection(obj, visit, return_data=True)


def fused_steps(claimed: Sequence[GPUResult]) -> tuple[FusedStep, ...]:
    """The deferred steps that claimed deferred inputs bring into a query, upstream first."""
    return tuple(step for result in claimed if result.deferred for step in result.fused)


def claimed_by(results: Sequence[GPUResult], run: RunIdentity) -> list[GPUResult]:
    """The ``results`` that ``run`` claimed (its reads, never another run's)."""
    return [r for r in results if r.state == "consumed" and r.consumed_by_id == run.run_id]


def free_claimed(claimed: Sequence[GPUResult]) -> None:
    """Free what ``claimed`` still hold: a read's leftovers, a deferred input's held inputs (a live one is released)."""
    for result in claimed:
        if result.holding:
            result.release()


def release_partitions(results: Sequence[GPUResult]) -> None:
    """Free the partitions ``results`` still hold, on the engine's thread; their handles keep their states."""
    for result in results:
        if result.persisted is not None:
            result.persisted.release()


def stable_transform(result: GPUResult) -> dict[str, str]:
    """What Prefect's cache keys hash for a result: its id, never its data."""
    return {"gpu_result_id": result.id}


# Results inside lists and dicts: Prefect hashes inputs as JSON first, and pydantic
# serializes objects that carry a __pydantic_serializer__ with it; the same JSON form
# refuses every other caller (see persistence.py).
GPUResult.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(serialization=core_schema.plain_serializer_function_ser_schema(cache_key_form))
)


def _register_stable_transform() -> None:
    from prefect.cache_policies import STABLE_TRANSFORMS

    STABLE_TRANSFORMS[GPUResult] = stable_transform


_register_stable_transform()
