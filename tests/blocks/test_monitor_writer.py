"""
When the monitor's writer prints a result's plan: as soon as it takes the result's record,
on its own thread, ahead of the artifact's API write and while the session is still open
(real Prefect API, cpu backend).
"""

from __future__ import annotations

import signal
import threading
import time

import anyio
import polars as pl
import pytest
from prefect import flow

from api_reads import artifacts_of, task_runs_of
from prefect_cudf_polars.blocks.monitoring import artifacts
from prefect_cudf_polars.blocks.monitoring.writer import WRITER
from prefect_cudf_polars.tasks import execute


def test_the_writer_prints_a_results_plan_when_it_takes_the_record_before_the_session_ends(
    cpu_block, orders, monkeypatch
):
    printed: list[tuple[str, str]] = []
    query_plan = artifacts.query_plan

    def recording_query_plan(lf):
        plan = query_plan(lf)
        printed.append((threading.current_thread().name, plan))
        return plan

    monkeypatch.setattr(artifacts, "query_plan", recording_query_plan)
    seen: dict = {}

    @flow
    def early() -> None:
        from prefect.context import get_run_context

        flow_run_id = get_run_context().flow_run.id
        with cpu_block.session():
            WRITER.hold()  # nothing is sent: only the writer's first stage prints the plan
            try:
                execute(pl.scan_parquet(orders).filter(pl.col("customer") == 3), name="threes")
                deadline = time.monotonic() + 30.0
                while not printed and time.monotonic() < deadline:
                    time.sleep(0.01)
                seen["while_open"] = list(printed)
                seen["written"] = [
                    a for a in artifacts_of(flow_run_id=flow_run_id, settled=False) if a.task_run_id is not None
                ]
            finally:
                WRITER.release()

    state = early(return_state=True)
    assert state.is_completed(), state
    plan = pl.scan_parquet(orders).filter(pl.col("customer") == 3).explain()
    assert seen["while_open"] == [("cudf-polars-monitor", plan)], "the plan was not printed by the writer while the session was open"
    assert seen["written"] == [], "the result artifact was written while artifacts were held"
    assert len(printed) == 1, "the session's end printed the plan again"
    runs = task_runs_of(state.state_details.flow_run_id, expect=1, final=True)
    [artifact] = artifacts_of(task_run_id=runs["threes"].id)
    assert f"```\n{plan}\n```" in artifact.data


def _records(count: int, sent: list[int], *, artifacts: bool = True, done: list[int] | None = None) -> list:
    """``count`` records whose events append their number to ``sent`` (and, with ``artifacts``, write one)."""
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.settings import PREFECT_API_URL

    from prefect_cudf_polars.blocks.monitoring.writer import Record

    return [
        Record(
            send=lambda i=i: sent.append(i),
            build=(lambda i=i: ArtifactCreate(type="markdown", data=f"record {i}", description="writer test"))
            if artifacts else None,
            on_done=None if done is None else (lambda i=i: done.append(i)),
            api_url=PREFECT_API_URL.value(),
        )
        for i in range(count)
    ]


@pytest.fixture()
def writer():
    """A writer of its own, stopped at the end of the test."""
    from prefect_cudf_polars.blocks.monitoring.writer import MonitorWriter

    own = MonitorWriter()
    yield own
    own.abandon()


@pytest.fixture()
def api_answers(monkeypatch):
    """Make the API take ``answers["s"]`` seconds per artifact write, or block (``answers["block"]``); count writes in flight."""
    from prefect.client.orchestration import PrefectClient

    send = PrefectClient.request
    answers = {"s": 0.0, "block": False, "in_flight": 0, "most": 0, "starts": []}

    async def timed(self, method, path, *args, **kwargs):
        if method != "POST" or path != "/artifacts/":
            return await send(self, method, path, *args, **kwargs)
        answers["in_flight"] += 1
        answers["most"] = max(answers["most"], answers["in_flight"])
        answers["starts"].append(time.monotonic())
        try:
            await anyio.sleep(3600 if answers["block"] else answers["s"])
            return await send(self, method, path, *args, **kwargs)
        finally:
            answers["in_flight"] -= 1

    monkeypatch.setattr(PrefectClient, "request", timed)
    return answers


