"""
Previewing a result: ``head``, ``limit``, ``slice`` and ``tail`` on a result's frame, on every backend.

polars 1.44's slice pushdown moves the row count of ``head``, ``limit`` and
``slice(0, n)`` into the scan that reads a result (a ``register_io_source``
scan), and cudf-polars 26.10 refuses a row limit on such a scan ("A row limit
(head/limit) on a PythonScan source is not supported"). The engine must
therefore get these plans with the row limit above the scan, as a slice, and the
rows must equal polars' on the CPU. Rows are compared as sorted frames: row order
across ranks is not defined.
"""

from __future__ import annotations

import gc

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from api_reads import artifacts_of, task_runs_of
from cudf_polars_import import cudf_polars_or_skip
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.blocks.send_queue import wait_sent
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

#: The preview forms a user writes on ``result.lazy()``.
FORMS = {
    "head": lambda lf: lf.head(5),
    "limit": lambda lf: lf.limit(5),
    "slice(0, 5)": lambda lf: lf.slice(0, 5),
    "slice(3, 5)": lambda lf: lf.slice(3, 5),
    "slice(1, 1)": lambda lf: lf.slice(1, 1),
    "tail": lambda lf: lf.tail(5),
    "with_columns then head": lambda lf: lf.with_columns(double=pl.col("amount") * 2).head(5),
    "filter then head": lambda lf: lf.filter(pl.col("customer") == 3).head(4),
}
#: The forms polars 1.44 pushes into the result's scan as a row limit.
PUSHED = ("head", "limit", "slice(0, 5)", "with_columns then head")


def expected_rows(orders, form) -> pl.DataFrame:
    """The form on polars' CPU engine over the same parquet file."""
    return FORMS[form](pl.scan_parquet(orders)).collect().sort("id")


@gpu_task(name="preview")
def preview(r: GPUResult, form: str) -> pl.LazyFrame:
    return FORMS[form](r.lazy())


def collect_preview(engine: CudfPolarsEngine, orders, form: str) -> tuple[pl.DataFrame, pl.DataFrame, tuple]:
    """In one flow run: collect the form on a result, and collect a gpu_task that returns the form."""

    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        r = execute(pl.scan_parquet(orders), name="orders")
        collected = collect(FORMS[form](r.lazy()))
        chained = collect(preview(execute(pl.scan_parquet(orders), name="orders"), form))
        return collected, chained, get_engine_session().live_results

    return pipeline()


@pytest.mark.parametrize("form", list(FORMS))
def test_preview_forms_on_the_cpu_backend_equal_polars(cpu_block, orders, form):
    collected, chained, live = collect_preview(cpu_block, orders, form)
    assert_frame_equal(collected.sort("id"), expected_rows(orders, form))
    assert_frame_equal(chained.sort("id"), expected_rows(orders, form))
    assert live == ()


def plan_of(flow_run_id, name: str) -> str:
    """The plan the engine ran, in the artifact of the task run ``name`` (the block's ``result_artifacts``)."""
    [artifact] = artifacts_of(task_run_id=task_runs_of(flow_run_id, final=True)[name].id)
    return artifact.data


@pytest.mark.parametrize("form", PUSHED)
def test_the_plan_the_engine_runs_keeps_the_row_limit_out_of_the_results_scan(cpu_block, orders, form):
    """The GPU task run's artifact shows the plan the engine got: a slice above the scan."""

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block.model_copy(update={"result_artifacts": True})))
    def pipeline():
        return collect(preview(execute(pl.scan_parquet(orders), name="orders"), form)).height

    state = pipeline(return_state=True)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    plan = plan_of(flow_run_id, "preview")
    assert "PYTHON SCAN" in plan, plan
    assert "SLICE[offset: 0" in plan, plan
    assert "SLICE: Positive" not in plan, plan


def head_of_a_dropped_result(engine: CudfPolarsEngine, orders) -> pl.DataFrame:
    """``head`` of a result whose handle the caller no longer holds: only its frame does, once the result's events
    (which name it) have been sent."""
    with engine.session() as session:
        lf = FORMS["head"](session.execute(pl.scan_parquet(orders), name="orders").lazy())
        assert wait_sent(60.0)
        gc.collect()
        return session.collect(lf)


