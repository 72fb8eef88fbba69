"""
Subflows and engine sessions (real Prefect API, cpu backend; the GPU cases marked ``gpu``).

Rules checked here:

* a subflow with its own ``CudfPolarsTaskRunner`` gets its own session, closed when the
  subflow run ends, and its flow run ends in a true state;
* ``get_engine_session()`` returns the innermost session: the subflow's inside it (body
  and task threads), the parent's again after it;
* a parent's result passed into such a subflow raises ``WrongEngineError`` naming the
  subflow run, and stays live for the parent;
* a ``GPUResult`` that such a subflow returns was released when the subflow ended;
* a subflow without a runner uses the parent's session, and a result it returns stays live;
* concurrent subflows (``asyncio.gather``) each with a runner each get their own session;
* on a GPU, a subflow whose block equals the parent's shares the parent's engine with its
  own results and teardown; one that asks for a second engine on that GPU gets a clear
  ``SessionError`` naming the subflow.
"""

from __future__ import annotations

import asyncio

import polars as pl
import pytest
from prefect import flow
from prefect.client.orchestration import get_client

from prefect_cudf_polars.blocks import (
    CudfPolarsEngine,
    CudfPolarsTaskRunner,
    SessionError,
    get_engine_session,
)
from prefect_cudf_polars.tasks import (
    GPUResult,
    ResultReleasedError,
    WrongEngineError,
    collect,
    execute,
)

CHILD_RUN = "child-run-with-its-own-engine"


def api_state(state):
    """The flow run's state as the API has it (not the in-process copy)."""
    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id).state


