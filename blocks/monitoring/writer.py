"""
The monitor's writer: one thread per process that sends what engine sessions show the UI.

A GPU task's thread only puts a small record on the writer's queue
(:meth:`MonitorWriter.put`); the writer builds and emits the events and writes
the artifacts, off every task's critical path.

Developer notes
---------------
* One daemon thread runs an asyncio loop with one Prefect client per API URL,
  reused for the life of the process (not a client per artifact). A record
  joins a buffer, and the loop is woken once per burst.
* The writer's Python work waits for the engines to be quiet
  (:class:`~prefect_cudf_polars.blocks.monitoring.pacing.EngineActivity`): a
  pipeline of GPU tasks runs its steps first, and its records go out in the
  pause after it, or once a record has waited
  :data:`~prefect_cudf_polars.blocks.monitoring.pacing.MAX_DELAY_S`.
* Two stages, each in the order records were put: the first prints each
  result's plan (:attr:`Record.prepare`) as soon as the engines are quiet,
  so its query is let go early and a session's end finds few plans left to
  print; the second sends the event (Prefect's own events worker sends it on)
  and then writes the artifact, several writes in flight; Prefect 3.9 has no
  bulk artifact endpoint. A result artifact is one request and no event of
  Prefect's (:func:`write_result_artifact`). While the API answers slowly the
  second stage slows down
  (:class:`~prefect_cudf_polars.blocks.monitoring.pacing.Pacer`). A session's
  summary artifact and ``engine.stopped`` (urgent records) skip both stages.
* A session's teardown holds the second stage (:meth:`MonitorWriter.hold`).
  :meth:`MonitorWriter.drain` waits, bounded, until everything put is sent;
  a session's end waits for its own records at most ~1 s
  (:data:`~prefect_cudf_polars.blocks.monitoring.monitor.END_WAIT_S`), and the
  session room's exit hook drains the rest at interpreter exit, *before*
  Prefect's events worker drains (see
  :mod:`~prefect_cudf_polars.blocks.session.exit_hook`); for that,
  :func:`ensure_events_worker` starts Prefect's events worker before that
  hook is registered. Then the writer stops sending (:meth:`MonitorWriter.abandon`):
  what the drain did not send is dropped, with one warning giving the count,
  and the writes under way are cancelled, before Prefect's own events worker
  stops: a write finishing later would ask Prefect for an events worker after
  its shutdown (``can't register atexit after shutdown``).
* The thread starts with an empty context, so nothing it sends carries (or
  keeps alive) a flow run's context: every record names its runs by id.
* Nothing here raises into a session: failures are logged at WARNING.
* A ``KeyboardInterrupt`` raised on the writer's thread is the user's Ctrl-C
  surfacing in the wrong thread: polars 1.44 raises ``KeyboardInterrupt``
  from its own calls for a Ctrl-C the process received, on whichever thread
  makes the call (here: a plan's rendering). The writer passes it to the main
  thread (:func:`_thread.interrupt_main`), skips that record's step, and goes
  on.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from prefect_cudf_polars.blocks.monitoring.pacing import (
    MAX_DELAY_S,
    POLL_S,
    EngineActivity,
    Pacer,
)

logger = logging.getLogger("prefect_cudf_polars.monitoring")


#: Seconds within which further ``KeyboardInterrupt`` s on the writer's thread count as the
#: same Ctrl-C: polars can raise one Ctrl-C from more than one call.
SAME_INTERRUPT_S = 1.0
_last_interrupt = [float("-inf")]


def _pass_interrupt_to_main(step: str) -> None:
    """Raise a ``KeyboardInterrupt`` that surfaced on the writer's thread in the main thread instead (once per Ctrl-C)."""
    now = time.monotonic()
    again = now - _last_interrupt[0] < SAME_INTERRUPT_S
    _last_interrupt[0] = now
    if again:
        return
    logger.warning(
        "A keyboard interrupt (Ctrl-C) surfaced on the cudf-polars monitor's thread as it tried to %s; "
        "it is passed on to the main thread, and that record's step is skipped.",
        step,
    )
    _thread.interrupt_main()


