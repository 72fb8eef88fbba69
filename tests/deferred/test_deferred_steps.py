"""
Deferred steps on the cpu backend: checked in their own task run, run fused in their reader's.

Every flow here runs against Prefect's local API and reads real parquet files;
task run states, artifacts and events are read back through the API.
"""

from __future__ import annotations

import time

import polars as pl
import pytest
from polars.exceptions import ColumnNotFoundError
from polars.testing import assert_frame_equal
from prefect import flow

from api_reads import artifacts_of, events_of, related_ids, task_runs_of
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks import telemetry as ev
from prefect_cudf_polars.tasks import (
    GPUResult,
    ResultConsumedError,
    WrongEngineError,
    collect,
    execute,
    gpu_task,
    tee,
)


def runner(**fields) -> CudfPolarsTaskRunner:
    return CudfPolarsTaskRunner(CudfPolarsEngine(backend="cpu", **fields))


def big_orders(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().filter(pl.col("amount") > 50)


def doubled(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().with_columns((pl.col("amount") * 2).alias("double"))


def narrowed_ids(r: GPUResult) -> pl.LazyFrame:
    """The schema resolves; the engine call fails: ids up to 999 do not fit in UInt8."""
    return r.lazy().with_columns(pl.col("id").cast(pl.UInt8, strict=True))


def totals(r: GPUResult) -> pl.LazyFrame:
    return r.lazy().group_by("customer").agg(pl.col("double").sum(), pl.len().alias("n")).sort("customer")


def expected_totals(orders) -> pl.DataFrame:
    return totals_of(pl.scan_parquet(orders)).collect()


def totals_of(lf: pl.LazyFrame) -> pl.LazyFrame:
    lf = lf.filter(pl.col("amount") > 50).with_columns((pl.col("amount") * 2).alias("double"))
    return lf.group_by("customer").agg(pl.col("double").sum(), pl.len().alias("n")).sort("customer")


def runs_of(flow_run_id, *names: str, timeout: float = 30.0) -> dict:
    """The flow run's task runs by name, once each of ``names`` is there in a final state."""
    deadline = time.monotonic() + timeout
    while True:
        runs = task_runs_of(flow_run_id, expect=len(names), timeout=timeout)
        done = all(n in runs and runs[n].state is not None and runs[n].state.is_final() for n in names)
        if done or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def run(pipeline):
    state = pipeline(return_state=True)
    assert state.is_completed(), state
    return state.result(), state.state_details.flow_run_id


#: The task runs of :func:`chain`.
CHAIN_RUNS = ("orders", "big-orders", "doubled", "totals", "collect-totals")


def chain(orders, *, defer: bool):
    """scan -> big_orders -> doubled -> totals, every step but the last deferred when ``defer``."""
    big = gpu_task(name="big-orders", defer=defer)(big_orders)
    double = gpu_task(name="doubled", defer=defer)(doubled)
    total = gpu_task(name="totals")(totals)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        scanned = execute(pl.scan_parquet(orders), name="orders", defer=defer)
        return collect(total(double(big(scanned)))), session

    return pipeline


def test_a_fused_chain_gives_the_rows_of_the_materialized_chain_in_one_engine_call(orders):
    (fused, fused_session), _ = run(chain(orders, defer=True))
    (plain, plain_session), _ = run(chain(orders, defer=False))
    assert_frame_equal(fused, plain)
    assert_frame_equal(fused, expected_totals(orders))
    # Deferred: the scan, filter and column steps ran inside `totals`' engine call; then collect.
    assert fused_session.summary()["engine_calls"] == 2
    assert plain_session.summary()["engine_calls"] == 5
    assert fused_session.summary()["counts"] == {"produced": 4, "consumed": 4, "released_unconsumed": 0}
    assert fused_session.summary()["memory"]["at_end"] == fused_session.summary()["memory"]["at_start"]


def test_a_bad_column_fails_in_the_deferring_task_run(orders):
    @gpu_task(name="bad-step", defer=True)
    def bad_step(path: str) -> pl.LazyFrame:
        return pl.scan_parquet(path).select(pl.col("no_such_column"))

    @gpu_task(name="reader")
    def reader(r: GPUResult) -> pl.LazyFrame:
        return r.lazy()

    seen = {}

    @flow(task_runner=runner())
    def pipeline():
        seen["session"] = get_engine_session()
        return reader(bad_step(str(orders)))

    state = pipeline(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(ColumnNotFoundError, match="no_such_column"):
        state.result()
    runs = runs_of(state.state_details.flow_run_id, "bad-step")
    assert runs["bad-step"].state.is_failed()
    assert "reader" not in runs or not runs["reader"].state.is_completed()
    summary = seen["session"].summary()
    assert summary["engine_calls"] == 0 and summary["counts"]["produced"] == 0


@pytest.mark.filterwarnings("ignore::polars.exceptions.PolarsInefficientMapWarning")
def test_a_deferred_plan_the_gpu_would_refuse_fails_in_the_deferring_task_run(orders):
    pytest.importorskip("cudf_polars", reason="the GPU-support check needs cudf-polars importable")

    @gpu_task(name="python-udf", defer=True)
    def python_udf(path: str) -> pl.LazyFrame:
        return pl.scan_parquet(path).select(
            pl.col("amount").map_elements(lambda v: v * 2, return_dtype=pl.Float64)
        )

    seen = {}

    @flow(task_runner=runner(raise_on_fail=True))
    def pipeline():
        seen["session"] = get_engine_session()
        return collect(python_udf(str(orders)))

    state = pipeline(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(NotImplementedError, match=r"(?s)GPU.*anonymousfunction"):
        state.result()
    assert runs_of(state.state_details.flow_run_id, "python-udf")["python-udf"].state.is_failed()
    assert seen["session"].summary()["engine_calls"] == 0


def test_a_deferred_result_never_read_runs_nothing_and_frees_its_inputs(orders):
    later = gpu_task(name="later", defer=True)(big_orders)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        before = session.memory_in_use()
        scanned = execute(pl.scan_parquet(orders), name="orders")
        held = session.memory_in_use()
        unread = later(scanned)
        kept = session.memory_in_use()
        unread.release()
        return session, unread, scanned, (before, held, kept, session.memory_in_use())

    (session, unread, scanned, (before, held, kept, after)), _ = run(pipeline)
    assert held > before and kept == held  # the deferred step holds its input's partitions
    assert after == before
    assert unread.state == "released" and scanned.state == "consumed" and scanned.persisted is None
    summary = session.summary()
    assert summary["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    assert summary["engine_calls"] == 1  # the scan; the deferred step ran nothing


def test_a_deferred_result_left_unread_is_released_unconsumed_at_session_end(orders):
    later = gpu_task(name="later", defer=True)(big_orders)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        unread = later(execute(pl.scan_parquet(orders), name="orders"))
        return session, unread

    before = held_partitions()
    (session, unread), _ = run(pipeline)
    assert unread.state == "released" and not unread.holding and unread.held_inputs == ()
    summary = session.summary()
    assert summary["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    # The deferred step held its input's partition until the end; the end released it.
    assert summary["memory"]["at_end"] > summary["memory"]["at_start"]
    assert held_partitions() == before


def test_a_failed_reader_frees_what_the_deferred_step_held(orders):
    later = gpu_task(name="later", defer=True)(big_orders)
    narrowing_reader = gpu_task(name="narrowing-reader")(narrowed_ids)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        before = session.memory_in_use()
        d = later(execute(pl.scan_parquet(orders), name="orders"))
        state = narrowing_reader(d, return_state=True)
        return state, before, session.memory_in_use(), session

    (state, before, after, session), _ = run(pipeline)
    assert state.is_failed(), state
    with pytest.raises(pl.exceptions.InvalidOperationError, match="UInt8"):
        state.result()
    assert after == before
    assert session.summary()["counts"] == {"produced": 2, "consumed": 2, "released_unconsumed": 0}


def test_a_failed_fused_engine_call_names_the_deferred_steps_it_ran(orders):
    wide = gpu_task(name="wide-orders", defer=True)(big_orders)
    failing_reader = gpu_task(name="failing-reader")(narrowed_ids)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        return failing_reader(wide(execute(pl.scan_parquet(orders), name="orders")), return_state=True), session

    (state, _session), _ = run(pipeline)
    assert state.is_failed(), state
    with pytest.raises(pl.exceptions.InvalidOperationError, match="UInt8") as raised:
        state.result()
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1, notes
    assert "with 1 deferred step(s) fused in" in notes[0] and "'wide-orders' (task run 'wide-orders'" in notes[0], notes


def test_a_deferred_result_read_by_another_session_is_refused_and_stays_live(orders):
    """A subflow with its own runner has its own session: the parent's deferred step is not run there."""
    wide = gpu_task(name="wide-orders", defer=True)(big_orders)
    read_it = gpu_task(name="read-it")(doubled)

    @flow(task_runner=runner())
    def child(r: GPUResult) -> int:
        return collect(read_it(r)).height

    @flow(task_runner=runner())
    def parent():
        session = get_engine_session()
        d = wide(execute(pl.scan_parquet(orders), name="orders"))
        with pytest.raises(WrongEngineError, match=r"'wide-orders'.*subflow run '.*' has its own engine session"):
            child(d)
        still = (d.state, d.deferred)
        return still, collect(d).height, session

    (still, rows, session), _ = run(parent)
    assert still == ("live", True)  # nothing claimed, nothing run: the parent reads it after
    assert rows == pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect().height
    summary = session.summary()
    assert summary["counts"]["released_unconsumed"] == 0
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"]


def test_a_deferred_result_is_read_once(orders):
    later = gpu_task(name="later", defer=True)(big_orders)
    first = gpu_task(name="first-reader")(doubled)
    second = gpu_task(name="second-reader")(doubled)

    @flow(task_runner=runner())
    def pipeline():
        d = later(execute(pl.scan_parquet(orders), name="orders"))
        collect(first(d))
        return second(d)

    state = pipeline(return_state=True)
    assert state.is_failed(), state
    with pytest.raises(ResultConsumedError, match=r"(?s)'later'.*already consumed by task run 'first-reader'.*tee"):
        state.result()


def test_a_retried_reader_replays_the_deferred_steps(orders):
    calls = {"big": 0, "reader": 0}

    @gpu_task(name="big-orders", defer=True)
    def big(r: GPUResult) -> pl.LazyFrame:
        calls["big"] += 1
        return big_orders(r)

    @gpu_task(name="flaky-reader", retries=1, retry_delay_seconds=0)
    def flaky_reader(r: GPUResult) -> pl.LazyFrame:
        calls["reader"] += 1
        lf = doubled(r)
        if calls["reader"] == 1:
            raise OSError("transient failure after the claim")
        return lf

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        return collect(totals_reader(flaky_reader(big(execute(pl.scan_parquet(orders), name="orders"))))), session

    totals_reader = gpu_task(name="totals")(totals)
    (got, session), _ = run(pipeline)
    assert_frame_equal(got, expected_totals(orders))
    assert calls == {"big": 2, "reader": 2}  # the retry replayed the deferred step's lineage
    summary = session.summary()
    assert summary["counts"]["released_unconsumed"] == 0
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"]


def test_a_replayed_deferred_step_still_names_the_task_run_that_deferred_it(orders):
    """A retry (in the reader's task run) and a tee copy (in the flow run) replay the steps; they stay their producers'."""
    attempts = []
    big = gpu_task(name="big-orders", defer=True)(big_orders)
    double = gpu_task(name="doubled", defer=True)(doubled)
    big_for_tee = gpu_task(name="big-orders-tee", defer=True)(big_orders)

    @gpu_task(name="flaky-reader", retries=1, retry_delay_seconds=0)
    def flaky_reader(r: GPUResult) -> pl.LazyFrame:
        attempts.append(1)
        lf = r.lazy().filter(pl.col("double") > 0)  # claims r: the retry must replay both steps
        if len(attempts) == 1:
            raise OSError("transient failure after the claim")
        return lf

    @flow(task_runner=runner())
    def pipeline():
        doubled_orders = double(big(execute(pl.scan_parquet(orders), name="orders")))
        original = doubled_orders.fused  # big-orders' step, then doubled's own
        read = flaky_reader(doubled_orders)
        first, second = tee(big_for_tee(execute(pl.scan_parquet(orders), name="orders-tee")), 2)
        copies = (first.deferred_step, second.deferred_step)
        collect(first), collect(second)
        return original, read.fused, copies, collect(read)

    (original, fused, (first, second), got), flow_run_id = run(pipeline)
    runs = runs_of(flow_run_id, "big-orders", "doubled", "big-orders-tee")
    assert len(attempts) == 2
    assert [(step.name, step.task_run_id) for step in original] == [
        ("big-orders", str(runs["big-orders"].id)),
        ("doubled", str(runs["doubled"].id)),
    ]
    # Replayed in flaky-reader's retry (doubled's lineage replaying big-orders' first): still theirs.
    assert fused == original
    assert first.task_run_id == str(runs["big-orders-tee"].id)
    assert second == first  # the copy replayed in the flow run names the same task run
    assert got.height == pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect().height


def test_a_failed_engine_call_holding_a_session_error_gets_no_fused_step_note():
    """The session ended: the note would blame steps that did not fail, so none is added."""
    from prefect_cudf_polars.blocks.errors import SessionError
    from prefect_cudf_polars.blocks.deferred import FusedStep
    from prefect_cudf_polars.blocks.deferred import fused_note as _fused_note

    steps = (FusedStep("wide-orders", "task run 'wide-orders'", None),)
    ended = SessionError("the engine session has ended")
    caused = RuntimeError("engine call failed")
    caused.__cause__ = ended
    assert _fused_note(ended, steps) is None
    assert _fused_note(ExceptionGroup("engine", [ended]), steps) is None
    assert _fused_note(caused, steps) is None
    assert _fused_note(ValueError("bad cast"), ()) is None
    note = _fused_note(ValueError("bad cast"), steps)
    assert note is not None and "1 deferred step(s) fused in" in note and "'wide-orders'" in note


def test_tee_of_a_deferred_result_gives_deferred_copies_that_each_run_the_plan(orders):
    calls = []

    @gpu_task(name="big-orders", defer=True)
    def big(r: GPUResult) -> pl.LazyFrame:
        calls.append(1)
        return big_orders(r)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        a, b = tee(big(execute(pl.scan_parquet(orders), name="orders")), 2)
        deferred = (a.deferred, b.deferred)
        return collect(a), collect(b.lazy().select(pl.len())), deferred, session

    (first, count, deferred, session), _ = run(pipeline)
    expected = pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect()
    assert_frame_equal(first, expected)
    assert count.item() == expected.height
    assert deferred == (True, True)
    assert len(calls) == 2  # the second copy replays the deferred step
    summary = session.summary()
    assert summary["counts"]["released_unconsumed"] == 0
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"]


def summary_rows(flow_run_id, flow_name: str) -> dict[str, list[str]]:
    """The rows of the flow run's session summary "Results" table, by result name (its cells)."""
    [summary] = artifacts_of(flow_run_id=flow_run_id, key=ev.summary_key(flow_name))
    table = summary.data[summary.data.index("#### Results"):].split("\n\n")[1]  # its table, up to the next blank line
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0].strip("`"): row[1:] for row in cells}


def test_with_result_artifacts_the_readers_artifact_lists_the_fused_steps_and_each_deferred_step_says_so(orders):
    big = gpu_task(name="big-orders", defer=True)(big_orders)
    double = gpu_task(name="doubled", defer=True)(doubled)
    total = gpu_task(name="totals")(totals)

    @flow(name="fused-chain", task_runner=runner(result_artifacts=True))
    def pipeline():
        return collect(total(double(big(execute(pl.scan_parquet(orders), name="orders", defer=True)))))

    df, flow_run_id = run(pipeline)
    assert_frame_equal(df, expected_totals(orders))
    runs = runs_of(flow_run_id, *CHAIN_RUNS)
    steps = [f"* `{s}`, deferred by task run '{s}' (id {runs[s].id})" for s in ("orders", "big-orders", "doubled")]
    [reader] = artifacts_of(task_run_id=runs["totals"].id)
    assert "### cudf-polars result `totals`" in reader.data
    assert "#### Deferred steps fused in, upstream first" in reader.data
    # Each fused step with the task run that deferred it, upstream first.
    assert all(step in reader.data for step in steps), reader.data
    assert reader.data.index(steps[0]) < reader.data.index(steps[1]) < reader.data.index(steps[2])
    # The plan as it ran: the whole chain fused, the filter pushed into the parquet scan.
    plan = reader.data[reader.data.index("#### Query plan"):]
    assert "Parquet SCAN" in plan and 'SELECTION: col("amount") > 50.0' in plan and "AGGREGATE" in plan
    assert f"| rows | {df.height} |" in reader.data
    for step in ("orders", "big-orders", "doubled"):
        [own] = artifacts_of(task_run_id=runs[step].id)
        assert f"### cudf-polars deferred step (runs fused into the task run that reads it) `{step}`" in own.data
        assert "| ranks (GPUs) | none |" in own.data and "| partitions | 0 |" in own.data
    [doubled_step] = artifacts_of(task_run_id=runs["doubled"].id)
    assert "| `double` | `Float64` |" in doubled_step.data
    # The flow run's summary says which results were deferred steps.
    rows = summary_rows(flow_run_id, "fused-chain")
    assert {name: cells[2] for name, cells in rows.items()} == {
        "orders": "deferred", "big-orders": "deferred", "doubled": "deferred", "totals": str(df.height),
    }
    assert all(cells[1] == "consumed" for cells in rows.values())


def test_result_created_events_say_deferred_and_name_the_fused_steps(orders):
    (_, _), flow_run_id = run(chain(orders, defer=True))
    found = events_of(flow_run_id, expect={ev.RESULT_CREATED: 4, ev.RESULT_CONSUMED: 4})
    created = {e.payload["name"]: e.payload for e in found if e.event == ev.RESULT_CREATED}
    assert {name: p["deferred"] for name, p in created.items()} == {
        "orders": True, "big-orders": True, "doubled": True, "totals": False,
    }
    runs = runs_of(flow_run_id, *CHAIN_RUNS)
    assert created["totals"]["fused_steps"] == [
        {"name": step, "produced_by": f"task run '{step}' (id {runs[step].id})", "task_run_id": str(runs[step].id)}
        for step in ("orders", "big-orders", "doubled")
    ]
    consumed = {e.payload["name"]: e.payload for e in found if e.event == ev.RESULT_CONSUMED}
    assert consumed["doubled"]["deferred"] is True and consumed["totals"]["deferred"] is False


def test_session_collect_of_a_deferred_result_runs_one_engine_call(orders):
    later = gpu_task(name="later", defer=True)(big_orders)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        d = later(execute(pl.scan_parquet(orders), name="orders", defer=True))
        df = session.collect(d)
        return df, session.summary()["engine_calls"], session.memory_in_use(), session.memory["at_start"]

    (df, calls, memory, at_start), _ = run(pipeline)
    assert_frame_equal(df, pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect())
    assert calls == 1 and memory == at_start


def test_a_collecting_step_cannot_be_deferred():
    with pytest.raises(ValueError, match=r"collect=True, defer=True.*Defer the steps before it"):
        gpu_task(collect=True, defer=True)


def test_a_collecting_task_run_is_named_the_reader_of_the_deferred_step_it_ran(orders):
    big = gpu_task(name="big-orders", defer=True)(big_orders)
    collect_doubled = gpu_task(name="collect-doubled", collect=True)(doubled)

    @flow(name="collect-deferred", task_runner=runner())
    def pipeline():
        return collect_doubled(big(execute(pl.scan_parquet(orders), name="orders", defer=True)))

    df, flow_run_id = run(pipeline)
    expected = pl.scan_parquet(orders).filter(pl.col("amount") > 50).with_columns(
        (pl.col("amount") * 2).alias("double")
    ).collect()
    assert_frame_equal(df, expected)
    runs = runs_of(flow_run_id, "orders", "big-orders", "collect-doubled")
    found = events_of(flow_run_id, expect={ev.RESULT_CONSUMED: 2, ev.ENGINE_STOPPED: 1})
    consumed = {e.payload["name"]: e for e in found if e.event == ev.RESULT_CONSUMED}
    # The collecting task run claimed the last deferred step; that step claimed the first.
    reader = consumed["big-orders"]
    assert reader.payload["deferred"] is True
    assert reader.payload["consumed_by"] == f"task run 'collect-doubled' (id {runs['collect-doubled'].id})"
    assert related_ids(reader, "producer") == [f"prefect.task-run.{runs['big-orders'].id}"]
    assert consumed["orders"].payload["consumed_by"] == f"task run 'big-orders' (id {runs['big-orders'].id})"
    # A collect produces no result: the summary lists the two deferred steps, both read.
    rows = summary_rows(flow_run_id, "collect-deferred")
    assert {name: (cells[1], cells[2]) for name, cells in rows.items()} == {
        "orders": ("consumed", "deferred"), "big-orders": ("consumed", "deferred"),
    }


def test_sink_parquet_of_a_deferred_result_runs_the_plan_and_frees_what_it_held(orders, tmp_path):
    from prefect_cudf_polars.tasks import sink_parquet

    later = gpu_task(name="later", defer=True)(big_orders)
    target = tmp_path / "big-orders"

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        summary = sink_parquet(later(execute(pl.scan_parquet(orders), name="orders")), str(target))
        return summary, session

    (summary, session), _ = run(pipeline)
    expected = pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect()
    assert summary.rows == expected.height
    assert_frame_equal(pl.read_parquet(summary.files).sort("id"), expected.sort("id"))
    counts = session.summary()
    assert counts["engine_calls"] == 2  # the scan, then the sink with the deferred step in it
    assert counts["counts"] == {"produced": 2, "consumed": 2, "released_unconsumed": 0}
    assert counts["memory"]["at_end"] == counts["memory"]["at_start"]


def test_a_task_refused_an_input_a_deferred_step_holds_leaves_it_to_the_reader(orders):
    """A task given a result another run claimed fails; the deferred step's reader still reads it."""
    later = gpu_task(name="later", defer=True)(big_orders)
    other = gpu_task(name="other")(doubled)

    @flow(task_runner=runner())
    def pipeline():
        session = get_engine_session()
        scanned = execute(pl.scan_parquet(orders), name="orders")
        held = later(scanned)
        refused = [
            other(scanned, return_state=True),
            execute(scanned, return_state=True),
            collect(scanned, return_state=True),
        ]
        rows = collect(held)
        return refused, rows, session

    (refused, rows, session), _ = run(pipeline)
    for state in refused:
        assert state.is_failed(), state
        with pytest.raises(ResultConsumedError, match="orders"):
            state.result()
    assert_frame_equal(rows, pl.scan_parquet(orders).filter(pl.col("amount") > 50).collect())
    summary = session.summary()
    assert summary["memory"]["at_end"] == summary["memory"]["at_start"], summary["memory"]
    assert summary["counts"] == {"produced": 2, "consumed": 2, "released_unconsumed": 0}, summary["counts"]
