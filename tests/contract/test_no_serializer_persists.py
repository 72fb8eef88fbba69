"""
No result serializer writes a record of a GPU result, and cache keys still hash it by id.

A ``GPUResult`` lives in GPU memory of one process and never outlives its flow
run, so result storage must never get a record of it, whichever serializer a task
names (pickle, json, compressed/...): a GPU task asked to persist, and a plain
``@task`` that returns a GPU result, both complete with a WARNING that nothing was
persisted and why. Prefect's cache keys (``INPUTS``) still hash a result by its
id, at the top level and inside lists, tuples and dicts, so no cache key fails and
no two results hash alike.
"""

from __future__ import annotations

import polars as pl
import pytest
from prefect import flow, task
from prefect.cache_policies import INPUTS
from prefect.serializers import JSONSerializer, PickleSerializer

from api_reads import log_records, task_runs_of
from result_storage import saved_storage, stored_files
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, collect, gpu_task

SERIALIZERS = {
    "pickle": "pickle",
    "json": "json",
    "compressed/pickle": "compressed/pickle",
    "compressed/json": "compressed/json",
    "pickle (stdlib pickle)": PickleSerializer(picklelib="pickle"),
    "json (sorted keys)": JSONSerializer(dumps_kwargs={"sort_keys": True}),
}
NOTHING_PERSISTED = "nothing was persisted"


def runner() -> CudfPolarsTaskRunner:
    return CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))


def run_named(flow_run_id, name: str):
    """The one task run of this flow run whose name starts with ``name`` (each flow here runs two: it and collect)."""
    [run] = [r for n, r in task_runs_of(flow_run_id, expect=2, final=True).items() if n.startswith(name)]
    return run


def warnings_of(flow_run_id, task_run_id) -> list[str]:
    """WARNING (or higher) messages of one task run."""
    records = log_records(flow_run_id, expect=NOTHING_PERSISTED)
    return [r.message for r in records if r.task_run_id == task_run_id and r.level >= 30]


@gpu_task(name="orders-step")
def orders_step(path: str) -> pl.LazyFrame:
    return pl.scan_parquet(path)


@pytest.mark.parametrize("serializer", list(SERIALIZERS))
def test_a_gpu_task_asked_to_persist_writes_no_record_with_any_serializer(orders, tmp_path, serializer):
    persisting = orders_step.with_options(
        persist_result=True,
        cache_policy=INPUTS,
        result_serializer=SERIALIZERS[serializer],
        result_storage=saved_storage(tmp_path / "store"),
    )

    @flow(task_runner=runner())
    def pipeline():
        return collect(persisting(str(orders))).height  # the result stays usable

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    assert state.result() == 1000
    assert stored_files(tmp_path / "store") == []
    flow_run_id = state.state_details.flow_run_id
    warnings = warnings_of(flow_run_id, run_named(flow_run_id, "orders-step").id)
    assert any(NOTHING_PERSISTED in m for m in warnings), warnings


@pytest.mark.parametrize("serializer", list(SERIALIZERS))
def test_a_plain_task_returning_a_gpu_result_completes_warns_and_writes_no_record(
    orders, tmp_path, serializer
):
    @task(
        name="plain-producer",
        persist_result=True,
        result_serializer=SERIALIZERS[serializer],
        result_storage=saved_storage(tmp_path / "store"),
    )
    def plain_producer(path: str) -> GPUResult:
        return get_engine_session().execute(pl.scan_parquet(path), name="plain")

    @flow(task_runner=runner())
    def pipeline():
        return collect(plain_producer(str(orders))).height

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    assert state.result() == 1000
    assert stored_files(tmp_path / "store") == []
    flow_run_id = state.state_details.flow_run_id
    run = run_named(flow_run_id, "plain-producer")
    assert run.state.is_completed(), run.state
    warnings = warnings_of(flow_run_id, run.id)
    # What happened and why: the result lives in GPU memory and is never written.
    assert any(NOTHING_PERSISTED in m and "GPU memory" in m for m in warnings), warnings


def test_cache_keys_hash_a_result_by_its_id_wherever_it_sits(cpu_block, orders):
    with cpu_block.session() as session:
        first = session.execute(pl.scan_parquet(orders), name="first")
        second = session.execute(pl.scan_parquet(orders), name="second")

        def key(value):
            return INPUTS.compute_key(task_ctx=None, inputs={"value": value}, flow_parameters={})

        shapes = {
            "top level": lambda r: r,
            "in a list": lambda r: [r, 1],
            "in a tuple": lambda r: (r, "a"),
            "in a dict": lambda r: {"result": r, "n": 2},
            "nested": lambda r: {"runs": [{"input": r}]},
        }
        for shape, wrap in shapes.items():
            assert key(wrap(first)) == key(wrap(first)), shape  # stable
            assert key(wrap(first)) != key(wrap(second)), shape  # never two alike
        assert first.state == "live" and second.state == "live"  # hashing reads nothing


def test_a_cached_task_taking_results_gets_a_fresh_key_per_result_and_persists_its_host_value(
    orders, tmp_path
):
    calls = []

    @task(cache_policy=INPUTS, persist_result=True, result_storage=saved_storage(tmp_path / "store"))
    def count_inputs(results: list) -> int:
        calls.append(1)
        return len(results)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        a = session.execute(pl.scan_parquet(orders), name="a")
        b = session.execute(pl.scan_parquet(orders), name="b")
        first = count_inputs([a])
        again = count_inputs([a], return_state=True)
        other = count_inputs([b])
        return first, again.name, other

    first, again, other = pipeline()
    assert (first, other) == (1, 1)
    assert again == "Cached" and len(calls) == 2  # same result: same key; a new one: a new key
    assert len(stored_files(tmp_path / "store")) == 2  # the host values, one record per key


def test_prefects_hash_functions_hash_results_in_containers_by_id_and_json_refuses_them(cpu_block, orders):
    """Prefect 3.9's ``hash_objects`` (under every cache policy) hashes by id; JSON anywhere else refuses."""
    from prefect.utilities.hashing import hash_objects

    with cpu_block.session() as session:
        a = session.execute(pl.scan_parquet(orders), name="a")
        b = session.execute(pl.scan_parquet(orders), name="b")
        for wrap in (lambda r: [r], lambda r: {"left": r}, lambda r: ({"runs": [r]}, 3)):
            assert hash_objects(wrap(a), raise_on_failure=True) == hash_objects(wrap(a), raise_on_failure=True)
            assert hash_objects(wrap(a), raise_on_failure=True) != hash_objects(wrap(b), raise_on_failure=True)
        with pytest.raises(ValueError, match="HostPersistenceError: GPUResult 'a'.*cannot be pickled or persisted"):
            JSONSerializer().dumps({"result": a})
        assert a.state == "live" and b.state == "live"
