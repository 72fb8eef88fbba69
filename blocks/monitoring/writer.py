"""
The monitor's writer: one thread per process that sends what engine sessions show the UI.

A GPU task's thread only puts a small record on the writer's queue
(:meth:`MonitorWriter.put`); the writer builds and emits the events and writes
the artifacts, off every task's critical path.

Developer notes
---------------
* One daemon thread runs an asyncio loop with one Prefect client per API URL,
  reused for the life of the process (not a client per artifact). A record
  joins a buffer, and the loop is woken once per burst. Events are emitted in
  the order they were put (Prefect's own events worker sends them on). Result artifacts are written by :data:`CONCURRENCY` coroutines, so that
  many requests are in flight on the API at once; Prefect 3.9 has no bulk
  artifact endpoint. A session's summary artifact does not queue behind them.
* A result's plan is printed as soon as the writer takes its record
  (:attr:`Record.prepare`), not when its artifact's turn at the API comes, so
  a session's end finds few plans left to print.
* :meth:`MonitorWriter.drain` waits, bounded, until everything put is written;
  a session's end waits for its own records at most ~1 s
  (:data:`~prefect_cudf_polars.blocks.monitoring.monitor.END_WAIT_S`), and the
  session room's exit hook drains the rest at interpreter exit, *before*
  Prefect's events worker drains (see
  :mod:`~prefect_cudf_polars.blocks.session.exit_hook`); for that,
  :func:`ensure_events_worker` starts Prefect's events worker before that
  hook is registered.
* The thread starts with an empty context, so nothing it sends carries (or
  keeps alive) a flow run's context: every record names its runs by id.
* Nothing here raises into a session: failures are logged at WARNING.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("prefect_cudf_polars.monitoring")

#: Artifact writes in flight at once.
CONCURRENCY = 4


class Record:
    """
    One thing to send: an event (``send``), an artifact (``build``), or both (the event first).

    Parameters
    ----------
    send : callable, optional
        Emits an event (runs on the writer's thread).
    build : callable, optional
        Returns the ``prefect.client.schemas.actions.ArtifactCreate`` to write.
    prepare : callable, optional
        Runs on the writer's thread as soon as the record is taken, before the
        artifact waits for the API (a result's plan is printed then, so its
        query is let go long before a session's end).
    urgent : bool
        The artifact is written at once, not behind the result artifacts (a session's summary).
    on_done : callable, optional
        Called on the writer's thread once the record is sent (or failed).
    api_url : str or None
        The Prefect API to write the artifact to (``PREFECT_API_URL`` where the record was made).
    """

    __slots__ = ("api_url", "build", "on_done", "prepare", "send", "urgent")

    def __init__(
        self,
        *,
        send: Callable[[], None] | None = None,
        build: Callable[[], Any] | None = None,
        prepare: Callable[[], None] | None = None,
        urgent: bool = False,
        on_done: Callable[[], None] | None = None,
        api_url: str | None = None,
    ) -> None:
        self.send, self.build, self.urgent, self.on_done = send, build, urgent, on_done
        self.prepare = prepare
        self.api_url = api_url


def current_api_url() -> str | None:
    """``PREFECT_API_URL`` here (read once per session, not per record: it costs ~15 µs)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


class Pending:
    """A count of things under way, and a bounded wait for it to reach zero (thread-safe)."""

    def __init__(self) -> None:
        self.count = 0
        self._zero = threading.Condition()

    def add(self) -> None:
        """One more under way."""
        with self._zero:
            self.count += 1

    def done(self) -> None:
        """One fewer under way."""
        with self._zero:
            self.count -= 1
            if not self.count:
                self._zero.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait until none is under way, at most ``timeout`` seconds; True when none is."""
        deadline = time.monotonic() + timeout
        with self._zero:
            while self.count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._zero.wait(left)
        return True


class MonitorWriter:
    """The process-wide queue and thread that send monitor records (see the module notes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._artifacts: asyncio.Queue[Record] | None = None
        self._buffer: deque[Record] = deque()
        self._wakeup_sent = False
        self._pending = Pending()
        self._clients: dict[Any, Any] = {}
        self._urgent: set[asyncio.Future[None]] = set()
        self._holds = 0
        self._go: asyncio.Event | None = None

    def hold_artifacts(self) -> None:
        """
        Start no new result artifact until :meth:`release_artifacts` (calls nest).

        A session's teardown holds them, so that building and writing artifacts
        in the background does not slow the teardown down (one process, one GIL;
        the local API on the same cores).
        """
        with self._lock:
            self._holds += 1
            first = self._holds == 1
        if first and self._loop is not None and self._go is not None:
            self._loop.call_soon_threadsafe(self._go.clear, context=contextvars.Context())

    def release_artifacts(self) -> None:
        """Undo one :meth:`hold_artifacts`."""
        with self._lock:
            self._holds = max(self._holds - 1, 0)
            last = self._holds == 0
        if last and self._loop is not None and self._go is not None:
            self._loop.call_soon_threadsafe(self._go.set, context=contextvars.Context())

    def put(self, record: Record) -> None:
        """
        Queue ``record`` (starts the writer's thread on first use); never raises.

        The record joins a buffer; the writer's loop is woken only when it is
        not already due to take the buffer, so a burst of records costs one
        wake-up.
        """
        self._pending.add()
        try:
            loop = self._started()
            with self._lock:
                self._buffer.append(record)
                if self._wakeup_sent:
                    return
                self._wakeup_sent = True
            # In an empty context: nothing the writer sends (or Prefect's events worker
            # caches with an event) carries the putting thread's flow run or session.
            loop.call_soon_threadsafe(self._take, context=contextvars.Context())
        except Exception as exc:  # pragma: no cover - a dead loop, at interpreter exit
            logger.warning("Could not queue a cudf-polars monitoring record: %s", exc)
            self._finish(record)

    def drain(self, timeout: float) -> bool:
        """
        Wait until every record put so far is sent, at most ``timeout`` seconds.

        Returns
        -------
        bool
            True when nothing is left.
        """
        return self._pending.wait(timeout)

    @property
    def outstanding(self) -> int:
        """Records put and not yet sent."""
        return self._pending.count

    def _started(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is not None:
            return loop
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                thread = threading.Thread(
                    target=self._serve, args=(ready,), name="cudf-polars-monitor", daemon=True
                )
                thread.start()
                ready.wait()
            assert self._loop is not None
            return self._loop

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._artifacts = asyncio.Queue()
        self._go = asyncio.Event()
        if not self._holds:
            self._go.set()
        for _ in range(CONCURRENCY):
            loop.create_task(self._artifact_worker(self._artifacts))
        self._loop = loop
        ready.set()
        loop.run_forever()

    def _take(self) -> None:
        """On the writer's loop: send the buffered events, queue the artifacts."""
        with self._lock:
            batch = list(self._buffer)
            self._buffer.clear()
            self._wakeup_sent = False
        assert self._artifacts is not None
        for record in batch:
            if record.send is not None:
                try:
                    record.send()
                except Exception as exc:
                    logger.warning("Could not emit a cudf-polars event: %s", exc)
            if record.prepare is not None:
                try:
                    record.prepare()
                except Exception as exc:
                    logger.warning("Could not prepare a cudf-polars artifact: %s", exc)
                record.prepare = None
            if record.build is None:
                self._finish(record)
            elif record.urgent:
                task = asyncio.ensure_future(self._write(record))
                self._urgent.add(task)
                task.add_done_callback(self._urgent.discard)
            else:
                self._artifacts.put_nowait(record)
        del batch  # a sent record keeps nothing alive while the loop waits
        record = None

    async def _artifact_worker(self, artifacts: asyncio.Queue[Record]) -> None:
        assert self._go is not None
        while True:
            record = await artifacts.get()
            await self._go.wait()
            await self._write(record)
            del record

    async def _write(self, record: Record) -> None:
        try:
            assert record.build is not None
            artifact = record.build()
            client = await self._client(record.api_url)
            await client.create_artifact(artifact=artifact)
        except Exception as exc:
            logger.warning("Could not write a cudf-polars artifact: %s", exc)
        finally:
            self._finish(record)

    async def _client(self, api_url: Any) -> Any:
        client = self._clients.get(api_url)
        if client is None:
            from prefect.client.orchestration import get_client
            from prefect.settings import PREFECT_API_URL, temporary_settings

            if api_url is not None:
                with temporary_settings({PREFECT_API_URL: api_url}):
                    client = get_client()
            else:
                client = get_client()
            await client.__aenter__()
            self._clients[api_url] = client
        return client

    def _finish(self, record: Record) -> None:
        try:
            if record.on_done is not None:
                record.on_done()
        finally:
            self._pending.done()


#: The one writer of this process.
WRITER = MonitorWriter()


def ensure_events_worker() -> None:
    """
    Start Prefect's events worker now, if this process emits events.

    Prefect's worker registers its exit drain when it starts; starting it
    before our own exit hook is registered makes ours run first (threading's
    exit callbacks run last-registered first), while the events worker still
    sends. Started in an empty context, so it keeps no flow run's context.
    """
    try:
        from prefect.events.worker import EventsWorker, should_emit_events

        if should_emit_events():
            contextvars.Context().run(EventsWorker.instance)
    except Exception as exc:  # pragma: no cover - depends on Prefect's settings
        logger.warning("Could not start Prefect's events worker: %s", exc)
