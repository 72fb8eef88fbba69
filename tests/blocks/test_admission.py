"""
Admission by bytes: a session holds ceil(device_memory_limit / GiB) slots of a Prefect global concurrency limit.

Against the real local Prefect API of the test session: each test creates its own
global concurrency limit with Prefect's client and reads its active slots back from
the API. The flow runs use the ``cpu`` backend with ``device_memory_limit`` 4 GiB,
so each one holds 4 slots while its engine runs.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.settings import PREFECT_API_URL

from api_reads import task_run_list
from conftest import read_run_logs
from process_worker import cancel_and_wait, process_worker_deployment, worker_env
from processes import pid_alive, wait_until
from prefect_cudf_polars import cli
from prefect_cudf_polars.blocks import AdmissionError, CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.blocks.admission import GIB, REQUEST_SLICE_S, admitted, slots_for
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import execute

SCRIPTS = Path(__file__).parent / "scripts"
#: An H200's memory as the driver reports it: 139.8 GiB, not a whole number of GiB.
H200_BYTES = 150_121_545_728


def new_limit(slots: int, *, active: bool = True, slot_decay_per_second: float = 0.0) -> str:
    """A new global concurrency limit of ``slots`` slots with a name of its own; returns the name."""
    name = f"gpu-memory-{uuid.uuid4().hex[:12]}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
            name=name, limit=slots, active=active, slot_decay_per_second=slot_decay_per_second))
    return name


def active_slots(name: str) -> int:
    """The limit's active slots, read from the API."""
    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name).active_slots


def four_gib_block(limit: str, **fields) -> CudfPolarsEngine:
    return CudfPolarsEngine(backend="cpu", device_memory_limit=4 * GIB, admission_limit=limit, **fields)


def owner_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("cudf-polars-engine-owner")]


def in_threads(run_flow: Callable[[int], object], count: int, name: str) -> tuple[list[threading.Thread], dict]:
    """Start ``run_flow(i)`` for each ``i < count`` on a thread of its own; the dict gets each one's return or exception."""
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = run_flow(i)
        except BaseException as exc:  # reported by the caller's assertions
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name=f"{name}-{i}") for i in range(count)]
    for t in threads:
        t.start()
    return threads, results


class Lines(logging.Handler):
    """Every log line written through the loggers a session's admission writes to, in this process."""

    LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect_cudf_polars")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def count(self, text: str) -> int:
        return sum(text in m for m in list(self.messages))


class ErrorLines(logging.Handler):
    """The records at ERROR or above that reach this process's console: through the root logger, and through
    Prefect's internal loggers (``prefect._internal``, which do not propagate to it)."""

    LOGGERS = ("", "prefect._internal")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


