"""EngineSession: owner thread, results, teardown on every ending, backend resolution."""

from __future__ import annotations

import logging
import threading
import time

import polars as pl
import pytest
from processes import wait_until

from prefect_cudf_polars.blocks import (
    CudfPolarsEngine,
    NoEngineSessionError,
    NoGPUError,
    SessionError,
    get_engine_session,
)
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.backends import probe as gpu_probe
from prefect_cudf_polars.blocks.backends.cpu import CpuRunningEngine
from prefect_cudf_polars.blocks.backends.choice import resolve_backend
from prefect_cudf_polars.tasks import ResultReleasedError


@pytest.fixture()
def thread_log(monkeypatch):
    """Record the thread of every engine call of the cpu backend."""
    calls: list[tuple[str, str]] = []
    for name in ("execute", "collect", "shutdown", "read"):
        original = getattr(CpuRunningEngine, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, threading.current_thread().name))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(CpuRunningEngine, name, spy)
    original_start = CpuRunningEngine.__init__

    def spy_init(self, *args, **kwargs):
        calls.append(("start", threading.current_thread().name))
        original_start(self, *args, **kwargs)

    monkeypatch.setattr(CpuRunningEngine, "__init__", spy_init)
    return calls


def test_every_engine_call_runs_on_one_owner_thread(cpu_block, orders, thread_log):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders).filter(pl.col("amount") > 10))
        session.collect(r.lazy().group_by("customer").agg(pl.len()))
    names = {thread for _, thread in thread_log}
    assert len(names) == 1, thread_log
    assert names.pop().startswith("cudf-polars-engine-owner")
    assert thread_log[0][0] == "start" and thread_log[-1][0] == "shutdown"
    assert threading.current_thread().name not in names


def test_exit_releases_every_live_result_and_empties_the_store(cpu_block, orders):
    before = held_partitions()
    with cpu_block.session() as session:
        kept = [session.execute(pl.scan_parquet(orders)) for _ in range(3)]
        assert held_partitions() == before + 3
        assert len(session.live_results) == 3
    assert held_partitions() == before
    assert [r.state for r in kept] == ["released"] * 3
    assert session.summary()["counts"] == {"produced": 3, "consumed": 0, "released_unconsumed": 3}
    with pytest.raises(ResultReleasedError, match="session ended"):
        kept[0].lazy()


def test_exit_on_exception_releases_and_shuts_down(cpu_block, orders):
    before = held_partitions()
    with pytest.raises(ZeroDivisionError):
        with cpu_block.session() as session:
            r = session.execute(pl.scan_parquet(orders))
            1 / 0
    assert r.state == "released"
    assert session.closed
    assert held_partitions() == before


def test_close_is_idempotent(cpu_block, orders):
    session = cpu_block.session()
    with session:
        session.execute(pl.scan_parquet(orders))
    first = session.close()
    second = session.close()
    assert first == second
    assert first["counts"]["released_unconsumed"] == 1


def test_sessions_do_not_nest(cpu_block):
    with cpu_block.session():
        with pytest.raises(SessionError, match="do not nest"):
            with cpu_block.session():
                pass


def test_session_is_found_in_its_context_and_not_after(cpu_block):
    with cpu_block.session() as session:
        assert get_engine_session() is session
    with pytest.raises(NoEngineSessionError, match="active here, and no flow run is running.*CudfPolarsTaskRunner"):
        get_engine_session()


def test_query_after_close_says_the_session_ended(cpu_block, orders):
    with cpu_block.session() as session:
        pass
    with pytest.raises(SessionError, match="has ended"):
        session.execute(pl.scan_parquet(orders))


def test_gpu_backend_without_gpu_raises_no_gpu_error(monkeypatch):
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (0, "no NVIDIA driver: libcuda.so.1 was not found"))
    for backend in ("auto", "spmd", "dask", "ray"):
        with pytest.raises(NoGPUError, match="libcuda.so.1 was not found.*backend='cpu'"):
            CudfPolarsEngine(backend=backend).session().__enter__()


def test_missing_rapids_packages_are_named(monkeypatch):
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (1, None))
    monkeypatch.setattr(gpu_probe, "rapids_installed", lambda: False)
    with pytest.raises(NoGPUError, match=r"pip install -e '\.\[cu13\]'"):
        resolve_backend(CudfPolarsEngine(backend="spmd"))