def test_a_results_frame_keeps_the_result_alive_until_it_is_read(cpu_block, orders):
    """A frame from ``.lazy()`` holds its result until it is read, as cudf-polars 26.10's frames do."""
    assert_frame_equal(head_of_a_dropped_result(cpu_block, orders).sort("id"), expected_rows(orders, "head"))


def test_a_claimed_result_nobody_can_read_any_more_is_freed_before_its_session_ends(cpu_block, orders):
    """The session keeps neither the handle nor what its frame reads: once both are dropped, the partition goes."""
    with cpu_block.session() as session:
        before = held_partitions()
        lf = session.execute(pl.scan_parquet(orders), name="orders").lazy()
        assert held_partitions() == before + 1
        assert wait_sent(60.0)
        del lf
        gc.collect()
        assert held_partitions() == before


def test_preview_forms_pass_the_gpu_support_check_on_the_cpu_backend(orders):
    """Where cudf-polars can check plans here, the cpu backend checks previews and still runs them."""
    cudf_polars_or_skip()
    engine = CudfPolarsEngine(backend="cpu", raise_on_fail=True)
    for form in FORMS:
        collected, chained, _ = collect_preview(engine, orders, form)
        assert_frame_equal(collected.sort("id"), expected_rows(orders, form))
        assert_frame_equal(chained.sort("id"), expected_rows(orders, form))


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(FORMS))
def test_preview_forms_on_the_gpu_equal_polars_on_the_cpu(orders, form):
    spmd = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    collected, chained, live = collect_preview(spmd, orders, form)
    assert_frame_equal(collected.sort("id"), expected_rows(orders, form), check_dtypes=False)
    assert_frame_equal(chained.sort("id"), expected_rows(orders, form), check_dtypes=False)
    assert live == ()


@pytest.mark.gpu
def test_a_results_frame_keeps_the_result_alive_on_the_gpu(orders):
    spmd = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    got = head_of_a_dropped_result(spmd, orders)
    assert_frame_equal(got.sort("id"), expected_rows(orders, "head"), check_dtypes=False)


#: Reads of a result that need none of its columns (a zero-column projection of its scan).
ZERO_COLUMN_READS = {
    "row index only": lambda lf: lf.with_row_index().select("index"),
    "a literal": lambda lf: lf.select(pl.lit(1)),
    "SQL count(*)": lambda lf: pl.SQLContext(t=lf).execute("select count(*) from t"),
}


@gpu_task(name="zero-column-read", collect=True)
def zero_column_read(r: GPUResult, form: str) -> pl.LazyFrame:
    return ZERO_COLUMN_READS[form](r.lazy())


def collect_zero_column_read(engine: CudfPolarsEngine, orders, form: str):
    """A flow run whose GPU task collects a zero-column read of a result; its state and session."""
    seen = {}

    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        seen["session"] = get_engine_session()
        return zero_column_read(execute(pl.scan_parquet(orders), name="orders"), form)

    return pipeline(return_state=True), seen["session"]


def count_rows(engine: CudfPolarsEngine, orders) -> int:
    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        return collect(execute(pl.scan_parquet(orders), name="orders").lazy().select(pl.len())).item()

    return pipeline()


def assert_refused_before_the_engine_ran(state, session) -> None:
    """The read failed with the zero-column error (not an engine's error) and left nothing behind."""
    assert state.is_failed(), state
    # polars' engine would have wrapped an error of the scan in a ComputeError.
    with pytest.raises(NotImplementedError, match=r"(?s)zero-column.*select\(pl\.len\(\)\)"):
        state.result()
    assert session.live_results == ()
    assert session.summary()["counts"] == {"produced": 1, "consumed": 1, "released_unconsumed": 0}
    assert session.summary()["engine_calls"] == 1  # the execute: a plan refused while planning is no engine call


@pytest.mark.parametrize("form", list(ZERO_COLUMN_READS))
def test_a_zero_column_read_of_a_result_is_refused_before_the_engine_runs(cpu_block, orders, form):
    """As cudf-polars 26.10 refuses a zero-column projection of a persisted result; the message names what works."""
    state, session = collect_zero_column_read(cpu_block, orders, form)
    assert_refused_before_the_engine_ran(state, session)
    assert session.summary()["memory"]["at_end"] == 0  # the claimed result was freed


def test_counting_a_results_rows_reads_one_column_and_runs(cpu_block, orders):
    assert count_rows(cpu_block, orders) == 1000