def test_a_subflow_with_its_own_runner_gets_its_own_session_closed_when_it_ends(cpu_block, orders):
    seen = {}

    @flow(flow_run_name=CHILD_RUN, task_runner=CudfPolarsTaskRunner(cpu_block))
    def child() -> int:
        seen["child"] = get_engine_session()
        execute(pl.scan_parquet(orders), name="left in the child")
        return collect(execute(pl.scan_parquet(orders))).height

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def parent():
        seen["parent"] = get_engine_session()
        kept = execute(pl.scan_parquet(orders), name="parent's")
        state = child(return_state=True)
        seen["child_closed_after_it"] = seen["child"].closed
        seen["after"] = get_engine_session()
        return state, collect(kept).height

    state, rows = parent()
    assert api_state(state).is_completed(), api_state(state)
    assert state.result() == 1000 and rows == 1000
    assert seen["child"] is not seen["parent"]
    assert seen["child_closed_after_it"] is True
    assert seen["after"] is seen["parent"]
    assert seen["child"].summary()["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    assert seen["parent"].closed


def test_tasks_of_a_subflow_with_its_own_runner_find_its_session(cpu_block, orders):
    from prefect import task

    @task
    def session_here() -> str:
        return get_engine_session().id

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def child():
        return get_engine_session().id, session_here.submit().result(), session_here()

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def parent():
        ids = child()
        return get_engine_session().id, ids, session_here.submit().result()

    parent_id, (child_body, child_submitted, child_called), parent_task = parent()
    assert child_body == child_submitted == child_called
    assert child_body != parent_id and parent_task == parent_id


def test_a_parents_result_passed_into_a_subflow_with_its_own_runner_names_the_subflow(cpu_block, orders):
    @flow(flow_run_name=CHILD_RUN, task_runner=CudfPolarsTaskRunner(cpu_block))
    def child(r: GPUResult) -> int:
        return collect(r).height

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def parent():
        r = execute(pl.scan_parquet(orders), name="parent's result")
        state = child(r, return_state=True)
        raised = None
        try:
            state.result()
        except WrongEngineError as exc:
            raised = exc
        return state, raised, r.state, collect(r).height

    state, raised, left, rows = parent()
    assert api_state(state).is_failed(), api_state(state)
    assert isinstance(raised, WrongEngineError)
    assert "parent's result" in str(raised) and CHILD_RUN in str(raised), str(raised)
    assert left == "live" and rows == 1000  # the refusal lost nothing


def test_a_gpu_result_a_subflow_with_its_own_runner_returns_was_released_with_its_session(cpu_block, orders):
    @flow(flow_run_name=CHILD_RUN, task_runner=CudfPolarsTaskRunner(cpu_block))
    def child() -> GPUResult:
        return execute(pl.scan_parquet(orders), name="made in the child")

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def parent():
        r = child()
        with pytest.raises(ResultReleasedError, match="when its engine session ended"):
            collect(r)
        return r.state

    assert parent() == "released"


def test_a_subflow_without_a_runner_uses_the_parents_session(cpu_block, orders):
    seen = {}

    @flow
    def child() -> GPUResult:
        seen["child"] = get_engine_session()
        return execute(pl.scan_parquet(orders), name="made in the child")

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    def parent():
        seen["parent"] = get_engine_session()
        r = child()
        return r.state, collect(r).height

    assert parent() == ("live", 1000)
    assert seen["child"] is seen["parent"] and seen["parent"].closed


def test_concurrent_subflows_with_their_own_runners_each_get_their_own_session(cpu_block, orders):
    both_open = asyncio.Barrier(2)

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    async def child(customer: int):
        session = get_engine_session()
        r = execute(pl.scan_parquet(orders).filter(pl.col("customer") == customer), name=f"customer {customer}")
        await both_open.wait()  # both subflow runs hold an open session now
        assert get_engine_session() is session
        return session, collect(r)["customer"].unique().to_list()

    @flow(task_runner=CudfPolarsTaskRunner(cpu_block))
    async def parent():
        outer = get_engine_session()
        (s1, c1), (s2, c2) = await asyncio.gather(child(1), child(2))
        return outer, get_engine_session(), s1, c1, s2, c2

    outer, after, s1, c1, s2, c2 = asyncio.run(parent())
    assert c1 == [1] and c2 == [2]
    assert len({outer.id, s1.id, s2.id}) == 3
    assert after is outer
    assert s1.closed and s2.closed and outer.closed


@pytest.mark.gpu
def test_a_subflow_with_the_parents_gpu_block_shares_its_engine_with_its_own_results(orders):
    block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    seen = {}

    @flow(flow_run_name=CHILD_RUN, task_runner=CudfPolarsTaskRunner(block))
    def child() -> int:
        seen["child"] = get_engine_session()
        execute(pl.scan_parquet(orders), name="left in the child")
        return collect(execute(pl.scan_parquet(orders))).height

    @flow(task_runner=CudfPolarsTaskRunner(block))
    def parent():
        session = seen["parent"] = get_engine_session()
        kept = execute(pl.scan_parquet(orders), name="parent's")
        held = session.memory_in_use()
        assert child() == 1000
        # The child's teardown released only its own results, on the engine the parent still uses.
        seen["parent_memory_after_child"] = (held, session.memory_in_use())
        return collect(kept).height

    assert parent() == 1000
    held, after_child = seen["parent_memory_after_child"]
    assert abs(after_child - held) <= 2**20, (held, after_child)  # rmm bytes: the child's results are gone
    child_summary = seen["child"].summary()
    assert child_summary["counts"] == {"produced": 2, "consumed": 1, "released_unconsumed": 1}
    assert child_summary["teardown"] == "complete"
    assert seen["child"].id != seen["parent"].id


@pytest.mark.gpu
def test_a_subflow_asking_for_a_second_engine_on_the_busy_gpu_gets_a_clear_error(orders):
    parent_block = CudfPolarsEngine(backend="spmd", raise_on_fail=True)
    other_block = CudfPolarsEngine(backend="spmd", raise_on_fail=True, spill_device_limit="50%")

    @flow(flow_run_name=CHILD_RUN, task_runner=CudfPolarsTaskRunner(other_block))
    def child() -> int:
        return collect(execute(pl.scan_parquet(orders))).height

    @flow(task_runner=CudfPolarsTaskRunner(parent_block))
    def parent():
        kept = execute(pl.scan_parquet(orders), name="parent's")
        state = child(return_state=True)
        return state, collect(kept).height

    state, rows = parent()
    assert api_state(state).is_failed(), api_state(state)
    with pytest.raises(SessionError, match=CHILD_RUN):
        state.result()
    assert rows == 1000  # the parent's engine and result are untouched
