"""
``CudfPolarsTaskRunner``: a thread-pool task runner that owns one engine session per flow run.

Developer notes
---------------
Prefect calls :meth:`CudfPolarsTaskRunner.duplicate` for every flow run and
every attempt, and enters the copy before the flow run's context exists; the
copy opens the session on ``__enter__`` and closes it on ``__exit__``, which
Prefect runs on success, on exceptions and on ``TerminationSignal`` (SIGTERM).
Each attempt of a retried flow run therefore gets a fresh session, and the
failed attempt's results are released before the next attempt starts.
``on_cancellation`` hooks run in another process under a worker, so they could
not free GPU memory; this runner does not rely on them.
"""

from __future__ import annotations

from typing import Any

from prefect.task_runners import ThreadPoolTaskRunner

from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine, load_engine_block
from prefect_cudf_polars.blocks.session import EngineSession


class CudfPolarsTaskRunner(ThreadPoolTaskRunner):
    """
    Run a flow's tasks in threads next to one cudf-polars engine session.

    Parameters
    ----------
    engine
        A :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` block, or the
        name of a saved one (loaded when a flow run starts). Default: a new
        block with ``backend="auto"``.
    max_workers
        Threads for tasks (Prefect's ``ThreadPoolTaskRunner``). Engine calls
        are serialized on the session's owner thread whatever this is.

    Attributes
    ----------
    session : EngineSession or None
        The flow run's session while the runner is entered (also ``engine_session``,
        the name :func:`~prefect_cudf_polars.blocks.get_engine_session` looks for).

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

    def __init__(
        self,
        engine: CudfPolarsEngine | str | None = None,
        max_workers: int | None = None,
    ) -> None:
        if engine is not None and not isinstance(engine, (CudfPolarsEngine, str)):
            raise TypeError(
                "CudfPolarsTaskRunner(engine=...) takes a CudfPolarsEngine block or the "
                f"name of a saved one, not {type(engine).__name__}"
            )
        super().__init__(max_workers=max_workers)
        self.engine = engine if engine is not None else CudfPolarsEngine()
        self.session: EngineSession | None = None

    @property
    def engine_session(self) -> EngineSession | None:
        """The flow run's session while the runner is entered, else ``None``."""
        return self.session

    def duplicate(self) -> CudfPolarsTaskRunner:
        """A fresh, unstarted runner with the same engine and thread count."""
        return type(self)(engine=self.engine, max_workers=self._max_workers)

    def _block(self) -> CudfPolarsEngine:
        if isinstance(self.engine, str):
            return load_engine_block(self.engine)
        return self.engine

    def __enter__(self) -> CudfPolarsTaskRunner:
        super().__enter__()
        try:
            self.session = EngineSession(self._block()).open(activate=True)
        except BaseException:
            super().__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            super().__exit__(exc_type, exc_value, traceback)
        finally:
            if self.session is not None:
                self.session.close()

    def __eq__(self, value: object) -> bool:
        return (
            isinstance(value, CudfPolarsTaskRunner)
            and self._max_workers == value._max_workers
            and self.engine == value.engine
        )

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["session"] = None
        return state
