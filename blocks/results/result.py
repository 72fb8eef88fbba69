"""
``GPUResult``: the handle a GPU task returns.

A ``GPUResult`` wraps a backend's persisted result (cudf-polars'
``PersistedQueryResult`` behind its adapter, or the ``cpu`` backend's host
counterpart) and adds the rules cudf-polars states but does not guard:

* **States.** ``"live"`` until the first :meth:`GPUResult.lazy` claims it,
  then ``"consumed"``; ``"released"`` after :meth:`GPUResult.release`, the end
  of its ``with`` block, or the end of its session.
* **One claim.** The first ``.lazy()`` names its consumer (the task run, or the
  flow run when called in a flow body); a second claim raises
  :class:`~prefect_cudf_polars.blocks.errors.ResultConsumedError` with that name.
* **One session.** A claim from another active session raises
  :class:`~prefect_cudf_polars.blocks.errors.WrongEngineError` before cudf-polars
  is called.
* **One process, never persisted.** Pickling and every result serializer
  (pickle, cloudpickle, json, ``compressed/...``) raise
  :class:`~prefect_cudf_polars.blocks.errors.HostPersistenceError`: the
  partitions live in GPU memory of this process, and cudf-polars' result
  pickles silently (its finalizer is simply lost), so nothing else would stop
  Prefect (:mod:`~prefect_cudf_polars.blocks.results.persistence`).
* **Lineage.** Each result remembers the plan that produced it
  (:mod:`~prefect_cudf_polars.blocks.results.lineage`), so a retried task or a
  ``tee`` can produce it again after it was read.
* **No engine memory after use.** Once released, or consumed and released, a
  result lets go of the backend's persisted result, so a handle that Prefect's
  futures or states keep after consumption holds no engine memory.
* **Deferred results.** A deferred step (``gpu_task(defer=True)``,
  ``execute(lf, defer=True)``) runs nothing: its result holds the step's plan
  (the LazyFrame) instead of partitions, and the inputs that plan reads
  (:attr:`GPUResult.held_inputs`). Its reader claims it as any result and gets
  the plan, so the reader's one engine call runs the fused query; after that
  call the reader frees what the deferred result held. Released unread, a
  deferred result has run nothing and frees what it held.
* **Stable hash.** Prefect cache keys see the result id, through
  ``prefect.cache_policies.STABLE_TRANSFORMS`` (top-level arguments) and a
  pydantic serializer whose JSON form is the id only while Prefect computes a
  cache key (results inside lists or dicts), never by pickling. Two results
  never share an id.

The session and its results talk through two small interfaces:
:class:`ResultOwner` (what a result asks of the session that produced it) and
the result's :meth:`~GPUResult.release` / :meth:`~GPUResult.mark_released`
(what a session asks of its results when it ends).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

import polars as pl
from pydantic_core import SchemaSerializer, core_schema

from prefect_cudf_polars.blocks.active import active_session_or_none
from prefect_cudf_polars.blocks.errors import (
    ResultConsumedError,
    ResultReleasedError,
    WrongEngineError,
)
from prefect_cudf_polars.blocks.results.persistence import cache_key_form, refuse_host_persistence
from prefect_cudf_polars.blocks.results.run_identity import RunIdentity, current_run

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.backends.base import PersistedResult
    from prefect_cudf_polars.blocks.results.lineage import Lineage

State = Literal["live", "consumed", "released"]


class FusedStep(NamedTuple):
    """
    A deferred step whose plan ran inside another task run's engine call.

    Attributes
    ----------
    name : str
        The deferred result's name (the step's task name).
    produced_by : str
        The task run (or flow run) that deferred it, as a readable name.
    task_run_id : str or None
        That task run's id (``None`` when deferred outside a task run).
    """

    name: str
    produced_by: str
    task_run_id: str | None


class HeldPlan(NamedTuple):
    """
    What a deferred result hands to a ``tee`` copy (:meth:`GPUResult.hand_over`).

    Attributes
    ----------
    plan : polars.LazyFrame
        The deferred plan.
    schema : polars.Schema
        Its output schema.
    held_inputs : tuple of GPUResult
        The inputs the plan reads, freed after its reader's engine call.
    steps : tuple of FusedStep
        The deferred steps the plan holds (the result's own last).
    """

    plan: pl.LazyFrame
    schema: pl.Schema
    held_inputs: tuple[GPUResult, ...]
    steps: tuple[FusedStep, ...]


class ResultOwner(Protocol):
    """
    What a :class:`GPUResult` asks of the engine session that produced it.

    :class:`~prefect_cudf_polars.blocks.EngineSession` implements it.

    Attributes
    ----------
    id : str
        The session's id.
    backend : str or None
        The session's resolved backend.
    closed : bool
        Whether the session has ended.
    """

    id: str
    backend: str | None

    @property
    def closed(self) -> bool: ...

    @property
    def served_run(self) -> str | None:
        """``"flow run 'name'"`` or ``"subflow run 'name'"``, once known."""
        ...

    @property
    def subflow(self) -> bool:
        """Whether the run it serves is a subflow run."""
        ...

    def result_claimed(self, result: GPUResult) -> None:
        """``result`` was claimed by its reader: it is no longer live."""
        ...

    def result_released(self, result: GPUResult) -> None:
        """``result`` was released before anyone read it."""
        ...

    def release_on_engine(self, release: Callable[[], None]) -> None:
        """Run ``release`` on the engine's owner thread while the engine runs, else in place."""
        ...


class EndedSession:
    """
    What a result keeps of its session once that session has ended (a :class:`ResultOwner`).

    The session's end points each of its results here instead of at the
    session, so a result that Prefect's states or futures keep holds neither
    the session nor its engine.

    Parameters
    ----------
    id : str
        The ended session's id.
    backend : str or None
        Its backend.
    served_run : str or None
        The run it served (``"subflow run 'name'"``).
    subflow : bool
        Whether that run was a subflow run.
    """

    __slots__ = ("backend", "id", "served_run", "subflow")

    closed = True

    def __init__(self, id: str, backend: str | None, served_run: str | None, *, subflow: bool = False) -> None:
        self.id = id
        self.backend = backend
        self.served_run = served_run
        self.subflow = subflow

    def result_claimed(self, result: GPUResult) -> None:
        """Nothing to record: the session has ended."""

    def result_released(self, result: GPUResult) -> None:
        """Nothing to record: the session has ended."""

    def release_on_engine(self, release: Callable[[], None]) -> None:
        """Run ``release`` here: the engine's store is gone."""
        release()


class GPUResult:
    """
    A query result kept where the engine produced it (GPU memory, or host memory on ``cpu``).

    Returned by the :func:`~prefect_cudf_polars.tasks.execute` task and by
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
    engine_seconds : float
        Seconds the engine call that produced it took (wall clock); 0 for a deferred result.
    produced_by : str
        The task run or flow run that produced it (for a handle made by a replay
        or by ``tee``, the run that made that handle).
    produced_by_task_run_id : str or None
        That task run's id (``None`` outside a task run).
    consumed_by : str or None
        The task run or flow run whose claim consumed it.
    consumed_by_id : str or None
        That run's id (a retried task run keeps its id across attempts).
    lineage : Lineage or None
        The plan that produced it (see :mod:`~prefect_cudf_polars.blocks.results.lineage`).
    deferred : bool
        Whether it holds a plan that runs fused into its reader's engine call.
    fused : tuple of FusedStep
        The deferred steps whose plans ran inside the engine call that produced
        this result, upstream first; for a deferred result, the deferred steps
        its plan holds, its own last (what its reader's engine call will run).
    """

    __slots__ = (
        "__weakref__",
        "_held",
        "_lock",
        "_owner",
        "_persisted",
        "_plan",
        "_state",
        "backend",
        "consumed_by",
        "consumed_by_id",
        "deferred",
        "engine_seconds",
        "fused",
        "id",
        "lineage",
        "name",
        "produced_by",
        "produced_by_task_run_id",
        "ranks",
        "schema",
        "session_id",
    )

    def __init__(
        self,
        persisted: PersistedResult | None,
        *,
        owner: ResultOwner,
        name: str,
        engine_seconds: float,
        lineage: Lineage | None = None,
        run: RunIdentity | None = None,
        fused: Sequence[FusedStep] = (),
        plan: pl.LazyFrame | None = None,
        schema: pl.Schema | None = None,
        held_inputs: Sequence[GPUResult] = (),
    ) -> None:
        run = run if run is not None else current_run()
        self.id = uuid.uuid4().hex
        self.name = name
        self.backend = owner.backend or "unknown"
        self.session_id = owner.id
        self.deferred = persisted is None
        if persisted is None:
            if plan is None or schema is None:
                raise TypeError("a deferred GPUResult needs its plan and its schema")
            self.schema = schema
            self.ranks: list[int] = []
        else:
            self.schema = persisted.schema
            self.ranks = list(persisted.ranks)
        self.engine_seconds = engine_seconds
        self.produced_by = run.name
        self.produced_by_task_run_id = None if run.task_run_id is None else str(run.task_run_id)
        self.consumed_by: str | None = None
        self.consumed_by_id: str | None = None
        self.lineage = lineage
        self.fused = tuple(fused)
        self._persisted: PersistedResult | None = persisted
        self._plan = plan
        self._held: tuple[GPUResult, ...] = tuple(held_inputs)
        self._owner = owner
        self._state: State = "live"
        self._lock = threading.Lock()

    @property
    def state(self) -> State:
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
            return "it has no recorded lineage"
        return self.lineage.unreplayable_reason()

    @property
    def persisted(self) -> PersistedResult | None:
        """
        The backend's persisted result while this handle holds it.

        ``None`` once the result was released, or consumed and its read is
        over: the handle then keeps no engine memory alive. Always ``None``
        for a deferred result.
        """
        return self._persisted

    @property
    def held_inputs(self) -> tuple[GPUResult, ...]:
        """
        The inputs a deferred result's plan reads (claimed by its step), until they are freed.

        Freed after its reader's engine call (success or failure), or when the
        deferred result is released unread. Empty for a materialized result.
        """
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
    def check_readable(self) -> None:
        """
        Raise if this result cannot be read now; claim nothing.

        Raises
        ------
        ResultReleasedError
            If it was released (explicitly, or by the end of its session).
        ResultConsumedError
            If it was already claimed.
        WrongEngineError
            If another engine session is active here than the one that produced it.
        """
        self._check_readable(None)

    def _check_readable(self, run: RunIdentity | None) -> None:
        if self._state == "released":
            raise ResultReleasedError(
                f"GPUResult {self.name!r} (id {self.id}) was released{self._released_because()}; "
                "its data is gone. Run the task that produced it again, inside "
                "a flow run with an open engine session.",
                result_id=self.id,
                result_name=self.name,
            )
        if self._state == "consumed":
            here = (run if run is not None else current_run()).run_id
            read_here = self.consumed_by_id is not None and self.consumed_by_id == here
            advice = (
                # A second read in the run that read it: a self-join, or .lazy() twice.
                f"already read in this same {self.consumed_by}: a GPU result is read once "
                "(cudf-polars moves its partitions out on read), so its .lazy() may be "
                "called once and that frame scanned once (no self-join of a result with "
                "itself). To use it twice, split it before this step: `a, b = tee(result, 2)` "
                "(prefect_cudf_polars.tasks.tee) and use both copies."
                if read_here
                else f"already consumed by {self.consumed_by}: a GPU result is read once "
                "(cudf-polars moves its partitions out on read). To give one result to "
                "several tasks, split it before the first read: `a, b = tee(result, 2)` "
                "(prefect_cudf_polars.tasks.tee) makes independent results that stay on "
                "the GPU; or run the producing task again, or collect it once and reuse "
                "the host DataFrame."
            )
            raise ResultConsumedError(
                f"GPUResult {self.name!r} (id {self.id}) was {advice}",
                result_id=self.id,
                result_name=self.name,
                consumer=self.consumed_by,
            )
        active = active_session_or_none()
        if active is not None and active is not self._owner:
            raise WrongEngineError(
                f"GPUResult {self.name!r} (id {self.id}) belongs to engine session "
                f"{self.session_id} ({self._where(self._owner)}), but {active.served_run or 'the code here'} "
                f"has its own engine session {active.id} ({active.backend}): only the engine "
                "that produced a result can read it. "
                + (
                    "Pass the subflow a host DataFrame (collect the result before the "
                    "subflow), or give the subflow no task runner so it shares the "
                    "parent's session."
                    if (active.served_run or "").startswith("subflow")
                    else "Produce the result in this flow run, or collect it in its own "
                    "flow run and pass the host DataFrame."
                ),
                result_id=self.id,
                result_name=self.name,
                producer_session=self.session_id,
                current_session=active.id,
            )

    def _where(self, owner: ResultOwner) -> str:
        run = owner.served_run
        return f"{self.backend}, {run}" if run else self.backend

    def _released_because(self) -> str:
        owner = self._owner
        if not owner.closed:
            return ""
        if owner.subflow:
            return (
                f" when its engine session ended: the session of {owner.served_run}, which "
                "ended with that subflow run (a subflow with its own task runner has its own "
                "session, and its GPU results never outlive it). Collect the result inside "
                "the subflow and return the host DataFrame, or give the subflow no task "
                "runner so it shares the parent's session"
            )
        return (
            " when its engine session ended (its flow run is over: a GPU "
            "result never outlives its flow run, so do not return it from a "
            "flow or keep it for later — collect it inside the flow run and "
            "return the host DataFrame)"
        )

    def lazy(self) -> pl.LazyFrame:
        """
        Claim the result and return a LazyFrame that reads it.

        The frame must be run by the producing session (the ``execute`` and
        ``collect`` tasks and ``gpu_task`` tasks do this) and read once: running
        it moves the partitions out of the engine's store. For a deferred
        result it is the deferred step's plan itself, so the reader's engine
        call runs both steps as one query.

        Returns
        -------
        polars.LazyFrame
            Scans the result's partitions (or, deferred, computes them); chain
            further query steps onto it.

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            See :meth:`check_readable`.
        """
        handed = self._claim(hand_over=False)
        if isinstance(handed, HeldPlan):
            return handed.plan
        return handed.lazy()

    def hand_over(self) -> PersistedResult | HeldPlan:
        """
        Claim the result without reading it and give up what it holds.

        For ``tee``, whose first copy wraps the same partitions (or, deferred,
        the same plan and held inputs) in a new handle
        (:meth:`~prefect_cudf_polars.blocks.EngineSession.adopt`). This handle
        becomes ``"consumed"`` (by the current run) and holds nothing.

        Returns
        -------
        PersistedResult or HeldPlan

        Raises
        ------
        ResultReleasedError, ResultConsumedError, WrongEngineError
            See :meth:`check_readable`.
        """
        return self._claim(hand_over=True)

    def _claim(self, *, hand_over: bool) -> PersistedResult | HeldPlan:
        # Check, mark consumed by the current run, tell the session; return what it holds.
        run = current_run()
        with self._lock:
            self._check_readable(run)
            self._state = "consumed"
            self.consumed_by = run.name
            self.consumed_by_id = run.run_id
            handed: PersistedResult | HeldPlan | None
            if self.deferred:
                assert self._plan is not None  # a live deferred result holds its plan
                handed = HeldPlan(self._plan, self.schema, self._held, self.fused)
                self._plan = None  # its reader holds the plan now
                if hand_over:
                    self._held = ()
            else:
                handed = self._persisted
                if hand_over:
                    self._persisted = None
        self._owner.result_claimed(self)
        assert handed is not None  # a live result holds its persisted result
        return handed

    # ---- releasing ----------------------------------------------------------
    def release(self) -> None:
        """
        Free the result's memory now (idempotent; never raises).

        A live result becomes ``"released"``. A consumed one keeps its state, and
        any partition its read left behind (a failed query, an unread scan) is
        freed; the handle then holds no engine memory. A deferred result frees
        the inputs it held (and they, recursively, theirs).
        """
        self.mark_released()  # counted first: a free the engine never answers still counts
        with self._lock:
            persisted, self._persisted = self._persisted, None
            held, self._held = self._held, ()
            self._plan = None
        if persisted is not None:
            # cudf-polars' release is idempotent and never raises.
            self._owner.release_on_engine(persisted.release)
        for result in held:
            result.release()

    def mark_released(self) -> None:
        """
        Mark a live result released without calling the engine (idempotent).

        For a session's end whose engine no longer answers: the persisted result
        is kept, so cudf-polars' finalizer does not run on this thread, and the
        session's queued teardown still frees it on the engine's thread if the
        engine answers. Other states stay as they are.
        """
        with self._lock:
            was_live = self._state == "live"
            if was_live:
                self._state = "released"
        if was_live:
            self._owner.result_released(self)

    def session_ended(self, tombstone: ResultOwner, *, drop: bool) -> None:
        """
        Point this result at ``tombstone`` instead of its ended session (the session's end calls it).

        Parameters
        ----------
        tombstone : ResultOwner
            What is left of the session (:class:`EndedSession`).
        drop : bool
            Also let go of the persisted result (and a deferred result's plan
            and held inputs). False when the engine stopped answering: the
            session's queued teardown frees it on the engine's thread if the
            engine answers.
        """
        with self._lock:
            self._owner = tombstone
            if self._state == "live":
                self._state = "released"
            if drop:
                self._persisted = None
                self._plan = None
                self._held = ()

    def __enter__(self) -> GPUResult:
        """Return the result; :meth:`release` runs on exit."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ---- identity, repr, refusals ---------------------------------------------
    def __repr__(self) -> str:
        cols = ", ".join(f"{k}: {v}" for k, v in list(self.schema.items())[:8])
        more = ", ..." if len(self.schema) > 8 else ""
        where = "deferred" if self.deferred else f"partitions={self.partitions}"
        return (
            f"GPUResult(name={self.name!r}, id={self.id[:12]}, state={self._state}, "
            f"backend={self.backend}, {where}, "
            f"schema={{{cols}{more}}})"
        )

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


def stable_transform(result: GPUResult) -> dict[str, str]:
    """What Prefect's cache keys hash for a result: its id, never its data."""
    return {"gpu_result_id": result.id}


# Results inside lists and dicts: Prefect hashes inputs as JSON first, and pydantic
# serializes objects that carry a __pydantic_serializer__ with it; the same JSON form
# refuses every other caller (see persistence.py).
GPUResult.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(
        serialization=core_schema.plain_serializer_function_ser_schema(cache_key_form)
    )
)


def register_stable_transform() -> None:
    """Register :func:`stable_transform` in ``prefect.cache_policies.STABLE_TRANSFORMS``."""
    from prefect.cache_policies import STABLE_TRANSFORMS

    STABLE_TRANSFORMS[GPUResult] = stable_transform


register_stable_transform()
