"""
The one engine-call protocol: every task that calls the engine runs its call through :class:`EngineCall`.

``gpu_task``, ``execute``, ``collect``, ``tee``, ``read_parquet`` and
``sink_parquet`` each open one ``EngineCall`` on their arguments and build
their query inside it. The protocol, in order:

1. **Walk the arguments once** (Prefect's ``visit_collection``, through
   :func:`~prefect_cudf_polars.blocks.arguments.replace_results`). Each
   :class:`~prefect_cudf_polars.blocks.GPUResult` met is refused if it was
   released (before the session is looked up, so a result read after its flow
   run ended is reported as released), or if another session produced it, or
   another run consumed it.
2. **Recompute on retry.** Prefect retries a task run by calling its function
   again with the same arguments; an input that *this* task run consumed in an
   earlier attempt is produced again from its lineage
   (:mod:`~prefect_cudf_polars.blocks.lineage`) on the same session and
   swapped in, or the attempt fails at once with
   :class:`~prefect_cudf_polars.blocks.errors.CannotRecomputeError`, which
   :func:`retry_unless_cannot_recompute` keeps Prefect from retrying.
3. **Run.** The task builds its query from :attr:`EngineCall.args` (claiming
   the results it reads) and runs it once: :meth:`EngineCall.execute`
   (``defer=True`` keeps the plan instead), or :meth:`EngineCall.collect`.
4. **Free what is left**, when the ``with`` block ends, whatever happened:
   what claimed inputs still hold (a failed read, a query that never ran), and
   recomputed inputs the query did not read. Inputs a returned deferred
   result holds stay: its reader frees them. The engine call frees what its
   own read left in the same hand-off, so after a successful call there is
   nothing left here to free.

A replay (:func:`replay`) is the same protocol run on a result's lineage, with
every result argument replayed from its own lineage first, so a replay never
reads a result another task may still read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from prefect_cudf_polars.blocks import EngineSession, GPUResult, get_engine_session
from prefect_cudf_polars.blocks.errors import MAKE_RECOMPUTABLE, CannotRecomputeError, wrong_type
from prefect_cudf_polars.blocks.lineage import Lineage
from prefect_cudf_polars.blocks.arguments import replace_results
from prefect_cudf_polars.blocks.runs import current_run


class EngineCall:
    """
    One task run's use of the engine (see the module notes); use it as a context manager.

    Parameters
    ----------
    args : Any
        The task's arguments (any value or container holding results).
    session : EngineSession, optional
        The session to run on (default: :func:`get_engine_session`, looked up
        after the released inputs are refused).
    replay_all : bool
        Replay every result argument from its lineage (a replay's own call).

    Attributes
    ----------
    args : Any
        The arguments, with recomputed inputs swapped in.
    session : EngineSession
    result : GPUResult or None
        What :meth:`execute` returned.

    Raises
    ------
    ResultReleasedError, ResultConsumedError, WrongEngineError
        An input cannot be read in this session (nothing is claimed).
    CannotRecomputeError
        On a retry, an input the failed attempt read cannot be recomputed.
    NoEngineSessionError, SessionError
        From :func:`get_engine_session`.
    """

    def __init__(self, args: Any, *, session: EngineSession | None = None, replay_all: bool = False) -> None:
        self.result: GPUResult | None = None
        self._inputs: list[GPUResult] = []  # live when met: the only ones this call may claim, and free
        self._fresh: list[GPUResult] = []
        self._session = session
        self._run = run = current_run()
        retrying = run.task_run_id is not None  # only task runs retry

        def visit(result: GPUResult) -> GPUResult:
            if result.state == "released":
                result.check_readable()  # raises, naming why it was released
            if replay_all or (retrying and result.claimed_in(run)):
                self._fresh.append(replay(self.session, result, retry=not replay_all))
                return self._fresh[-1]
            result.check_readable(self.session)
            self._inputs.append(result)
            return result

        try:
            no_args = type(args) is tuple and all(type(a) in (tuple, dict) and not a for a in args)
            self.args = args if no_args else replace_results(args, visit)  # a task without arguments: no walk
            self.session  # noqa: B018  (a call with no result argument looks its session up here)
        except BaseException:
            self.finish()
            raise

    @property
    def session(self) -> EngineSession:
        """The session the call runs on (looked up on first use)."""
        if self._session is None:
            self._session = get_engine_session()
        return self._session

    def __enter__(self) -> EngineCall:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and self.result is not None and self.result.state == "live":
            self.result.release()  # made, but never returned (a timeout between the engine call and the return)
        self.finish()

    def execute(self, lf: Any, *, name: str, lineage: Lineage | None = None, defer: bool = False, step: Any = None,
                environment: Mapping[str, str | None] | None = None) -> GPUResult:
        """
        Run ``lf`` (a ``polars.LazyFrame``) once on the session, or keep it deferred; the result stays on the engine.

        ``lineage``, ``step`` and ``environment`` (set around the engine call
        and its planning alone) as for :meth:`EngineSession.execute <prefect_cudf_polars.blocks.EngineSession.execute>`
        and ``defer``.

        Raises
        ------
        TypeError
            ``lf`` is not a LazyFrame (what the task's function returned).
        NotImplementedError, ResultConsumedError, DeviceMemoryError, SessionError
            As :meth:`EngineSession.execute <prefect_cudf_polars.blocks.EngineSession.execute>`.
        polars.exceptions.PolarsError
            With ``defer``, the schema cannot be resolved.
        """
        options = {"step": step} if defer else {"environment": environment}
        self.result = self._on_session(self.session.defer if defer else self.session.execute, lf, name, name=name,
                                       lineage=lineage, **options)
        return self.result

    async def execute_async(self, lf: Any, *, name: str, lineage: Lineage | None = None, defer: bool = False) -> GPUResult:
        """:meth:`execute` for a coroutine: the engine call's future is awaited on the event loop; the same errors."""
        if defer:  # nothing runs on the engine
            return self.execute(lf, name=name, lineage=lineage, defer=True)
        self.result = await self._on_session(self.session.execute_async, lf, name, name=name, lineage=lineage)
        return self.result

    def collect(self, lf: Any, *, name: str = "collect", environment: Mapping[str, str | None] | None = None) -> pl.DataFrame:
        """Run ``lf`` once on the session and return a host ``polars.DataFrame`` (errors as :meth:`execute`)."""
        return self._on_session(self.session.collect, lf, name, environment=environment)

    async def collect_async(self, lf: Any, *, name: str = "collect") -> pl.DataFrame:
        """:meth:`collect` for a coroutine (the engine call awaited on the event loop); the same errors."""
        return await self._on_session(self.session.collect_async, lf, name)

    def _on_session(self, engine_call: Callable[..., Any], lf: Any, label: str, **options: Any) -> Any:
        """``engine_call`` (the session's) on ``lf`` with this call's inputs; ``TypeError`` naming ``gpu_task
        <label>`` when ``lf`` is not a LazyFrame."""
        lf = query_of(lf, task=f"gpu_task {label!r}", results=False)
        return engine_call(lf, inputs=[*self._inputs, *self._fresh], **options)

    def finish(self) -> None:
        """Free what this call's claims left, and recomputed inputs never read (idempotent); a deferred result's held inputs stay."""
        held = self.result.held_inputs if self.result is not None else ()
        for result in [r for r in (*self._inputs, *self._fresh) if r not in held]:
            if result.claimed_in(self._run):
                result.free()
            elif result.state == "live" and result in self._fresh:
                result.release()  # recomputed, never read
        self._inputs, self._fresh = [], []


def query_of(value: Any, *, task: str, results: bool = True) -> pl.LazyFrame:
    """
    The LazyFrame a task's query stands for: a LazyFrame, or (with ``results``) a GPUResult's frame, claiming it.

    Raises
    ------
    TypeError
        ``value`` is neither (for example an eager ``polars.DataFrame``); the
        message names ``task`` and what it takes.
    """
    if results and isinstance(value, GPUResult):
        return value.lazy()
    if isinstance(value, pl.LazyFrame):
        return value
    lazy = "call .lazy() on the DataFrame" if isinstance(value, pl.DataFrame) else ""
    if results:
        raise TypeError(wrong_type(task, "a polars LazyFrame or a GPUResult", value, lazy))
    raise TypeError(f"{task} must return a polars LazyFrame (the query to run on the GPU), but returned "
                    f"{type(value).__name__}: build the query with .lazy() on the inputs and return it uncollected.")


def replay(session: EngineSession, result: GPUResult, *, retry: bool = False) -> GPUResult:
    """
    A fresh, live result produced again from ``result``'s lineage on ``session``.

    The lineage's step runs again through the protocol, every result argument
    replayed from its own lineage first; a deferred step is deferred again and
    keeps naming the task run that deferred it. The scans are read again: if
    the files changed since, the fresh result reflects them as they are now.

    Parameters
    ----------
    retry : bool
        For a retried task run's input: the error then says that attempt read it.

    Raises
    ------
    CannotRecomputeError
        The lineage cannot be replayed (the message says which step stops it).
    TypeError
        The step no longer returns a LazyFrame.
    Exception
        Whatever the engine raises running the plan (a scanned file that is gone).
    """
    lineage, reason = result.lineage, result.replay_problem  # in this order: the session's end may drop the lineage
    if reason is not None or lineage is None:
        what = (f"GPUResult {result.name!r} (id {result.id}) was consumed by an earlier attempt of "
                f"{result.consumed_by}, and this retry cannot recompute it" if retry else f"Cannot recompute {result.name!r}")
        message = f"{what}: {reason}.{' Not retrying again.' if retry else ''} To avoid it, {MAKE_RECOMPUTABLE}."
        raise CannotRecomputeError(message, result_id=result.id, result_name=result.name, consumer=result.consumed_by,
                                   reason=reason)
    with EngineCall((lineage.args, lineage.kwargs), session=session, replay_all=True) as call:
        args, kwargs = call.args
        return call.execute(lineage.build(*args, **kwargs), name=result.name, lineage=lineage, defer=lineage.deferred,
                            step=result.deferred_step, environment=lineage.environment)


def retry_unless_cannot_recompute(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` of every GPU task: retry, unless the attempt failed with :class:`CannotRecomputeError`."""
    return not isinstance(getattr(state, "data", None), CannotRecomputeError)


def combined_retry_condition(user_condition: Any) -> Any:
    """:func:`retry_unless_cannot_recompute`, then the user's own ``retry_condition_fn`` (sync or async), if any."""
    if user_condition is None:
        return retry_unless_cannot_recompute

    def condition(task: Any, task_run: Any, state: Any) -> Any:
        return retry_unless_cannot_recompute(task, task_run, state) and user_condition(task, task_run, state)

    return condition
