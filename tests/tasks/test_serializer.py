"""GPUResultSerializer and the persistence warnings a task run shows."""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow
from prefect.cache_policies import INPUTS
from prefect.serializers import Serializer

from conftest import read_run_logs
from result_storage import saved_storage, stored_files
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import (
    GPUResultSerializer,
    HostPersistenceError,
    collect,
    execute,
    gpu_task,
)


def test_dumps_refuses_gpu_results_and_containers(cpu_block, orders):
    s = GPUResultSerializer()
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders), name="orders")
        for value in (r, [r], {"a": (1, {r})}, {"k": {"deep": [r]}}):
            with pytest.raises(HostPersistenceError, match="'orders'"):
                s.dumps(value)


def test_host_values_round_trip_and_foreign_blobs_are_refused():
    s = GPUResultSerializer()
    df = pl.DataFrame({"a": [1, 2]})
    assert s.loads(s.dumps(df)).equals(df)
    with pytest.raises(HostPersistenceError, match="never persists GPU results"):
        s.loads(b"\x80\x04anything")


def test_serializer_is_registered_with_prefect_by_type():
    assert isinstance(Serializer(type="cudf-polars-gpu"), GPUResultSerializer)


def test_our_tasks_do_not_persist_or_cache_by_default():
    for t in (execute, collect):
        assert t.persist_result is False
        assert type(t.cache_policy).__name__ == "_None"
    assert isinstance(execute.result_serializer, GPUResultSerializer)


def _run_and_logs(pipeline):
    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    return state, read_run_logs(flow_run_id, expect="asks for result persistence")


def test_persist_true_on_execute_logs_our_warning_and_keeps_the_handle(orders, tmp_path):
    persisting = execute.with_options(persist_result=True, result_storage_key="gpu-{task_run.id}")

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")),
          result_storage=saved_storage(tmp_path))
    def pipeline():
        r = persisting(pl.scan_parquet(orders))
        return collect(r).height  # the handle is still usable in process

    state, logs = _run_and_logs(pipeline)
    assert state.result() == 1000
    ours = [m for m in logs if "asks for result persistence" in m]
    assert ours and "persist_result=True" in ours[0] and "result_storage_key" in ours[0]
    assert "collect it to the host" in ours[0]
    assert not any(p.is_file() and p.stat().st_size > 0 and b"cudf" in p.read_bytes()[:64]
                   for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(
    "options",
    [{"persist_result": True}, {"cache_policy": INPUTS}, {"result_storage_key": "fixed-key"}],
)
def test_gpu_task_asked_to_persist_warns_and_writes_nothing(orders, tmp_path, options):
    @gpu_task(name="persist-me", **options)
    def step(path):
        return pl.scan_parquet(path)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")),
          result_storage=saved_storage(tmp_path / "store"))
    def pipeline():
        return collect(step(str(orders))).height

    state, logs = _run_and_logs(pipeline)
    assert state.result() == 1000
    assert any("Task 'persist-me' asks for result persistence" in m for m in logs)
    store = tmp_path / "store"
    written = stored_files(store)
    # Only the flow's own return value (an int) may be there, never a task's GPU result.
    assert all(b"GPUResult" not in p.read_bytes() for p in written)


def test_flow_level_persistence_does_not_reach_gpu_results(orders, tmp_path):
    @flow(persist_result=True, result_storage=saved_storage(tmp_path),
          task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def pipeline():
        r = execute(pl.scan_parquet(orders))
        return collect(r).height

    state = pipeline(return_state=True)
    assert state.is_completed() and state.result() == 1000
