"""
The Prefect artifacts a user reads in the UI instead of the data.

* one markdown artifact per GPU result, on the task run that produced it
  (:func:`result_markdown`): the optimized plan the engine ran, output schema, where
  the result lives (backend, ranks/GPUs, partitions), memory in use after the
  engine call and the call's seconds, and the deferred steps fused into that
  call (names and task run ids);
* one markdown artifact per deferred step, on its task run
  (:func:`deferred_markdown`): its plan and schema, and that it runs fused into
  the task run that reads it;
* one keyed markdown artifact per engine session at its end
  (:func:`summary_markdown`, key from :func:`summary_key`);
* a markdown artifact on a task run whose persistence request was refused
  (:func:`persistence_refusal_markdown`).

Writers never raise: the UI's view of a run must not fail the run.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from prefect_cudf_polars.blocks.backends.result_scans import engine_plan

logger = logging.getLogger("prefect_cudf_polars.artifacts")

#: Most characters of a query plan shown in an artifact.
PLAN_LIMIT = 20_000


def summary_key(flow_name: str) -> str:
    """
    The artifact key of a flow's session summaries: ``<flow-name>-cudf-polars-session``.

    Prefect keys allow lowercase letters, digits and dashes only; other
    characters become dashes. Each flow run adds a version under the key.
    """
    slug = re.sub(r"[^a-z0-9-]+", "-", flow_name.lower()).strip("-") or "flow"
    return f"{slug}-cudf-polars-session"


def format_bytes(value: int | None) -> str:
    """``1,234,567 bytes (1.2 MiB)``; ``"not available"`` for ``None``."""
    if value is None:
        return "not available"
    return f"{value:,} bytes ({value / 2**20:,.1f} MiB)"


def memory_source(backend: str | None) -> str:
    """What the memory figures measure on this backend."""
    if backend == "cpu":
        return "host store of the cpu backend"
    return "device memory rmm has allocated (rmm statistics)"


def query_plan(lf: Any) -> str:
    """
    The optimized plan the engine ran for ``lf``, or why there is none.

    polars' ``explain`` with the optimizations the engines run the plan with
    (:func:`~prefect_cudf_polars.blocks.backends.result_scans.engine_plan`: a
    plan that reads a result's frame runs without slice pushdown). ``explain``
    only plans (no data is read, no result is claimed).
    """
    try:
        plan = engine_plan(lf)
    except Exception as exc:
        return f"(plan not available: {type(exc).__name__}: {exc})"
    if len(plan) > PLAN_LIMIT:
        plan = plan[:PLAN_LIMIT] + f"\n... ({len(plan) - PLAN_LIMIT:,} more characters)"
    return plan


def result_markdown(
    result: Any,
    *,
    plan: str,
    memory_after: int | None,
    gpus: list[str],
) -> str:
    """
    The markdown of a GPU result's artifact.

    Parameters
    ----------
    result : GPUResult
        The result just produced.
    plan
        The optimized plan the engine ran (:func:`query_plan`).
    memory_after
        Bytes in use after the engine call (``EngineSession.memory_in_use()``),
        summed over ranks; ``None`` when unreadable.
    gpus
        Device names of the session's ranks (empty on ``cpu``).
    """
    ranks = ", ".join(
        f"{r} ({gpus[r]})" if r < len(gpus) else str(r) for r in result.ranks
    ) or "none"
    schema = "\n".join(f"| `{name}` | `{dtype}` |" for name, dtype in result.schema.items())
    return (
        f"### cudf-polars result `{result.name}`\n\n"
        "| figure | value |\n|---|---|\n"
        f"| backend | {result.backend} |\n"
        f"| ranks (GPUs) | {ranks} |\n"
        f"| partitions | {result.partitions} |\n"
        f"| engine call | {result.engine_seconds:.3f} s |\n"
        f"| memory in use after | {format_bytes(memory_after)} |\n"
        f"| memory measured as | {memory_source(result.backend)} |\n"
        f"| result id | `{result.id}` |\n\n"
        f"#### Output schema ({len(result.schema)} columns)\n\n"
        "| column | dtype |\n|---|---|\n"
        f"{schema}\n\n"
        f"{fused_section(getattr(result, 'fused', ()))}"
        "#### Query plan (optimized, as the engine ran it)\n\n"
        f"```\n{plan}\n```\n"
    )


def fused_section(fused: Any) -> str:
    """
    The section listing the deferred steps fused into one engine call (empty when none).

    Parameters
    ----------
    fused : sequence of FusedStep
        Names and task runs of the deferred steps, upstream first.
    """
    if not fused:
        return ""
    rows = "\n".join(
        f"| `{step.name}` | {step.produced_by} | `{step.task_run_id or 'none'}` |" for step in fused
    )
    return (
        f"#### Deferred steps fused into this engine call ({len(fused)})\n\n"
        "Their plans ran here, in this task run's one engine call, upstream first.\n\n"
        "| step | deferred by | task run id |\n|---|---|---|\n"
        f"{rows}\n\n"
    )


def collect_markdown(fused: Any, *, engine_seconds: float, rows: int) -> str:
    """
    The markdown of the artifact of a collect whose engine call ran deferred steps.

    Parameters
    ----------
    fused : sequence of FusedStep
        The deferred steps it ran, upstream first.
    engine_seconds
        Seconds the engine call took (wall clock).
    rows
        Rows of the host DataFrame it returned.
    """
    return (
        "### cudf-polars collect\n\n"
        "| figure | value |\n|---|---|\n"
        f"| engine call | {engine_seconds:.3f} s |\n"
        f"| rows returned to the host | {rows:,} |\n\n"
        f"{fused_section(fused)}"
    )


def deferred_markdown(result: Any, *, plan: str) -> str:
    """
    The markdown of a deferred step's artifact.

    Parameters
    ----------
    result : GPUResult
        The deferred result (its ``fused`` lists the deferred steps its plan
        holds, its own last).
    plan
        Its plan, optimized on its own (:func:`query_plan`); its reader's engine
        call optimizes it together with the reader's steps.
    """
    schema = "\n".join(f"| `{name}` | `{dtype}` |" for name, dtype in result.schema.items())
    steps = list(getattr(result, "fused", ()))
    before = ", ".join(f"`{step.name}`" for step in steps[:-1])
    holds = f"Its plan also holds the deferred steps before it: {before}.\n\n" if before else ""
    return (
        f"### cudf-polars deferred step `{result.name}`\n\n"
        "**Deferred: runs fused into the task run that reads it.** Nothing ran on the "
        "engine in this task run: the query's schema was resolved and its plan checked. "
        "The task run that reads this result runs this plan inside its own engine call; "
        "its artifact lists the deferred steps fused into it.\n\n"
        f"{holds}"
        "| figure | value |\n|---|---|\n"
        f"| backend | {result.backend} |\n"
        "| engine call | none (deferred) |\n"
        f"| result id | `{result.id}` |\n\n"
        f"#### Output schema ({len(result.schema)} columns)\n\n"
        "| column | dtype |\n|---|---|\n"
        f"{schema}\n\n"
        "#### Query plan (optimized on its own; its reader runs it fused)\n\n"
        f"```\n{plan}\n```\n"
    )


def summary_markdown(summary: dict[str, Any], *, dashboard: str | None = None) -> str:
    """
    The markdown of a session's summary artifact.

    Parameters
    ----------
    summary
        :meth:`EngineSession.summary` (counts, memory in bytes, timings in seconds)
        with ``peak_memory_per_rank`` (bytes per rank, where the backend reads it).
    dashboard
        The Dask dashboard link, where the backend has one.
    """
    counts = summary["counts"]
    gpus = summary.get("gpus") or []
    per_rank = summary.get("peak_memory_per_rank") or {}
    rows = [
        ("backend", summary.get("backend")),
        ("GPUs", ", ".join(gpus) if gpus else "none (cpu backend)"),
        ("results produced", counts["produced"]),
        ("results consumed", counts["consumed"]),
        ("results released unconsumed", counts["released_unconsumed"]),
        ("peak memory", format_bytes(summary.get("peak_memory"))),
    ]
    for rank, value in sorted(per_rank.items()):
        name = f" ({gpus[rank]})" if rank < len(gpus) else ""
        rows.append((f"peak memory rank {rank}{name}", format_bytes(value)))
    memory = summary.get("memory", {})
    timings = summary.get("timings", {})
    rows += [
        ("memory at start", format_bytes(memory.get("at_start"))),
        ("memory before shutdown", format_bytes(memory.get("before_shutdown"))),
        ("memory measured as", memory_source(summary.get("backend"))),
        ("engine start", f"{timings.get('engine_start_s', 0.0):.2f} s"),
        ("engine shutdown", f"{timings.get('engine_shutdown_s', 0.0):.2f} s"),
        ("Dask dashboard", dashboard or "none (no Dask cluster)"),
        ("session id", f"`{summary.get('session_id')}`"),
    ]
    body = "\n".join(f"| {k} | {v} |" for k, v in rows)
    return f"### cudf-polars engine session summary\n\n| figure | value |\n|---|---|\n{body}\n"


def summary_description(summary: dict[str, Any]) -> str:
    """One line with the summary's key figures (shown on the flow run's Artifacts tab)."""
    counts = summary["counts"]
    return (
        f"cudf-polars engine session ({summary.get('backend')}): results produced "
        f"{counts['produced']}, consumed {counts['consumed']}, released unconsumed "
        f"{counts['released_unconsumed']}; peak memory {format_bytes(summary.get('peak_memory'))}"
    )


def persistence_refusal_markdown(task_name: str, reasons: list[str]) -> str:
    """The markdown of the artifact on a task run whose persistence request was refused."""
    return (
        f"### Result persistence refused: task `{task_name}`\n\n"
        f"The task asks for result persistence ({', '.join(reasons)}), but it returns a "
        "GPU result, which lives in GPU memory of its process and is never written to "
        "result storage. **Nothing was persisted**; the result stays usable in this flow "
        "run.\n\n"
        "What to do: collect the data to the host (the `collect` task or "
        "`gpu_task(collect=True)`) and persist that, or write it to parquet; and drop the "
        "persistence options from this task.\n"
    )


def create_artifact_for(
    markdown: str, *, description: str, flow_run_id: Any, task_run_id: Any, key: str | None = None
) -> None:
    """
    Attach a markdown artifact to a task run (or, with no task run, a flow run) by id.

    Through the client, so it can run on any thread after the task run moved
    on. Never raises: a failure is logged.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import ArtifactCreate

    try:
        with get_client(sync_client=True) as client:
            client.create_artifact(
                artifact=ArtifactCreate(
                    key=key,
                    type="markdown",
                    data=markdown,
                    description=description,
                    flow_run_id=flow_run_id,
                    task_run_id=task_run_id,
                )
            )
    except Exception as exc:  # pragma: no cover - depends on the API being down
        logger.warning("Could not create the artifact %r: %s", description, exc)


def create_run_artifact(markdown: str, *, description: str, key: str | None = None) -> None:
    """
    Attach a markdown artifact to the current task run (or flow run); never raises.

    Outside any Prefect run it does nothing.
    """
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import FlowRunContext, TaskRunContext

    if TaskRunContext.get() is None and FlowRunContext.get() is None:
        return
    try:
        create_markdown_artifact(markdown=markdown, description=description, key=key)
    except Exception as exc:  # pragma: no cover - depends on the API being down
        logger.warning("Could not create the artifact %r: %s", description, exc)


def create_flow_run_artifact(
    flow_run_id: Any, markdown: str, *, key: str, description: str
) -> None:
    """
    Attach a keyed markdown artifact to a flow run by id, through the client; never raises.

    For the session summary: a task runner closes its session after the flow
    run's context is gone, so the run is named explicitly.
    """
    create_artifact_for(
        markdown, description=description, flow_run_id=flow_run_id, task_run_id=None, key=key
    )
