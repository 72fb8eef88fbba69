"""
Bad inputs: each row of docs/bad-inputs.md, with its clear error, nothing lost, nothing hung.

"Nothing lost" is checked as: results not involved stay live and readable, the
session stays usable after the error, and the cpu backend's host store holds
nothing more than before once the flow run ends.
"""

from __future__ import annotations

import pickle
import re
import threading

import polars as pl
import pytest
from prefect import flow, task
from prefect.client.orchestration import get_client
from prefect.task_runners import ProcessPoolTaskRunner
from pydantic import ValidationError

from prefect_cudf_polars.blocks import (
    CudfPolarsEngine,
    CudfPolarsTaskRunner,
    SessionError,
    get_engine_session,
)
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.backends.engine_errors import translate_engine_error
from prefect_cudf_polars.tasks import (
    DeviceMemoryError,
    GPUResult,
    HostPersistenceError,
    ResultReleasedError,
    WrongEngineError,
    collect,
    execute,
    gpu_task,
)
from reliability_fixtures import engine_block  # noqa: F401 (pytest fixtures)

RUNNER = lambda: CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu"))  # noqa: E731


@pytest.fixture()
def store_is_restored():
    before = held_partitions()
    yield
    assert held_partitions() == before


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (pl.DataFrame({"a": [1]}), r"not DataFrame; call .lazy\(\) on the DataFrame"),
        ("select * from t", "not str"),
        (42, "not int"),
    ],
)
def test_argument_that_is_not_a_lazyframe_or_gpu_result(bad, message, store_is_restored):
    @flow(task_runner=RUNNER())
    def wrong_argument():
        with pytest.raises(TypeError, match=f"LazyFrame or a GPUResult, {message}"):
            execute(bad)
        with pytest.raises(TypeError, match=f"LazyFrame or a GPUResult, {message}"):
            collect(bad)
        return collect(pl.LazyFrame({"a": [1, 2]})).height  # the session still works

    assert wrong_argument() == 2


def test_missing_file(engine_block, tmp_path, orders, store_is_restored):
    @gpu_task
    def join_missing(r: GPUResult, path: str) -> pl.LazyFrame:
        return r.lazy().join(pl.scan_parquet(path), on="id")

    # polars resolves the scan before cudf-polars sees the plan; on the GPU the
    # exception class is whatever polars raises there, the file is named either way.
    expected = FileNotFoundError if engine_block.backend == "cpu" else Exception

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def missing():
        kept = execute(pl.scan_parquet(orders), name="kept")
        with pytest.raises(expected, match="missing.parquet"):
            execute(pl.scan_parquet(tmp_path / "missing.parquet"))
        used = execute(pl.scan_parquet(orders), name="used")
        with pytest.raises(expected, match="missing.parquet"):
            join_missing(used, str(tmp_path / "missing.parquet"))
        session = get_engine_session()
        live = [r.name for r in session.live_results]
        held, start, kept_state = session.memory_in_use(), session.memory["at_start"], kept.state
        rows = collect(kept).height
        return kept_state, used.state, live, rows, held > start, session.memory_in_use() == start

    # Only `kept` holds memory after the errors; reading it brings memory back to the start.
    assert missing() == ("live", "consumed", ["kept"], 1000, True, True)


def test_join_on_columns_that_do_not_exist(engine_block, orders, store_is_restored):
    @gpu_task
    def bad_join(r: GPUResult) -> pl.LazyFrame:
        return r.lazy().join(pl.LazyFrame({"customer_id": [1]}), on="customer_id")

    expected = pl.exceptions.ColumnNotFoundError if engine_block.backend == "cpu" else Exception

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def no_such_column():
        session = get_engine_session()
        before = held_partitions()
        r = execute(pl.scan_parquet(orders))
        with pytest.raises(expected, match="customer_id"):
            bad_join(r)
        freed = session.memory_in_use() == session.memory["at_start"]
        return r.state, held_partitions() - before, freed, collect(pl.scan_parquet(orders)).height

    state, left_in_store, freed, rows = no_such_column()
    assert state == "consumed" and left_in_store == 0 and freed  # claimed by the failed step, and freed by it
    assert rows == 1000  # the session still runs queries


def test_gpu_result_used_after_its_flow_ended(engine_block, orders):
    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def returns_a_handle():
        return execute(pl.scan_parquet(orders), name="escaped")

    escaped = returns_a_handle()  # also: a GPUResult as a flow's return value
    assert escaped.state == "released"
    with pytest.raises(ResultReleasedError, match="its flow run is over.*collect it inside the flow run"):
        escaped.lazy()

    @flow(task_runner=CudfPolarsTaskRunner(engine_block))
    def later():
        return collect(escaped)

    with pytest.raises(ResultReleasedError, match="was released when its engine session ended"):
        later()