def test_a_busy_api_gets_one_write_at_a_time_and_a_quick_one_four(writer, api_answers, monkeypatch):
    """The writer paces itself on the API's answer times; events keep the order they were put in."""
    from prefect_cudf_polars.blocks.monitoring import pacing

    monkeypatch.setattr(pacing, "BUSY_S", 0.1)
    monkeypatch.setattr(pacing, "BUSY_WAIT_FACTOR", 2.0)
    sent: list[int] = []
    api_answers["s"] = 0.2  # slower than BUSY_S: busy after two writes
    busy = _records(4, sent)
    for record in busy:
        writer.put(record)
    assert writer.drain(30.0)
    assert writer.api_busy(busy[0].api_url)
    api_answers["most"] = 0
    api_answers["starts"].clear()
    for record in _records(3, sent):
        writer.put(record)
    assert writer.drain(30.0)
    assert api_answers["most"] == 1, "more than one write in flight on a busy API"
    starts = api_answers["starts"]
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # Each write, then BUSY_WAIT_FACTOR times as long before the next.
    assert all(gap >= (1 + pacing.BUSY_WAIT_FACTOR) * api_answers["s"] - 0.05 for gap in gaps), gaps
    api_answers["s"] = 0.01  # a quick answer: full speed again
    writer.put(_records(1, sent)[0])
    assert writer.drain(30.0)
    assert not writer.api_busy(busy[0].api_url)
    api_answers["most"] = 0
    api_answers["s"] = 0.05
    for record in _records(12, sent):
        writer.put(record)
    assert writer.drain(30.0)
    assert api_answers["most"] == pacing.CONCURRENCY
    assert sent == list(range(4)) + list(range(3)) + [0] + list(range(12))


def test_the_writer_waits_for_the_engines_to_be_quiet(writer, monkeypatch):
    """Nothing is sent while an engine call runs; the records go out once none has run for QUIET_S, in order."""
    from prefect_cudf_polars.blocks.monitoring import pacing, writer as writer_module

    sent: list[int] = []
    writer.activity.started()
    for record in _records(3, sent, artifacts=False):
        writer.put(record)
    time.sleep(0.5)
    assert sent == [], "records were sent during an engine call"
    writer.activity.ended()
    ended = time.monotonic()
    assert writer.drain(10.0)
    assert time.monotonic() - ended >= pacing.QUIET_S
    assert sent == [0, 1, 2]
    # An engine call that does not end: a record still goes out after MAX_DELAY_S.
    monkeypatch.setattr(writer_module, "MAX_DELAY_S", 0.5)
    writer.activity.started()
    put = time.monotonic()
    writer.put(_records(1, sent, artifacts=False)[0])
    assert writer.drain(10.0)
    assert time.monotonic() - put >= 0.5 and sent == [0, 1, 2, 0]
    writer.activity.ended()


def test_abandon_drops_what_is_unsent_and_cancels_the_writes_under_way(writer, api_answers):
    """Every record not sent is counted and finished (its waits end), promptly; later records are dropped at once."""
    from prefect_cudf_polars.blocks.monitoring import pacing

    api_answers["block"] = True  # an API that does not answer
    sent: list[int] = []
    done: list[int] = []
    for record in _records(6, sent, done=done):
        writer.put(record)
    deadline = time.monotonic() + 30.0
    while api_answers["in_flight"] < pacing.CONCURRENCY and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api_answers["in_flight"] == pacing.CONCURRENCY  # the first four writes wait on the API
    started = time.monotonic()
    assert writer.abandon(timeout=1.0) == 6
    assert time.monotonic() - started < 2.0
    assert sorted(done) == list(range(6)) and writer.outstanding == 0
    late = _records(1, sent, done=done)[0]
    writer.put(late)
    assert writer.outstanding == 0 and done[-1] == 0 and len(done) == 7
    assert sent == [0, 1, 2, 3]  # the events of the records whose writes had started


def test_a_keyboard_interrupt_on_the_writers_thread_reaches_the_main_thread_and_the_writer_goes_on(writer, caplog, request):
    """
    A Ctrl-C that polars raises on the writer's thread (rendering a plan) is raised in the main
    thread instead, once even when two plans raise it; the writer sends on.
    """

    # The writer raises the interrupt through the process's SIGINT handler, as a Ctrl-C would:
    # the test runs with Python's default one, whatever an earlier test or library installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    both_put = threading.Event()

    def interrupted_plan() -> None:
        both_put.wait(30.0)  # the interrupt must not land inside put()
        raise KeyboardInterrupt

    sent: list[int] = []
    first, second, third = _records(3, sent, artifacts=False)
    first.prepare = second.prepare = interrupted_plan
    writer.put(first)
    writer.put(second)
    with pytest.raises(KeyboardInterrupt):
        both_put.set()
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:  # the main thread's next bytecode raises it
            time.sleep(0.01)
    time.sleep(1.0)  # a second interrupt would be raised here, failing the test
    writer.put(third)
    assert writer.drain(10.0), "the writer stopped after the interrupt"
    assert sent == [0, 1, 2], "an interrupted record's event, or the next record, was not sent"
    assert writer.outstanding == 0
    assert sum("passed on to the main thread" in r.getMessage() for r in caplog.records) == 1
