"""GPUResult: states, one claim, one session, no pickling, stable hash, metadata-only repr."""

from __future__ import annotations

import copy
import pickle

import polars as pl
import pytest
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.utilities.hashing import hash_objects

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import (
    GPUResult,
    HostPersistenceError,
    ResultConsumedError,
    ResultReleasedError,
    WrongEngineError,
    execute,
)
from prefect_cudf_polars.blocks.errors import GPUResultError


def test_states_and_metadata(cpu_block, orders):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders), name="orders")
        assert r.state == "live"
        assert r.schema == pl.Schema({"id": pl.Int64, "customer": pl.Int64, "amount": pl.Float64})
        assert (r.backend, r.session_id, r.partitions, r.ranks) == ("cpu", session.id, 1, [0])
        assert r.engine_seconds > 0
        assert r.lazy().collect().height == 1000
        assert r.state == "consumed"
        assert "outside any Prefect run" in r.consumed_by
        other = session.execute(pl.scan_parquet(orders))
        other.release()
        assert other.state == "released"
        other.release()  # idempotent


def test_second_claim_names_the_consumer_task_run(orders):
    @task
    def first(r):
        return r.lazy().collect().height

    @task
    def second(r):
        return r.lazy()

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def twice():
        r = execute(pl.scan_parquet(orders))
        first(r)
        second(r)

    with pytest.raises(ResultConsumedError, match=r"already consumed by task run 'first-\w+'.*tee\(result, 2\)") as info:
        twice()
    assert info.value.consumer.startswith("task run 'first-")


def test_claim_in_flow_body_names_the_flow_run(orders):
    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def body():
        r = execute(pl.scan_parquet(orders))
        r.lazy()
        return r.consumed_by

    assert body().startswith("flow run '")


def test_released_result_raises_inside_and_outside_a_session(cpu_block, orders):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders))
        with r:
            pass
        with pytest.raises(ResultReleasedError, match="was released"):
            r.lazy()
    with pytest.raises(ResultReleasedError, match="was released"):
        r.lazy()


def test_result_of_another_session_is_refused_before_the_engine_is_called(orders):
    engine = CudfPolarsEngine(backend="cpu")
    with engine.session() as first:
        r = first.execute(pl.scan_parquet(orders))
        escaped = {}

        def elsewhere():
            with engine.session() as second:
                try:
                    r.lazy()
                except WrongEngineError as exc:
                    escaped["error"] = exc
                    escaped["second"] = second.id

        import threading

        t = threading.Thread(target=elsewhere)  # a fresh context: no active session
        t.start()
        t.join()
        assert r.state == "live"  # nothing was claimed
        assert r.lazy().collect().height == 1000
    err = escaped["error"]
    assert err.producer_session == first.id and err.current_session == escaped["second"]
    assert "only the engine that produced a result can read it" in str(err)


def test_pickling_is_refused_with_guidance(cpu_block, orders):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders), name="orders")
        for dump in (pickle.dumps, lambda o: pickle.dumps([o]), lambda o: __import__("cloudpickle").dumps({"k": o})):
            with pytest.raises(HostPersistenceError, match="thread-pool task runner"):
                dump(r)
        assert copy.deepcopy(r) is r
        assert r.state == "live"


def test_repr_has_metadata_only(cpu_block, tmp_path):
    path = tmp_path / "secret.parquet"
    pl.DataFrame({"token": ["s3cr3t-value"]}).write_parquet(path)
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(path), name="tokens")
        text = repr(r)
    assert "s3cr3t" not in text
    assert "tokens" in text and "token: String" in text and "state=live" in text


def test_hash_is_stable_by_id_and_never_pickles(cpu_block, orders, monkeypatch):
    import cloudpickle

    def no_pickle(*args, **kwargs):
        raise AssertionError("cache key computation pickled a GPUResult")

    with cpu_block.session() as session:
        a = session.execute(pl.scan_parquet(orders))
        b = session.execute(pl.scan_parquet(orders))
        monkeypatch.setattr(cloudpickle, "dumps", no_pickle)
        key = lambda v: INPUTS.compute_key(task_ctx=None, inputs={"x": v}, flow_parameters={})
        assert key(a) == key(a) and key(a) != key(b)
        assert key([a, {"nested": b}]) == key([a, {"nested": b}])
        assert key([a]) != key([b])
        assert hash_objects([a], raise_on_failure=True) != hash_objects([b], raise_on_failure=True)


def test_user_cached_task_with_results_in_a_list_logs_no_cache_key_error(orders, caplog):
    @task(cache_policy=INPUTS)  # a user's own cached task
    def count(results):
        return sum(r.lazy().collect().height for r in results)

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu")))
    def fan_in():
        rs = [execute(pl.scan_parquet(orders)) for _ in range(2)]
        return count(rs)

    assert fan_in() == 2000
    assert "Error encountered when computing cache key" not in caplog.text


@pytest.mark.parametrize("cls", [HostPersistenceError, ResultReleasedError, WrongEngineError, ResultConsumedError])
def test_errors_pickle_with_ids_not_handles(cls):
    err = cls("what happened; what to do", result_id="abc", result_name="orders")
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, GPUResultError) and str(back) == str(err)
    assert back.result_id == "abc" and back.result_name == "orders"


def test_gpu_result_is_not_constructed_by_users():
    with pytest.raises(TypeError, match="required positional argument"):
        GPUResult()  # type: ignore[call-arg]