def test_gpu_result_as_a_flow_return_value_with_persistence_is_refused(orders, tmp_path):
    from prefect.filesystems import LocalFileSystem

    LocalFileSystem(basepath=str(tmp_path)).save("bad-inputs-results", overwrite=True)
    storage = LocalFileSystem.load("bad-inputs-results")

    @flow(task_runner=RUNNER(), persist_result=True, result_storage=storage)
    def persisted_handle():
        return execute(pl.scan_parquet(orders), name="handle")

    state = persisted_handle(return_state=True)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(b"GPUResult" not in p.read_bytes() for p in written)
    value = state.result(raise_on_failure=False)
    # Prefect logs "Failed to serialize object of type 'GPUResult' … the result has not
    # been persisted" (our HostPersistenceError underneath) and completes the flow run;
    # the handle it keeps in memory was released with the session.
    assert state.is_completed()
    assert isinstance(value, GPUResult) and value.state == "released"
    with pytest.raises(ResultReleasedError, match="its flow run is over"):
        value.lazy()


def test_gpu_result_as_a_flow_parameter(orders, store_is_restored):
    @flow(task_runner=RUNNER())
    def child_with_its_own_engine(r: GPUResult) -> int:
        return collect(r).height

    @flow
    def child_sharing_the_parent_session(r: GPUResult) -> int:
        return collect(r).height

    @flow(task_runner=RUNNER())
    def parent():
        r = execute(pl.scan_parquet(orders), name="parent's")
        # A subflow with its own runner has its own session, which cannot read the parent's result.
        with pytest.raises(WrongEngineError, match="but subflow run '.*' has its own engine session"):
            child_with_its_own_engine(r)
        assert r.state == "live"  # nothing lost: the parent still has it
        # A subflow without its own engine runs on the parent's session and reads it.
        return child_sharing_the_parent_session(r)

    assert parent() == 1000

    # From another flow run (its own session) the parameter is refused before any read.
    @flow(task_runner=RUNNER())
    def producer():
        r = execute(pl.scan_parquet(orders), name="producer's")
        errors = []

        def other_flow_run():
            try:
                child_with_its_own_engine(r)
            except WrongEngineError as exc:
                errors.append(exc)

        t = threading.Thread(target=other_flow_run)
        t.start()
        t.join(timeout=120)
        return errors, r.state, collect(r).height

    errors, state, rows = producer()
    assert len(errors) == 1 and "only the engine that produced a result can read it" in str(errors[0])
    assert state == "live" and rows == 1000


def test_gpu_result_passed_to_a_process_based_task_runner(orders, store_is_restored):
    @task
    def count(r):
        return r.lazy().collect().height

    @flow(task_runner=ProcessPoolTaskRunner(max_workers=1))
    def in_processes():
        with CudfPolarsEngine(backend="cpu").session() as session:
            r = session.execute(pl.scan_parquet(orders), name="stays here")
            with pytest.raises(HostPersistenceError, match="not a process-based runner"):
                count.submit(r).result()
            return r.state, session.collect(r.lazy()).height

    assert in_processes() == ("live", 1000)


def test_session_opened_inside_another(orders):
    """`with block.session():` inside a flow run that has a session is refused, with the hint for its case."""

    @flow(task_runner=RUNNER())
    def inside_the_runners():
        outer = get_engine_session()
        with pytest.raises(SessionError, match="its CudfPolarsTaskRunner provides one.*do not combine"):
            with CudfPolarsEngine(backend="cpu").session():
                pass
        return outer.closed, collect(pl.scan_parquet(orders)).height

    @flow
    def inside_another_with_block():
        with CudfPolarsEngine(backend="cpu").session() as outer:
            with pytest.raises(SessionError, match=f"id {outer.id}.*already open here.*close it before"):
                with CudfPolarsEngine(backend="cpu").session():
                    pass
            return outer.closed, collect(pl.scan_parquet(orders)).height

    assert inside_the_runners() == (False, 1000)
    assert inside_another_with_block() == (False, 1000)