def test_cpu_fallback_warns_and_uses_cpu(monkeypatch):
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (0, "no NVIDIA driver"))
    with pytest.warns(RuntimeWarning, match="uses the cpu backend"):
        with CudfPolarsEngine(cpu_fallback=True).session() as session:
            assert session.backend == "cpu"


def test_auto_picks_spmd_for_one_gpu_and_dask_for_several(monkeypatch):
    monkeypatch.setattr(gpu_probe, "rapids_installed", lambda: True)
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (1, None))
    assert resolve_backend(CudfPolarsEngine()) == ("spmd", None)
    monkeypatch.setattr(gpu_probe, "count_gpus", lambda: (4, None))
    assert resolve_backend(CudfPolarsEngine()) == ("dask", None)


def test_real_probe_on_this_machine_agrees_with_the_driver():
    found = gpu_probe.probe()
    count, problem = gpu_probe.count_gpus()
    assert found.gpus == count
    assert (count == 0) == (problem is not None)


def test_teardown_stops_waiting_for_an_engine_that_does_not_answer(orders, caplog):
    """
    A Prefect process worker's cancellation stops an owned cluster with the flow process.

    Stand-in for an engine that no longer answers: the owner thread is held by
    a call that waits on an event (as a query still running when SIGTERM comes). The session's end waits ``teardown_timeout``,
    marks the results released without the engine, logs why, and the queued
    teardown still shuts the engine down once the owner thread is free.
    """
    block = CudfPolarsEngine(backend="cpu", teardown_timeout=1.0)
    before = held_partitions()
    engine_answers = threading.Event()
    session = block.session().__enter__()
    kept = [session.execute(pl.scan_parquet(orders), name=f"kept-{i}") for i in range(2)]
    holder = threading.Thread(target=session.run, args=(engine_answers.wait,))
    holder.start()
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="prefect_cudf_polars"):
            summary = session.close()
        waited = time.monotonic() - started
        assert 1.0 <= waited < 3.0, waited
        assert summary["teardown"] == "stopped waiting after 1 s for the engine"
        assert [r.state for r in kept] == ["released", "released"]
        assert summary["counts"] == {"produced": 2, "consumed": 0, "released_unconsumed": 2}
        assert "teardown stopped waiting after 1 s" in caplog.text
        assert "raise teardown_timeout" in caplog.text
        assert held_partitions() == before + 2  # the engine has not answered yet
        with pytest.raises(ResultReleasedError, match="was released"):
            kept[0].lazy()
    finally:
        engine_answers.set()
        holder.join(timeout=30)
    wait_until(lambda: held_partitions() == before, 30, "the queued teardown ran")
    assert summary["shutdown_thread"].startswith("cudf-polars-engine-owner")


def test_a_call_queued_behind_a_stuck_engine_fails_with_session_error_at_teardown(orders, monkeypatch):
    """The session's end stops waiting after ``teardown_timeout``; a call queued behind the stuck one is cancelled
    then, and its caller gets ``SessionError`` at once instead of waiting for the engine."""
    from prefect_cudf_polars.blocks.engine import EngineHost

    queuing, submit = threading.Event(), EngineHost.submit

    def submit_and_tell(self, *args, **kwargs):  # the caller's call is on the owner thread's queue
        future = submit(self, *args, **kwargs)
        if threading.current_thread().name == "queued caller":
            queuing.set()
        return future

    monkeypatch.setattr(EngineHost, "submit", submit_and_tell)
    block = CudfPolarsEngine(backend="cpu", teardown_timeout=1.0)
    engine_answers = threading.Event()
    session = block.session().__enter__()
    holder = threading.Thread(target=session.run, args=(engine_answers.wait,))
    holder.start()
    failed: list[BaseException] = []

    def queued_call() -> None:
        try:
            session.execute(pl.scan_parquet(orders), name="queued")
        except BaseException as exc:
            failed.append(exc)

    caller = threading.Thread(target=queued_call, name="queued caller")
    caller.start()
    try:
        assert queuing.wait(10)
        assert session.close()["teardown"] == "stopped waiting after 1 s for the engine"
        caller.join(timeout=10)
        assert not caller.is_alive(), "the queued call's caller still waits for the engine"
        assert len(failed) == 1 and isinstance(failed[0], SessionError), failed
    finally:
        engine_answers.set()
        holder.join(timeout=30)
        caller.join(timeout=30)