def attached(handler: Lines | ErrorLines):
    """``handler`` on each of its class's ``LOGGERS`` while the test runs (a fixture's body)."""
    loggers = [logging.getLogger(name) for name in type(handler).LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.fixture()
def console_errors():
    yield from attached(ErrorLines())


#: Seconds of one request for the slots in the tests of a wait longer than one request (the
#: product's ``REQUEST_SLICE_S`` is 10 s): the session's requests work the same at any length.
SLICE_S = 3.0


@pytest.fixture()
def request_slice(monkeypatch) -> float:
    """The sessions of this process ask for their slots in requests of :data:`SLICE_S` seconds."""
    monkeypatch.setattr("prefect_cudf_polars.blocks.admission.REQUEST_SLICE_S", SLICE_S)
    return SLICE_S


@pytest.fixture()
def lines():
    yield from attached(Lines())


def test_a_limit_occupies_its_bytes_in_whole_gib_rounded_up():
    assert slots_for(4 * GIB) == 4
    assert slots_for(4 * GIB + 1) == 5
    assert slots_for(1) == 1


def test_an_engine_on_two_gpus_occupies_its_limit_on_each():
    name = new_limit(10)
    with admitted(four_gib_block(name), 4 * GIB, lambda *a: None, gpus=2) as admission:
        assert admission.slots == 8 and active_slots(name) == 8
    assert active_slots(name) == 0


def test_slots_taken_are_given_back_when_anything_after_taking_them_fails():
    """The admission holds its slots by ``with`` from the moment Prefect gives them: a failing line after it frees them."""
    name = new_limit(10)

    def log(level, msg, *args):
        if msg.startswith("Admitted after"):
            raise OSError("the flow run's log is gone")

    with pytest.raises(OSError, match="log is gone") as failed, admitted(four_gib_block(name), 4 * GIB, log):
        pass
    assert active_slots(name) == 0, failed.value  # given back, not left to whatever still holds the error


def test_without_an_admission_limit_nothing_is_occupied_or_logged():
    logged = []
    with admitted(CudfPolarsEngine(backend="cpu"), None, lambda *a: logged.append(a)) as admission:
        assert (admission.limit_name, admission.slots, admission.seconds) == (None, 0, 0.0)
    assert logged == []


def test_three_flow_runs_of_4_gib_under_a_10_slot_limit_never_run_three_engines_at_once(orders, lines):
    name = new_limit(10)
    marks: list[tuple[str, int]] = []
    mark_lock = threading.Lock()
    go_on = threading.Event()
    waiting_line = f"of global concurrency limit {name!r}, for at most"

    def mark(kind: str, i: int) -> None:
        with mark_lock:
            marks.append((kind, i))

    @flow
    def admitted_run(i: int) -> int:
        with four_gib_block(name).session():
            mark("started", i)
            try:
                rows = execute(pl.scan_parquet(orders), name=f"orders-{i}").lazy().collect().height
                assert go_on.wait(60), "the test never let the engines end"
            finally:
                mark("ended", i)
            return rows

    threads, results = in_threads(admitted_run, 3, "admitted-run")
    try:
        # Two engines run; the third flow run has written its waiting line and is not admitted.
        wait_until(lambda: sum(k == "started" for k, _ in marks) >= 2 and lines.count(waiting_line) == 3,
                   120, "two engines started and three flow runs waiting or admitted")
        assert sum(k == "started" for k, _ in marks) == 2, marks
        assert active_slots(name) == 8
    finally:
        go_on.set()
        for t in threads:
            t.join(120)
    assert results == {0: 1000, 1: 1000, 2: 1000}, results
    running, most = set(), 0
    for kind, i in marks:
        (running.add if kind == "started" else running.discard)(i)
        most = max(most, len(running))
    assert most == 2, marks
    assert marks[2][0] == "ended", marks  # the third engine started only after one had ended
    assert lines.count(f"Admitted after") == 3
    assert active_slots(name) == 0
    assert not owner_threads()


def test_two_flow_runs_of_half_a_gpu_of_non_whole_gib_run_at_once_under_the_limit_the_cli_sizes(orders):
    gpu_slots = slots_for(H200_BYTES)  # what deploy sizes the limit to on this GPU
    half = H200_BYTES // 2  # device_memory_limit="50%" on it
    assert (gpu_slots, slots_for(half)) == (140, 70)
    name = f"gpu-memory-{uuid.uuid4().hex[:12]}"
    assert cli.main(["admission-limit", name, "--slots", str(gpu_slots)]) == 0
    both_admitted = threading.Barrier(2, timeout=120)

    @flow
    def half_gpu_run(i: int) -> int:
        with CudfPolarsEngine(backend="cpu", device_memory_limit=half, admission_limit=name).session():
            rows = execute(pl.scan_parquet(orders), name=f"orders-{i}").lazy().collect().height
            both_admitted.wait()  # each engine runs until the other one has started too
            return rows

    threads, results = in_threads(half_gpu_run, 2, "half-gpu-run")
    for t in threads:
        t.join(180)
    assert results == {0: 1000, 1: 1000}, results
    assert active_slots(name) == 0


def test_slots_are_given_back_after_a_flow_run_that_raises(orders):
    name = new_limit(10)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def fails_after_a_result() -> None:
        execute(pl.scan_parquet(orders))
        assert active_slots(name) == 4
        raise ValueError("the flow body failed")

    with pytest.raises(ValueError, match="the flow body failed"):
        fails_after_a_result()
    assert active_slots(name) == 0
    assert not owner_threads()


def test_slots_are_given_back_when_the_engine_fails_to_start(orders, monkeypatch):
    from prefect_cudf_polars.blocks import engine

    name = new_limit(10)
    seen: list[int] = []

    def broken_start(*args, **kwargs):
        seen.append(active_slots(name))
        raise RuntimeError("the backend could not start")

    monkeypatch.setattr(engine, "start_backend", broken_start)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    with pytest.raises(RuntimeError, match="the backend could not start"):
        pipeline()
    assert seen == [4]  # admitted first, then the backend was started
    assert active_slots(name) == 0
    assert not owner_threads()


def test_a_missing_limit_fails_the_first_gpu_task_run_and_starts_nothing(orders):
    name = f"gpu-memory-missing-{uuid.uuid4().hex[:12]}"
    before = held_partitions()

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    state = pipeline(return_state=True)
    assert state.is_failed()
    with pytest.raises(AdmissionError, match=rf"global concurrency limit '{name}' .*does not exist.*prefect gcl create"):
        state.result()
    failed = [run for run in task_run_list(state.state_details.flow_run_id, expect=1, final=True)
              if run.state.is_failed()]
    assert len(failed) == 1 and "does not exist" in failed[0].state.message, failed
    assert f"prefect gcl create {name} --limit" in failed[0].state.message
    assert held_partitions() == before
    assert not owner_threads()


def test_a_limit_smaller_than_the_session_needs_is_refused_at_once(orders):
    name = new_limit(3)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    with pytest.raises(AdmissionError, match=r"has 3 slot\(s\), fewer than the 4 this session needs"):
        pipeline()
    assert active_slots(name) == 0


def test_a_limit_whose_slots_decay_is_refused_with_how_to_set_the_decay_to_0(orders):
    name = new_limit(10, slot_decay_per_second=0.5)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    with pytest.raises(AdmissionError, match=rf"{name}.*lets its slots decay \(slot_decay_per_second=0\.5\)"
                       rf".*Set its decay to 0 with `prefect-cudf-polars admission-limit {name} --slots N`"):
        pipeline()
    assert active_slots(name) == 0
    assert not owner_threads()


def test_an_unreachable_prefect_api_is_an_admission_error_that_says_what_to_check():
    from prefect.settings import temporary_settings

    block = four_gib_block("gpu-memory")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # nothing listens on port 9
        with pytest.raises(AdmissionError, match=r"Could not ask the Prefect API for 4 slot\(s\) of the global "
                           r"concurrency limit 'gpu-memory'.*ConnectError.*check that PREFECT_API_URL names a "
                           r"running Prefect server.*run the flow again"):
            with admitted(block, 4 * GIB, lambda *a: None):
                pass


def test_a_disabled_limit_is_not_enforced_and_says_so(orders, lines):
    name = new_limit(2, active=False)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> int:
        return execute(pl.scan_parquet(orders)).lazy().collect().height

    assert pipeline() == 1000
    assert lines.count(f"Admission limit {name!r} is disabled in Prefect, so it is not enforced") == 1


def test_a_session_that_waits_past_its_admission_timeout_fails_and_its_log_says_what_it_waited_for(orders):
    from prefect.concurrency.sync import concurrency

    name = new_limit(6)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name, admission_timeout=2.0)))
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    with concurrency(name, occupy=4, strict=True):  # another holder takes 4 of the 6 slots
        state = pipeline(return_state=True)
        assert active_slots(name) == 4
    assert state.is_failed()
    with pytest.raises(AdmissionError, match=rf"Waited \d+\.\d s \(admission_timeout=2\) for 4 slot\(s\) .*{name}"
                       r".*Raise admission_timeout"):
        state.result()
    logged = read_run_logs(state.state_details.flow_run_id, expect="Waiting for admission")
    assert [m for m in logged if m.startswith("Waiting for admission: 4 slot(s) (GiB of device memory) of global "
                                              f"concurrency limit {name!r}, for at most 2 s")], logged
    assert active_slots(name) == 0
    assert not owner_threads()