@pytest.mark.gpu
@pytest.mark.parametrize("form", list(ZERO_COLUMN_READS))
def test_a_zero_column_read_of_a_result_is_refused_on_the_gpu_too(orders, form):
    state, session = collect_zero_column_read(CudfPolarsEngine(backend="spmd", raise_on_fail=True), orders, form)
    assert_refused_before_the_engine_ran(state, session)


@pytest.mark.gpu
def test_counting_a_results_rows_runs_on_the_gpu(orders):
    assert count_rows(CudfPolarsEngine(backend="spmd", raise_on_fail=True), orders) == 1000


def largest_customers(lf: pl.LazyFrame) -> pl.LazyFrame:
    """A row limit that stops above the result's scan: the 3 customers with the most spent (a top-k)."""
    return lf.group_by("customer").agg(spent=pl.col("amount").sum()).sort(["spent", "customer"], descending=True).head(3)


@gpu_task(name="largest-customers")
def top_customers(r: GPUResult) -> pl.LazyFrame:
    return largest_customers(r.lazy())


def collect_top_customers(engine: CudfPolarsEngine, orders) -> tuple[pl.DataFrame, object]:
    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline():
        return collect(top_customers(execute(pl.scan_parquet(orders), name="orders")))

    state = pipeline(return_state=True)
    return state.result(), state.state_details.flow_run_id


def test_a_row_limit_above_the_results_scan_keeps_slice_pushdown(orders):
    """A sort then head after an aggregation runs as polars' top-k sort, as bare cudf-polars runs it."""
    # Checked as the GPU would, where cudf-polars is installed; the artifact shows the plan the engine ran.
    engine = CudfPolarsEngine(backend="cpu", raise_on_fail=True, result_artifacts=True)
    got, flow_run_id = collect_top_customers(engine, orders)
    assert_frame_equal(got, largest_customers(pl.scan_parquet(orders)).collect())
    plan = plan_of(flow_run_id, "largest-customers")
    assert "SORT BY [slice: (0, 3" in plan, plan  # top-k: the limit inside the sort
    assert "SLICE[offset" not in plan and "SLICE: Positive" not in plan, plan


@pytest.mark.gpu
def test_a_row_limit_above_the_results_scan_runs_on_the_gpu(orders):
    got, _ = collect_top_customers(CudfPolarsEngine(backend="spmd", raise_on_fail=True), orders)
    assert_frame_equal(got, largest_customers(pl.scan_parquet(orders)).collect(), check_dtypes=False)


#: Plans over a result's frame, and whether polars would push their row limit into a scan.
LIMIT_FORMS = {
    "head": (lambda lf: lf.head(2), True),
    "select then head": (lambda lf: lf.select("id").head(2), True),
    "head then filter on a literal with a newline": (lambda lf: lf.head(2).filter(pl.col("note") == "x\ny"), True),
    "concat then head": (
        lambda lf: pl.concat([lf.select(pl.col("id").cast(pl.Int64)), pl.LazyFrame({"id": [-1]})]).head(2), True
    ),
    "first": (lambda lf: lf.first(), True),
    "SQL LIMIT": (lambda lf: pl.SQLContext(t=lf).execute("select id from t limit 2"), True),
    "sort then head (top-k)": (lambda lf: lf.sort("amount").head(2), False),
    "aggregate, sort, head": (lambda lf: largest_customers(lf), False),
    "tail": (lambda lf: lf.tail(2), False),
    "filter then head": (lambda lf: lf.filter(pl.col("amount") > 1).head(2), False),
}


@pytest.mark.parametrize("form", list(LIMIT_FORMS))
def test_slice_pushdown_is_off_exactly_where_a_limit_would_reach_a_results_scan(cpu_block, orders, form):
    from prefect_cudf_polars.blocks.backends.plans import prepare

    build, pushed = LIMIT_FORMS[form]
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders).with_columns(note=pl.lit("x\ny")), name="orders")
        lf = build(r.lazy())
        assert prepare(lf)[0].slice_pushdown is not pushed, lf.explain()
        expected = build(pl.scan_parquet(orders).with_columns(note=pl.lit("x\ny"))).collect()
        assert_frame_equal(session.collect(lf).sort(expected.columns), expected.sort(expected.columns))
