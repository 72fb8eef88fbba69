"""The ``execute`` and ``collect`` tasks: one engine call each, on the flow run's session."""

from __future__ import annotations

import polars as pl

from prefect_cudf_polars.blocks import GPUResult
from prefect_cudf_polars.blocks.lineage import Lineage
from prefect_cudf_polars.tasks.calls import EngineCall, query_of
from prefect_cudf_polars.tasks.gpu_task_type import gpu_prefect_task as task
from prefect_cudf_polars.tasks.run_names import collect_run_name, execute_run_name
from prefect_cudf_polars.tasks.task_defaults import gpu_task_defaults, warn_if_persistence_requested


@task(name="cudf-polars-execute", task_run_name=execute_run_name, **gpu_task_defaults())
def execute(query: pl.LazyFrame | GPUResult, name: str | None = None, defer: bool = False) -> GPUResult:
    """
    Run a query on the flow run's engine and keep the result on the GPU.

    Parameters
    ----------
    query : polars.LazyFrame or GPUResult
        The query; a GPUResult is claimed (read once) and run as it is.
    name : str, optional
        Readable name for the result (default: the input result's name, or ``"query"``).
    defer : bool
        Run nothing now: resolve the query's schema, check its plan and return
        a deferred GPUResult holding it, which the task that reads it runs
        fused with its own query in one engine call (see
        :meth:`EngineSession.defer <prefect_cudf_polars.blocks.EngineSession.defer>`).
        Default False.

    Returns
    -------
    GPUResult
        Live, in the session's engine (GPU memory on GPU backends); deferred with ``defer``.

    Raises
    ------
    TypeError
        If ``query`` is neither a LazyFrame nor a GPUResult.
    polars.exceptions.PolarsError, NotImplementedError
        With ``defer``: the schema cannot be resolved (polars' own error, for
        example ``ColumnNotFoundError`` or ``SchemaError``), or the plan is refused.
    NoEngineSessionError
        If the flow run has no engine session.
    ResultReleasedError, ResultConsumedError, WrongEngineError
        If ``query`` is a GPUResult that cannot be read here.
    CannotRecomputeError
        On a retry, if the input the failed attempt read cannot be recomputed
        from its lineage (the task run fails without more retries).
    NotImplementedError
        If cudf-polars cannot run the query on the GPU (the ``cpu`` backend
        refuses the same queries where cudf-polars is installed); nothing ran.
    DeviceMemoryError
        If the engine ran out of device memory; the message names the block
        fields that make it spill or use smaller partitions.
    SessionError
        If the session ended while the query waited for its engine.
    """
    warn_if_persistence_requested()
    lineage = Lineage.of_query(query, deferred=defer)
    with EngineCall(query) as call:
        default = call.args.name if isinstance(call.args, GPUResult) else "query"
        return call.execute(query_of(call.args, task="execute"), name=name or default, lineage=lineage, defer=defer)


@task(name="cudf-polars-collect", task_run_name=collect_run_name, **gpu_task_defaults(returns_gpu_result=False))
def collect(query: pl.LazyFrame | GPUResult) -> pl.DataFrame:
    """
    Run a query on the flow run's engine and return the result on the host.

    Parameters
    ----------
    query : polars.LazyFrame or GPUResult
        The query; a GPUResult is claimed (read once).

    Returns
    -------
    polars.DataFrame
        In host memory.

    Raises
    ------
    TypeError, NoEngineSessionError, ResultReleasedError, ResultConsumedError, WrongEngineError
        As for :func:`execute`.
    CannotRecomputeError, DeviceMemoryError, SessionError
        As for :func:`execute`.
    NotImplementedError
        As for :func:`execute`, unless the block sets ``raise_on_fail=False``:
        then polars' CPU engine runs the query instead.
    """
    with EngineCall(query) as call:
        return call.collect(query_of(call.args, task="collect"))