def test_teardown_within_the_limit_is_complete(cpu_block, orders):
    with cpu_block.session() as session:
        session.execute(pl.scan_parquet(orders))
    assert session.summary()["teardown"] == "complete"
    assert cpu_block.teardown_timeout == 20.0


def test_teardown_stuck_inside_the_engine_shutdown_still_counts_every_result(orders, monkeypatch):
    """The engine stops answering while it shuts down: every result is counted released all the same."""
    from prefect_cudf_polars.blocks.backends.cpu import CpuRunningEngine

    engine_answers = threading.Event()
    original = CpuRunningEngine.shutdown

    def shutdown_that_hangs(self):
        engine_answers.wait()
        original(self)

    monkeypatch.setattr(CpuRunningEngine, "shutdown", shutdown_that_hangs)
    block = CudfPolarsEngine(backend="cpu", teardown_timeout=1.0)
    before = held_partitions()
    session = block.session().__enter__()
    kept = [session.execute(pl.scan_parquet(orders), name=f"kept-{i}") for i in range(2)]
    try:
        summary = session.close()
        assert summary["teardown"] == "stopped waiting after 1 s for the engine"
        assert summary["counts"] == {"produced": 2, "consumed": 0, "released_unconsumed": 2}
        assert [r.state for r in kept] == ["released", "released"]
    finally:
        engine_answers.set()
    wait_until(lambda: held_partitions() == before, 30, "the queued shutdown ran")


def test_a_close_interrupted_while_it_waits_still_ends_the_engine(orders):
    """
    A KeyboardInterrupt (SIGINT, or a cancellation) that reaches ``close`` while it waits for a served
    task run ends the session all the same: the engine's shutdown is queued on its owner thread, the
    store empties, and the interruption is raised after it.
    """
    import concurrent.futures
    import signal

    block = CudfPolarsEngine(backend="cpu", teardown_timeout=30.0)
    before = held_partitions()
    session = block.session().__enter__()
    kept = session.execute(pl.scan_parquet(orders), name="kept")
    session.serve(concurrent.futures.Future())  # a task run that never ends: close waits for it

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            session.close()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert session.closed and kept.state == "released"
    assert session.teardown == "interrupted; the engine's end was queued without waiting for it"
    wait_until(lambda: held_partitions() == before, 30, "the queued shutdown emptied the store")
    with pytest.raises(SessionError, match="has ended"):
        session.execute(pl.scan_parquet(orders))
    assert session.close()["teardown"] == session.teardown  # a second close changes nothing


def test_an_opening_that_fails_after_its_engine_started_ends_that_engine(cpu_block, monkeypatch):
    """A step of ``open`` after the engine started that fails (here the interpreter-exit hook) shuts the engine
    down on its owner thread before the error propagates; the session cannot be opened again."""
    from prefect_cudf_polars.blocks import exits

    def refuse(session):
        raise RuntimeError("cannot register the exit hook")

    monkeypatch.setattr(exits, "opened", refuse)
    session = cpu_block.session()
    with pytest.raises(RuntimeError, match="cannot register the exit hook"):
        session.__enter__()
    owner = f"cudf-polars-engine-owner-{session.id[:8]}"
    assert session.closed and session.running_engine is None
    wait_until(lambda: not any(t.name == owner for t in threading.enumerate()), 10, "the owner thread ended")
    with pytest.raises(SessionError, match="already opened"):
        session.__enter__()


def test_a_plan_refused_while_planning_frees_the_inputs_it_claimed_in_the_same_hand_off(cpu_block, orders):
    before = held_partitions()
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders), name="orders")
        with pytest.raises(NotImplementedError, match="zero-column") as refused:
            session.collect(r.lazy().select(pl.lit(1)), inputs=[r])
        assert held_partitions() == before  # freed by the refused call, not at the session's end
        assert not getattr(refused.value, "__notes__", None)  # the reader's own error, as planning raised it
        assert session.summary()["engine_calls"] == 1 and r.state == "consumed"