def test_two_flows_in_one_process_each_with_a_session(orders, store_is_restored):
    outcomes: dict[str, object] = {}
    both_started = threading.Barrier(2, timeout=120)
    both_checked = threading.Barrier(2, timeout=120)
    handles: dict[str, GPUResult] = {}

    def run(name: str, customer: int) -> None:
        @flow(name=f"flow-{name}", task_runner=RUNNER())
        def one():
            r = execute(pl.scan_parquet(orders).filter(pl.col("customer") == customer))
            handles[name] = r
            both_started.wait()
            other = handles["b" if name == "a" else "a"]
            try:
                other.lazy()
            except WrongEngineError as exc:
                outcomes[f"{name}-cross"] = exc
            both_checked.wait()  # neither reads its own result before both tried the other's
            return get_engine_session().id, collect(r).height

        outcomes[name] = one()

    threads = [threading.Thread(target=run, args=(n, c)) for n, c in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a flow run hung"
    (sid_a, rows_a), (sid_b, rows_b) = outcomes["a"], outcomes["b"]
    assert sid_a != sid_b and rows_a == 143 and rows_b == 143
    assert isinstance(outcomes["a-cross"], WrongEngineError)
    assert isinstance(outcomes["b-cross"], WrongEngineError)


def test_device_memory_exhausted_names_the_option_that_spills(orders, store_is_restored):
    # cudf-polars' own shape (cudf_polars.engine.core.execute_ir_on_rank).
    hint = (
        "Try lowering `target_partition_size` (current 1500000000) and/or "
        "RAPIDSMPF_SPILL_DEVICE_LIMIT (default '80%') to reduce peak memory.\nOriginal "
        "error:\nstd::bad_alloc: out_of_memory: CUDA error"
    )
    for raised in (MemoryError(hint), ExceptionGroup("rank failed", [MemoryError(hint)]),
                   RuntimeError("std::bad_alloc: out_of_memory: RMM failure")):
        translated = translate_engine_error(raised)
        assert isinstance(translated, DeviceMemoryError) and isinstance(translated, MemoryError)
        assert "spill_device_limit" in str(translated) and "target_partition_size" in str(translated)

    def exhausts(df: pl.DataFrame) -> pl.DataFrame:
        raise MemoryError(hint)

    # A Python function raising cudf-polars' MemoryError stands for the engine running
    # out. cudf-polars runs no Python functions on the GPU, so the GPU-support check
    # refuses it in execute; a collect with raise_on_fail=False runs it on polars.
    with CudfPolarsEngine(backend="cpu", raise_on_fail=False).session() as session:
        kept = session.execute(pl.scan_parquet(orders), name="kept")
        r = session.execute(pl.scan_parquet(orders))
        with pytest.raises(DeviceMemoryError, match=r"lower `spill_device_limit`.*cudf-polars said: Try lowering"):
            session.collect(r.lazy().map_batches(exhausts))
        r.release()  # as the tasks do after a failed engine call
        assert kept.state == "live" and session.collect(kept.lazy()).height == 1000


def test_block_with_an_invalid_option(tmp_path):
    with pytest.raises(ValidationError, match="spill_device_limit='lots' is not a percentage"):
        CudfPolarsEngine(spill_device_limit="lots")
    with pytest.raises(ValidationError, match="use the block field of that name"):
        CudfPolarsEngine(executor_options={"target_partition_size": 1})
    with pytest.raises(ValidationError, match="backend"):
        CudfPolarsEngine(backend="tpu")
    # A saved block edited to a bad value (through the API, as the UI would) fails on load.
    from prefect.client.schemas.actions import BlockDocumentUpdate

    block_id = CudfPolarsEngine(backend="cpu").save("edited-badly", overwrite=True)
    with get_client(sync_client=True) as client:
        client.update_block_document(
            block_id, BlockDocumentUpdate(data={"backend": "cpu", "spill_device_limit": "lots"})
        )
    named = (r"saved cudf-polars engine block 'edited-badly' holds a value its fields do not allow: "
             r"spill_device_limit: spill_device_limit='lots' is not a percentage of GPU memory above 0% and at "
             r'most 100% \("80%"\) or a number of bytes, at least 1 MiB.*Fix it in the Prefect UI')
    with pytest.raises(ValueError, match=named):
        CudfPolarsEngine.load("edited-badly")

    # The runner loads its block at the flow run's first GPU task, which then fails the run: its state
    # message, read back from the API, names the field and what it allows.
    @flow(task_runner=CudfPolarsTaskRunner("edited-badly"))
    def uses_it():
        return collect(pl.LazyFrame({"a": [1]})).height

    state = uses_it(return_state=True)
    assert state.is_failed()
    with get_client(sync_client=True) as client:
        message = client.read_flow_run(state.state_details.flow_run_id).state.message
    assert re.search(named, message), message
    assert "validate=False" not in message


def test_the_ui_form_of_the_engine_block_constrains_its_fields():
    schema = CudfPolarsEngine.model_json_schema()["properties"]
    spill = {k: v for branch in schema["spill_device_limit"]["anyOf"] for k, v in branch.items() if k != "type"}
    assert spill.keys() == {"exclusiveMinimum", "pattern"}
    # The form's pattern is the validator's rule: it takes and refuses the texts the block does.
    for text, kept in [("80%", True), ("0.5%", True), ("100%", True), ("60000000000", True), ("0%", False),
                       ("100.5%", False), ("0", False), ("8GB", False), ("-5", False)]:
        assert bool(re.match(spill["pattern"], text)) is kept, text
        if kept:
            assert CudfPolarsEngine(spill_device_limit=text).spill_device_limit == text
        else:
            with pytest.raises(ValidationError, match=f"spill_device_limit='{text}' is not a percentage"):
                CudfPolarsEngine(spill_device_limit=text)
    assert schema["device_memory_resource"]["enum"] == ["async", "pool", "managed", "cuda"]
    for field in ("target_partition_size", "max_rows_per_partition", "teardown_timeout", "dask_connect_timeout"):
        assert "exclusiveMinimum" in str(schema[field]), field


def test_pickling_a_result_for_another_process_is_refused_and_keeps_it(cpu_block, orders):
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders))
        with pytest.raises(HostPersistenceError, match="cannot be pickled or persisted"):
            pickle.dumps(r)
        assert session.collect(r.lazy()).height == 1000
