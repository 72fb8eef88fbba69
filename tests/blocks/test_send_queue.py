"""The telemetry queue runs every send once, in the order queued, each in a copy of its caller's context."""

from __future__ import annotations

import contextvars
import logging
import threading

import pytest

from prefect_cudf_polars.blocks.send_queue import send_later, wait_sent

CALLER = contextvars.ContextVar("caller", default=None)


def test_sends_from_several_threads_run_once_each_in_each_threads_order_and_a_wait_returns_once_they_ran():
    ran: list[tuple[int, int]] = []

    def queue_from(thread: int) -> None:
        for i in range(100):
            send_later(lambda i=i: ran.append((thread, i)))

    threads = [threading.Thread(target=queue_from, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wait_sent(10.0)
    assert sorted(ran) == [(t, i) for t in range(4) for i in range(100)]
    for t in range(4):
        assert [i for thread, i in ran if thread == t] == list(range(100))


def test_a_send_runs_in_a_copy_of_its_callers_context():
    seen: list[str | None] = []
    token = CALLER.set("the task run")
    try:
        send_later(lambda: seen.append(CALLER.get()))
    finally:
        CALLER.reset(token)
    assert wait_sent(10.0)
    assert seen == ["the task run"]


def test_a_failing_send_is_logged_and_the_sends_after_it_still_run(caplog: pytest.LogCaptureFixture):
    ran: list[str] = []

    def fails() -> None:
        raise ValueError("the API is down")

    with caplog.at_level(logging.WARNING, logger="prefect_cudf_polars"):
        send_later(fails)
        send_later(lambda: ran.append("after"))
        assert wait_sent(10.0)
    assert ran == ["after"]
    assert "Could not send a cudf-polars event or log line: the API is down" in caplog.text