def test_an_ordinary_wait_for_slots_logs_no_error_in_the_flow_runs_log_or_on_the_console(orders, lines,
                                                                                        console_errors,
                                                                                        request_slice):
    """A flow run (its engine started by a GPU task) waits longer than one request for its slots, then is admitted."""
    import time

    from prefect.concurrency.sync import concurrency

    from api_reads import log_records

    name = new_limit(6)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)))
    def pipeline() -> int:
        return execute(pl.scan_parquet(orders)).lazy().collect().height

    with concurrency(name, occupy=4, strict=True):  # another holder takes 4 of the 6 slots
        threads, results = in_threads(lambda i: pipeline(return_state=True), 1, "waiting-run")
        wait_until(lambda: lines.count(f"of global concurrency limit {name!r}, for at most") == 1, 120,
                   "the flow run waiting for its slots")
        time.sleep(request_slice + 1)  # its first request for the slots times out meanwhile
    threads[0].join(120)
    state = results[0]
    assert state.is_completed(), state
    records = log_records(state.state_details.flow_run_id, expect="engine session ended")  # its last line
    [admitted_line] = [r.message for r in records if r.message.startswith("Admitted after")]
    assert float(admitted_line.split()[2]) > request_slice, admitted_line  # so a request did time out
    assert not [r.message for r in records if r.level >= logging.ERROR], [(r.level, r.message) for r in records]
    assert console_errors.messages == []
    assert active_slots(name) == 0


def test_a_failed_request_for_slots_other_than_a_timeout_is_still_logged_as_an_error(console_errors):
    """What is kept off the console is a timed-out request only: a request the API did not answer still shows."""
    from prefect.concurrency.sync import concurrency
    from prefect.settings import temporary_settings

    name = f"gpu-memory-{uuid.uuid4().hex[:12]}"  # a limit of its own: Prefect's request service for it is new
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # nothing listens on port 9
        with pytest.raises(Exception, match="Unable to acquire concurrency slots"):
            with concurrency(name, occupy=1, timeout_seconds=REQUEST_SLICE_S, strict=True):
                pass
    # Prefect's service logs it after handing the caller its error.
    wait_until(lambda: [m for m in console_errors.messages
                        if "ConcurrencySlotAcquisitionWithLeaseService' failed to process item" in m], 30,
               "the request's ERROR on the console")


