"""
What the session's artifacts and log lines say, as text: byte counts, the plan excerpt, and the markdown of the
session summary (on the flow run) and of one result (on its task run, with ``result_artifacts``).

Prefect 3.9.1's V1 UI does not wrap table cells and gives a table 708 px of a 1,280 px page: each
table here fits that for the main job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

#: Most characters of a plan in an event or an artifact.
PLAN_LIMIT = 8_000


def format_bytes(value: int | None) -> str:
    """``1,234,567 bytes (1.2 MiB)``; ``"not available"`` for ``None``."""
    return "not available" if value is None else f"{value:,} bytes ({value / 2**20:,.1f} MiB)"


def limited(plan: str) -> str:
    """``plan``, cut to :data:`PLAN_LIMIT` characters (saying how many more there were)."""
    return plan if len(plan) <= PLAN_LIMIT else f"{plan[:PLAN_LIMIT]}\n... ({len(plan) - PLAN_LIMIT:,} more characters)"


def _table(rows: Iterable[Iterable[Any]], head: tuple[str, ...] = ("figure", "value")) -> str:
    """A markdown table: its header, then one line a row."""
    return "".join(f"| {' | '.join(map(str, cells))} |\n" for cells in (head, ("---",) * len(head), *rows))


def result_markdown(result: Any, plan: str, memory: int | None, gpus: list[str]) -> str:
    """The markdown of one result's artifact (``result_artifacts``): where it lives, its size, schema, plan."""
    ranks = ", ".join(f"{r} ({gpus[r]})" if r < len(gpus) else str(r) for r in result.ranks) or "none"
    schema = [(f"`{name}`", f"`{dtype}`") for name, dtype in result.schema.items()]
    fused = "".join(f"* `{s.name}`, deferred by {s.produced_by}\n" for s in result.fused)
    kind = "deferred step (runs fused into the task run that reads it)" if result.deferred else "result"
    figures = [("backend", result.backend), ("ranks (GPUs)", ranks), ("partitions", result.partitions),
               ("rows", "deferred" if result.deferred else result.rows),
               ("bytes", "deferred" if result.deferred else format_bytes(result.bytes)),
               ("engine call", f"{result.engine_seconds:.3f} s"), ("memory in use after", format_bytes(memory)),
               ("result id", f"`{result.id}`")]
    return (f"### cudf-polars {kind} `{result.name}`\n\n{_table(figures)}"
            + (f"\n#### Deferred steps fused in, upstream first\n\n{fused}" if fused else "")
            + f"\n#### Output schema ({len(schema)} columns)\n\n{_table(schema, ('column', 'dtype'))}"
            + f"\n#### Query plan (as the engine ran it)\n\n```\n{plan}\n```\n")


def summary_markdown(summary: dict[str, Any], results: list[dict[str, Any]], unlisted: int,
                     unread: tuple[int, int]) -> str:
    """
    The session summary's markdown: its figures, two tables of ``results`` (:class:`SessionTelemetry`'s rows; and
    ``unlisted`` more), the results moved to host memory; ``unread``: results released unread at the end, their bytes.
    """
    memory, held, spills = summary["memory"], summary["held"], summary["held"]["spills"]
    gpus = ", ".join(f"{n} × {gpu}" if n > 1 else gpu for gpu, n in Counter(summary["gpus"]).items())
    figures = [
        ("backend", summary["backend"]), ("GPUs", gpus or "none (cpu backend)"),
        *((f"results {k.replace('_', ' ')}", v) for k, v in summary["counts"].items()),
        ("peak memory", format_bytes(summary["peak_memory"])),
        *((f"peak memory rank {r}", format_bytes(v)) for r, v in sorted(summary["peak_memory_per_rank"].items())),
        ("memory at start", format_bytes(memory.get("at_start"))), ("memory at the end", format_bytes(memory.get("at_end"))),
        ("held then by unread results", f"{format_bytes(unread[1])}, {unread[0]} result(s)"),
        ("memory measured as", "host store of the cpu backend" if summary["backend"] == "cpu"
         else "device memory rmm has allocated (rmm statistics)"),
        *((k.removesuffix("_s").replace("_", " "), f"{v:.2f} s") for k, v in summary["timings"].items()),
        ("device memory limit", format_bytes(held["limit"]) if held["limit"] else "none"),
        ("peak held by results", format_bytes(held["peak_held"])), ("spill_results", held["spill_results"]),
        ("moved to host memory", f"{spills['results']} result(s), {format_bytes(spills['bytes'])}, {spills['out_seconds']:.3f} s"
         + "".join(f"; {n} by {route}" for route, n in sorted(spills.get("routes", {}).items()))
         + (f"; {spills['on_demand']} on a running query's demand" if spills.get("on_demand") else "")),
        ("read back from host memory", f"{spills['back']} result(s), {format_bytes(spills['back_bytes'])}" + (
            f", {spills['back_seconds']:.3f} s of pinned copies back" if spills.get("back_seconds") else "")),
        ("teardown", summary["teardown"]), ("Dask dashboard", summary.get("dashboard") or "none (no Dask cluster)"),
        ("session id", f"`{summary['session_id']}`"),
    ]
    made = [(f"`{r['name']}`", r["by"], r["state"], "deferred" if r["deferred"] else r["rows"],
             "" if r["bytes"] is None else f"{r['bytes']:,}") for r in results]
    calls = [(f"`{r['name']}`", r["producer"] or "", r["partitions"], f"{r['engine_seconds']:.3f}") for r in results]
    moved = "".join(f"* `{r['name']}`: {r['moved']}\n" for r in results if r.get("moved"))
    return (f"### cudf-polars engine session summary\n\n{_table(figures)}\n*memory at the end* is read just before "
            "the engine's shutdown, which frees what the unread results hold.\n\n"
            f"#### Results ({len(results) + unlisted})\n\n"
            + _table(made, ("result", "produced by task run", "at the end", "rows", "bytes"))
            + "\n#### Each result's task run and engine call\n\n"
            + _table(calls, ("result", "task run id", "partitions", "engine s"))
            + (f"\n... and {unlisted} more (each in its `result.created` event)\n" if unlisted else "")
            + (f"\n#### Moved to host memory (out: the move's seconds)\n\n{moved}" if moved else ""))
