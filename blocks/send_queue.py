"""
One queue, and one thread of ours, that hands a session's events and log lines to Prefect off the caller's path.

A caller queues a send with a copy of its context (microseconds); the thread
gathers what is queued for :data:`LINGER_S` seconds after the first send of a
batch (not when a session's end waits for the queue), then runs the batch in order, each send in its caller's context (a
burst of tasks pays for its events together, between their own steps, not
inside each of them), so Prefect's
``EventsWorker`` attaches the runs it finds there as if the caller had sent
it. Prefect's own queue services run on its global event loop thread, where
starting another of its services from a handler waits on a lock a starting
service holds while it waits for that same thread: so this is a plain thread.
A session's end waits until the queue has handed its sends on; at interpreter
exit the queue waits up to :data:`EXIT_WAIT_S` seconds for what is left, and a
forked child starts a queue of its own.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import threading
from collections.abc import Callable

from prefect_cudf_polars.blocks.backends.compat import register_before_thread_shutdown

logger = logging.getLogger("prefect_cudf_polars")

#: The queue's thread.
THREAD_NAME = "prefect-cudf-polars-telemetry"
#: Seconds the interpreter's exit waits for what is still queued.
EXIT_WAIT_S = 5.0
#: Seconds the thread gathers sends after the first of a batch before it runs them.
LINGER_S = 0.05

_queue: queue.SimpleQueue[tuple[contextvars.Context, Callable[[], None]]] = queue.SimpleQueue()
_started_in: int | None = None  # the process whose thread runs the queue
_lock = threading.Lock()
_flush = threading.Event()  # set: run what is queued now (someone waits for it)


def send_later(send: Callable[[], None]) -> None:
    """Run ``send`` (it must not raise) on the queue's thread, in a copy of the caller's context, after what is queued."""
    global _queue, _started_in
    if _started_in != os.getpid():
        with _lock:
            if _started_in != os.getpid():  # first use, or a forked child: a new queue and thread
                _queue = queue.SimpleQueue()
                threading.Thread(target=_serve, args=(_queue,), name=THREAD_NAME, daemon=True).start()
                if _started_in is None:
                    register_before_thread_shutdown(lambda: wait_sent(EXIT_WAIT_S))
                _started_in = os.getpid()
    _queue.put((contextvars.copy_context(), send))


def wait_sent(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until every send queued so far has run; whether it has (True at once when none
    was ever queued, or on the queue's own thread)."""
    if _started_in != os.getpid() or threading.current_thread().name == THREAD_NAME:
        return True
    done = threading.Event()
    send_later(done.set)
    _flush.set()  # no gathering for a batch someone waits on
    return done.wait(timeout)


def _serve(sends: queue.SimpleQueue[tuple[contextvars.Context, Callable[[], None]]]) -> None:
    while True:
        batch = [sends.get()]
        _flush.wait(LINGER_S)
        _flush.clear()
        while not sends.empty():  # this thread is the queue's one reader: what it sees queued is there
            batch.append(sends.get_nowait())
        for context, send in batch:
            try:
                context.run(send)
            except Exception as exc:  # a send must not stop the queue
                logger.warning("Could not send a cudf-polars event or log line: %s", exc)
        del batch, context, send  # what the sends hold (a session) is not kept until the next batch