def test_a_session_whose_caller_stops_waiting_for_slots_stops_asking_and_holds_nothing(orders, caplog, request_slice):
    from prefect.concurrency.sync import concurrency

    name = new_limit(6)

    @flow(task_runner=CudfPolarsTaskRunner(four_gib_block(name)), timeout_seconds=2)  # it times out waiting
    def pipeline() -> None:
        execute(pl.scan_parquet(orders))

    with concurrency(name, occupy=4, strict=True):  # another holder takes 4 of the 6 slots
        state = pipeline(return_state=True)
        assert state.is_failed()
        # The owner thread stops asking within one request, long before admission_timeout (3600 s).
        wait_until(lambda: not owner_threads(), request_slice + 30, "the abandoned session's wait to end")
        assert active_slots(name) == 4  # the holder's only
    assert active_slots(name) == 0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cudf-polars engine not started")]
    assert said and all(m.startswith("cudf-polars engine not started: its start was interrupted") for m in said), said


@pytest.mark.timeout(300)
def test_a_flow_run_cancelled_while_it_waits_for_slots_ends_and_holds_nothing(tmp_path, orders):
    import time

    from prefect.concurrency.sync import concurrency
    from prefect.deployments import run_deployment

    from api_reads import log_records

    name = new_limit(6)
    pool = f"admission-wait-{tmp_path.name}"[:50]
    env = worker_env()
    started_file = tmp_path / "started.json"
    with concurrency(name, occupy=4, strict=True):  # another holder takes 4 of the 6 slots
        with process_worker_deployment(
            pool, flow_name="admitted-hold", entrypoint="admitted_flow.py:admitted_hold", folder=SCRIPTS,
            parameters={"evidence": str(tmp_path), "path": str(orders), "limit": name, "request_slice_s": SLICE_S},
            env=env, log=tmp_path / "worker.log",
        ) as worker:
            flow_run = run_deployment(f"admitted-hold/{pool}", timeout=0)
            wait_until(lambda: started_file.exists() or worker.poll() is not None, 240, "the flow run to start")
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-4000:]
            pid = json.loads(started_file.read_text())["pid"]
            logged = read_run_logs(flow_run.id, expect="Waiting for admission", timeout=60)
            assert [m for m in logged if m.startswith("Waiting for admission: 4 slot(s)")], logged
            time.sleep(SLICE_S + 1)  # an ordinary wait: its first request for the slots times out
            state, _ = cancel_and_wait(flow_run.id, pid=pid)
            assert state.is_cancelled(), state
            wait_until(lambda: not pid_alive(pid), 60, "the waiting flow process to exit")
        assert not (tmp_path / "ready.json").exists()  # its engine never started
        # Nothing at ERROR: in the flow run's log, nor on the flow process's console (the worker's output).
        records = log_records(flow_run.id, expect="Flow run was cancelled")
        assert not [r.message for r in records if r.level >= logging.ERROR], [(r.level, r.message) for r in records]
        console = (tmp_path / "worker.log").read_text()
        assert "| ERROR" not in console, console[-4000:]
        assert active_slots(name) == 4  # the holder's only
    assert active_slots(name) == 0


@pytest.mark.timeout(300)
def test_a_cancelled_flow_run_gives_its_slots_back(tmp_path, orders):
    from prefect.deployments import run_deployment

    name = new_limit(10)
    pool = f"admission-{tmp_path.name}"[:50]
    env = worker_env()
    ready_file = tmp_path / "ready.json"
    with process_worker_deployment(
        pool, flow_name="admitted-hold", entrypoint="admitted_flow.py:admitted_hold", folder=SCRIPTS,
        parameters={"evidence": str(tmp_path), "path": str(orders), "limit": name}, env=env,
        log=tmp_path / "worker.log",
    ) as worker:
        flow_run = run_deployment(f"admitted-hold/{pool}", timeout=0)
        wait_until(lambda: ready_file.exists() or worker.poll() is not None, 240, "the flow run holding its slots")
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-4000:]
        ready = json.loads(ready_file.read_text())
        assert ready["state"] == "live"
        assert active_slots(name) == 4
        state, _ = cancel_and_wait(flow_run.id, pid=ready["pid"])
        assert state.is_cancelled(), state
    assert not pid_alive(ready["pid"])
    assert active_slots(name) == 0