def _run_step(fn: Callable[[], None], step: str) -> None:
    """Run one step of a record on the writer's thread: a failure is logged, a Ctrl-C passed to the main thread."""
    try:
        fn()
    except KeyboardInterrupt:
        _pass_interrupt_to_main(step)
    except Exception as exc:
        logger.warning("Could not %s: %s", step, exc)


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
        Runs on the writer's thread once the engines are quiet, before the
        artifact waits for the API (a result's plan is printed then, so its
        query is let go long before a session's end).
    urgent : bool
        Sent at once, ahead of every other record and never held (a session's
        summary artifact and ``engine.stopped``).
    on_done : callable, optional
        Called once, when the record is sent, failed or dropped: on the
        writer's thread, or on the thread that puts it after the writer
        stopped (:meth:`MonitorWriter.abandon`).
    api_url : str or None
        The Prefect API to write the artifact to (``PREFECT_API_URL`` where the record was made).
    """

    __slots__ = ("api_url", "build", "finished", "on_done", "prepare", "put_at", "send", "urgent")

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
        self.put_at = time.monotonic()
        self.finished = False


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
    """
    The process-wide queue and thread that send monitor records (see the module notes).

    Attributes
    ----------
    activity : EngineActivity
        What the engines are doing: sessions' owner threads report each call.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buffer: deque[Record] = deque()
        self._wakeup_sent = False
        self._pending = Pending()
        self._clients: dict[Any, Any] = {}
        self._writes: dict[asyncio.Future[Any], Record] = {}
        self._holds = 0
        self._go: asyncio.Event | None = None
        self._abandoned = False
        self._stages: list[asyncio.Future[None]] = []
        self._ready: asyncio.Queue[Record] | None = None
        self._prepared: asyncio.Queue[Record] | None = None
        self._slot: asyncio.Condition | None = None
        self._in_flight = 0
        self._pacers: dict[Any, Pacer] = {}
        self.activity = EngineActivity()

    def hold(self) -> None:
        """
        Send no new record but the urgent ones until :meth:`release` (calls nest).

        A session's teardown holds them, so that sending events and writing
        artifacts in the background does not slow the teardown down (one
        process, one interpreter lock; the local API on the same cores). Plans
        are still printed.
        """
        with self._lock:
            self._holds += 1
            first = self._holds == 1
        if first and self._loop is not None and self._go is not None:
            self._loop.call_soon_threadsafe(self._go.clear, context=contextvars.Context())

    def release(self) -> None:
        """Undo one :meth:`hold`."""
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
        wake-up. After :meth:`abandon` the record is dropped at once.
        """
        self._pending.add()
        if self._abandoned:
            self._finish(record)
            return
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

    def abandon(self, timeout: float = 1.0) -> int:
        """
        Send nothing more: drop every record not yet sent and cancel the writes under way.

        For the interpreter's exit, after the bounded drain: every dropped
        record's ``on_done`` still runs, so waits on them end. Later
        :meth:`put` calls drop their record at once. Idempotent.

        Parameters
        ----------
        timeout : float
            Seconds to wait at most for the writer's thread to drop and cancel.

        Returns
        -------
        int
            Records not sent: dropped, or cancelled while their artifact was
            being written (the API may have taken some of those).
        """
        with self._lock:
            self._abandoned = True
            loop = self._loop
        left = self._pending.count
        if loop is None or not left:
            return left
        done = threading.Event()

        def cancel_all() -> None:
            try:
                for stage in self._stages:
                    stage.cancel()
                for task, record in list(self._writes.items()):
                    task.cancel()
                    self._finish(record)  # a task cancelled before it ran never gets to its finally
                self._take()  # the buffer: dropped, as abandoned
                for waiting in (self._ready, self._prepared):
                    while waiting is not None and not waiting.empty():
                        self._finish(waiting.get_nowait())
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(cancel_all, context=contextvars.Context())
        except RuntimeError:  # pragma: no cover - the loop is closed
            return left
        deadline = time.monotonic() + timeout
        done.wait(timeout)
        self._pending.wait(max(deadline - time.monotonic(), 0.0))
        return left

    def api_busy(self, api_url: str | None) -> bool:
        """
        Whether the writer counts the API at ``api_url`` as busy now (see :class:`Pacer`).

        Returns
        -------
        bool
        """
        pacer = self._pacers.get(api_url)
        return pacer is not None and pacer.busy

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
        self._ready = asyncio.Queue()
        self._prepared = asyncio.Queue()
        self._go = asyncio.Event()
        self._slot = asyncio.Condition()
        if not self._holds:
            self._go.set()
        self._stages = [
            loop.create_task(self._prepare_in_order(self._ready, self._prepared)),
            loop.create_task(self._dispatch(self._prepared)),
        ]
        self._loop = loop
        ready.set()
        loop.run_forever()

    def _take(self) -> None:
        """On the writer's loop: send the urgent records, queue the others for the stages."""
        with self._lock:
            batch = list(self._buffer)
            self._buffer.clear()
            self._wakeup_sent = False
        assert self._ready is not None
        for record in batch:
            if self._abandoned:
                self._finish(record)
            elif record.urgent:
                self._prepare(record)
                self._send_event(record)
                if record.build is None:
                    self._finish(record)
                else:
                    self._start_write(record, None)
            else:
                self._ready.put_nowait(record)
        del batch  # a sent record keeps nothing alive while the loop waits
        record = None

    def _prepare(self, record: Record) -> None:
        if record.prepare is not None:
            _run_step(record.prepare, "prepare a cudf-polars artifact")
            record.prepare = None

    def _send_event(self, record: Record) -> None:
        if record.send is not None:
            _run_step(record.send, "emit a cudf-polars event")

    async def _until_quiet(self, record: Record) -> None:
        """Wait until the engines are quiet, or the record has waited :data:`MAX_DELAY_S`."""
        while not self.activity.quiet() and time.monotonic() - record.put_at < MAX_DELAY_S:
            await asyncio.sleep(POLL_S)

    async def _prepare_in_order(self, ready: asyncio.Queue[Record], prepared: asyncio.Queue[Record]) -> None:
        """The first stage: print the records' plans, in order, while the engines are quiet."""
        while True:
            record = await ready.get()
            try:
                await self._until_quiet(record)
            except asyncio.CancelledError:
                self._finish(record)  # abandoned: not sent
                raise
            self._prepare(record)
            prepared.put_nowait(record)
            del record

    async def _dispatch(self, prepared: asyncio.Queue[Record]) -> None:
        """The second stage: send the records in order, unless held, as fast as the API keeps up."""
        assert self._go is not None and self._slot is not None
        while True:
            record = await prepared.get()
            try:
                await self._until_quiet(record)
                await self._go.wait()
                pacer = self._pacers.setdefault(record.api_url, Pacer())
                async with self._slot:
                    await self._slot.wait_for(lambda: self._in_flight < pacer.concurrency)
                await asyncio.sleep(pacer.wait_s(artifact=record.build is not None))
            except asyncio.CancelledError:
                self._finish(record)  # abandoned: not sent
                raise
            self._send_event(record)
            if record.build is None:
                self._finish(record)
            else:
                self._start_write(record, pacer)
            del record

    def _start_write(self, record: Record, pacer: Pacer | None) -> None:
        if pacer is not None:
            self._in_flight += 1
        task = asyncio.ensure_future(self._write(record, pacer))
        self._writes[task] = record
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Future[Any]) -> None:
        self._writes.pop(task, None)

    async def _write(self, record: Record, pacer: Pacer | None) -> None:
        """Write the record's artifact (failures are logged); a paced write tells ``pacer`` how long it took."""
        started = time.monotonic()
        failed = False
        try:
            if self._abandoned:
                return
            assert record.build is not None
            artifact = record.build()
            client = await self._client(record.api_url)
            started = time.monotonic()
            if record.urgent:
                await client.create_artifact(artifact=artifact)
            else:
                await write_result_artifact(client, artifact)
        except KeyboardInterrupt:
            failed = True
            _pass_interrupt_to_main("write a cudf-polars artifact")
        except Exception as exc:
            failed = True
            logger.warning("Could not write a cudf-polars artifact: %s", exc)
        finally:
            self._finish(record)
            if pacer is not None:
                if not self._abandoned:
                    pacer.took(time.monotonic() - started, failed=failed)
                self._in_flight -= 1
                assert self._slot is not None
                async with self._slot:
                    self._slot.notify_all()

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
        """The record is sent, failed or dropped: its ``on_done`` runs and it stops counting (once)."""
        with self._lock:
            if record.finished:
                return
            record.finished = True
        try:
            if record.on_done is not None:
                record.on_done()
        finally:
            self._pending.done()


async def write_result_artifact(client: Any, artifact: Any) -> None:
    """
    Create a result artifact through Prefect's API with one request and nothing else.

    Prefect 3.9's ``PrefectClient.create_artifact`` also validates the response
    into an ``Artifact`` and emits a ``prefect.artifact.created`` event. With one
    artifact per GPU result, that event doubles what the flow process sends
    and the API ingests per result, and the result's own ``result.created``
    event already names the same task run; so a result artifact is one
    ``POST /artifacts/`` through the client's ``request`` (its retries and
    authentication included).

    Parameters
    ----------
    client : prefect.client.orchestration.PrefectClient
        An entered client.
    artifact : prefect.client.schemas.actions.ArtifactCreate
        The artifact.

    Raises
    ------
    httpx.HTTPStatusError
        When the API refuses the artifact (Prefect's client raises for an error status).
    httpx.HTTPError
        When the request cannot be made (the API cannot be reached, a timeout).
    """
    await client.request("POST", "/artifacts/", json=artifact.model_dump(mode="json", exclude_unset=True))


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
