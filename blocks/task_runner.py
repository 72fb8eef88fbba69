"""
``CudfPolarsTaskRunner``: a thread-pool task runner that provides one engine session per flow run.

Prefect calls :meth:`CudfPolarsTaskRunner.duplicate` for every flow run and
every attempt, and enters the copy *before* the flow run's context exists
(Prefect 3.9, ``FlowRunEngine.setup_run_context``), outside the code that turns
an exception into a Failed state. So ``__enter__`` starts nothing that can
fail: it only makes the runner the innermost session provider
(:mod:`~prefect_cudf_polars.blocks.active`). The engine opens at the first GPU
call inside the flow run (:meth:`CudfPolarsTaskRunner.provide_session`, under a
lock, once): an engine that cannot start raises inside the run, so Prefect
fails that task run and the flow run with our message, and every later GPU
call of the run gets the same error. ``__exit__`` runs on success, on
exceptions and on ``TerminationSignal`` (SIGTERM); after Prefect's thread pool
has waited for the task runs (on SIGTERM, before: the session's end is bounded
and the task runs still waiting for the engine then fail), it closes the session, so each attempt of a
retried flow run gets a fresh session. ``on_cancellation`` hooks run in
another process under a worker, so this runner does not rely on them.
"""

from __future__ import annotations

import threading
from typing import Any

from prefect.task_runners import ThreadPoolTaskRunner

from prefect_cudf_polars.blocks import active
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine, load_engine_block
from prefect_cudf_polars.blocks.errors import SessionError, wrong_type
from prefect_cudf_polars.blocks.session import EngineSession
from prefect_cudf_polars.blocks.telemetry import INTERRUPTED_LINE, NOT_STARTED_LINE, logger


