"""
One engine call of a session: queued on the engine's owner thread, waited for by a thread or a coroutine.

The whole call (planning, the checks of the frames it reads, making room, the
engine, freeing its inputs) runs on the owner thread; the caller only waits
for its future: a thread in short slices (:meth:`EngineHost.wait
<prefect_cudf_polars.blocks.engine.EngineHost.wait>`), a coroutine on its
event loop. Either way a caller that stops waiting hands what the call
produces to the session's late release, and a failure after planning is
translated into an error users can act on.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NoReturn

from prefect_cudf_polars.blocks.backends.engine_errors import drop_frame_locals, raise_engine_error
from prefect_cudf_polars.blocks.deferred import FusedStep, fused_note
from prefect_cudf_polars.blocks.engine import EngineHost
from prefect_cudf_polars.blocks.runs import RunIdentity


class PendingCall:
    """
    One engine call of a session, queued on its owner thread; a thread (:meth:`wait`) or a coroutine
    (:meth:`wait_async`) waits for it, and what it produced is finished on the caller's side.

    Attributes
    ----------
    future : concurrent.futures.Future
        The call on the owner thread.
    fused : tuple of FusedStep
        The deferred steps the call runs fused in (named in a failure's note).
    run : RunIdentity
        The run that made the call.
    name : str
        The name of the result it produces.
    planned : bool
        Whether its plan passed the checks (set on the owner thread): errors after it are the engine's.
    """

    __slots__ = ("_finish", "_host", "_on_late", "fused", "future", "name", "planned", "run")

    def __init__(self, host: EngineHost, fused: tuple[FusedStep, ...], run: RunIdentity, name: str,
                 finish: Callable[[tuple], Any], on_late: Callable[[tuple], None]) -> None:
        self._host, self.fused, self.run, self.name = host, fused, run, name
        self._finish, self._on_late, self.planned = finish, on_late, False
        self.future: Future[tuple] | None = None

    def wait(self) -> Any:
        """Wait for the call in this thread (in slices: a task's timeout ends the wait) and return its value."""
        try:
            out = self._host.wait(self.future, on_late=self._on_late)  # type: ignore[arg-type]
        except Exception as exc:
            self._raise(exc)
        return self._finished(out)

    async def wait_async(self) -> Any:
        """Await the call's future on the event loop and return its value."""
        try:
            out = await self._host.wait_async(self.future, on_late=self._on_late)  # type: ignore[arg-type]
        except Exception as exc:
            self._raise(exc)
        return self._finished(out)

    def _finished(self, out: tuple) -> Any:
        """Finish ``out`` on the caller's side; if that is interrupted (a timeout), ``out`` goes to the late release."""
        try:
            return self._finish(out)
        except BaseException:
            self._host.post(self._on_late, out)
            raise

    def _raise(self, exc: Exception) -> NoReturn:
        if not self.planned:  # refused while planning (polars' error, or ours): nothing ran, nothing to translate
            drop_frame_locals(exc)  # the frames of the call hold its query, which holds the results it reads
            raise exc
        raise_engine_error(exc, note=fused_note(exc, self.fused))