class CudfPolarsTaskRunner(ThreadPoolTaskRunner):
    """
    Run a flow's tasks in threads next to one cudf-polars engine session.

    The session's engine starts at the first GPU task of the flow run (the
    first :func:`~prefect_cudf_polars.blocks.get_engine_session` inside it),
    so that task run carries the engine's start time; a flow run with no GPU
    task starts no engine.

    Parameters
    ----------
    engine : CudfPolarsEngine or str, optional
        A block, or the name of a saved one (loaded at the flow run's first GPU
        task). Default: a new block with ``backend="auto"``.
    max_workers : int, optional
        Threads for tasks (Prefect's ``ThreadPoolTaskRunner``). Engine calls are
        serialized on the session's owner thread whatever this is.

    Attributes
    ----------
    session : EngineSession or None
        The flow run's session once its engine has opened, until the runner exits.
    max_workers : int or None
        As given (``None``: Prefect's ``PREFECT_TASKS_RUNNER_THREAD_POOL_MAX_WORKERS``).

    Raises
    ------
    TypeError
        If ``engine`` is neither a block nor a string.

    Examples
    --------
    >>> from prefect import flow
    >>> from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
    >>> @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    ... def pipeline(): ...
    """

    session: EngineSession | None  # set from _FLOW_RUN_STATE

    #: The runner's state for one flow run, as it is outside any: set at ``__init__``, put back at ``__exit__`` (an
    #: ended flow run leaves nothing of its engine here) and pickled so. ``_interrupted``: an engine start was
    #: interrupted (a task's timeout, Ctrl-C, a cancellation).
    _FLOW_RUN_STATE = {"session": None, "_open_error": None, "_interrupted": False, "_token": None, "_parent": None,
                       "_flow_run": None}

    def __init__(self, engine: CudfPolarsEngine | str | None = None, max_workers: int | None = None) -> None:
        if engine is not None and not isinstance(engine, (CudfPolarsEngine, str)):
            raise TypeError(wrong_type("CudfPolarsTaskRunner(engine=...)", "a CudfPolarsEngine block or the name of "
                                       "a saved one", engine))
        super().__init__(max_workers=max_workers)
        self.max_workers = max_workers
        self.engine = engine if engine is not None else CudfPolarsEngine()
        self._open_lock = threading.Lock()
        vars(self).update(self._FLOW_RUN_STATE)

    def duplicate(self) -> CudfPolarsTaskRunner:
        """A fresh, unstarted runner with the same engine and thread count."""
        return type(self)(engine=self.engine, max_workers=self.max_workers)

    def __enter__(self) -> CudfPolarsTaskRunner:
        super().__enter__()
        self._parent = active.innermost()
        self._token = active.enter(self)
        return self

    def submit(self, task: Any, parameters: Any, wait_for: Any = None, dependencies: Any = None) -> Any:
        """Prefect's ``ThreadPoolTaskRunner.submit``; the first call records the flow run (for its log)."""
        if self._flow_run is None and (ctx := active.flow_run_context()) is not None and ctx.task_runner is self:
            self._flow_run = (ctx.flow_run, ctx.flow)
        return super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)

    @property
    def provided_session(self) -> EngineSession | None:
        """The session if it is open now (opens nothing)."""
        return getattr(self.session, "provided_session", None)

    def provide_session(self) -> EngineSession:
        """
        The flow run's session, opening the engine at the first call (once, under a lock).

        The first call inside the flow run writes the session's start line to its log.

        Raises
        ------
        SessionError
            When the runner has exited (its flow run is over), or a subflow's
            session cannot share its parent's GPU.
        BlockNotFoundError
            When the runner names a saved block that does not exist.
        NoGPUError, Exception
            Whatever opening the engine raised; every later call raises the same error.
        """
        with self._open_lock:
            if self._open_error is not None:
                raise self._open_error
            if self.session is None:
                if self._token is None:
                    raise SessionError("This CudfPolarsTaskRunner is not running a flow run; GPU tasks find "
                                       "their session inside the flow run that uses the runner.")
                try:
                    block = load_engine_block(self.engine) if isinstance(self.engine, str) else self.engine
                    parent = self._parent.provided_session if self._parent is not None else None
                    self.session = EngineSession(block).open(activate=False, parent=parent)
                except Exception as exc:  # an interruption (a task's timeout) is not kept: the next call tries again
                    self._open_error = exc
                    raise
                except BaseException:
                    self._interrupted = True
                    raise
            session = self.session
        return session.provide_session()

    def serve(self, future: Any) -> None:
        """Nothing to do: Prefect's thread pool waits for its task runs before ``__exit__`` closes the session."""

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        from prefect.exceptions import TerminationSignal

        terminating = isinstance(exc_value, TerminationSignal)
        try:
            if terminating and self.session is not None:
                # Stopped: end the session (bounded) before Prefect's pool waits for its task
                # threads, so that those waiting on the engine fail at once with SessionError.
                self.session.close(terminating=True)
            super().__exit__(exc_type, exc_value, traceback)
        finally:
            try:
                if self.session is not None:
                    self.session.close(terminating=terminating)
                elif self._open_error is None:
                    self._say_not_started(NOT_STARTED_LINE if not self._interrupted else INTERRUPTED_LINE)
            finally:
                if self._token is not None:
                    active.leave(self._token, self)
                vars(self).update(self._FLOW_RUN_STATE)

    def _say_not_started(self, line: str) -> None:
        """One line for a flow run whose engine never started: its log if a task was submitted, else the console."""
        if self._flow_run is not None:
            from prefect.logging.loggers import flow_run_logger

            flow_run_logger(*self._flow_run).info(line)  # (flow_run, flow)
        else:
            logger.info(line, extra={"send_to_api": False})

    def __eq__(self, value: object) -> bool:
        same_type = isinstance(value, CudfPolarsTaskRunner)
        return same_type and (self.max_workers, self.engine) == (value.max_workers, value.engine)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), **self._FLOW_RUN_STATE, "_open_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._open_lock = threading.Lock()
