"""
``results.md``: the results of ``results.json`` as markdown tables, and the summary a command prints last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.chart import chart
from benchmarks.figures import (
    VARIANTS, fmt, fmt_ci, measurement, median, overhead, per_step_ms, pipelines_of, ratio, scale_factors,
)
from benchmarks.goals import goals_markdown
from benchmarks.many_tasks import FLOW_FIGURES
from benchmarks.task_overhead import DIFFERENCES, TIMERS

RATIOS = (("a", "b"), ("b", "c"), ("a", "c"), ("d", "a"), ("g", "a"))


def table(head: list[str], rows: list[list[Any]], *, text_columns: int = 1) -> list[str]:
    """A markdown table; the first ``text_columns`` columns align left, the others right."""
    align = ["---"] * text_columns + ["---:"] * (len(head) - text_columns)
    return [f"| {' | '.join(head)} |", f"|{'|'.join(align)}|", *(f"| {' | '.join(map(str, r))} |" for r in rows)]


def _cell(doc: dict[str, Any], sf: str, p: str, v: str) -> str:
    m = measurement(doc, sf, p, v)
    if m is None or m["status"] != "ok":
        return "—" if m is None else m["status"]
    return fmt(m["median_s"]) + (" (cut)" if m["cut_short"] else "")


def _match(doc: dict[str, Any], sf: str, p: str) -> str:
    checked = [m for m in doc["measurements"] if (m["scale_factor"], m["pipeline"]) == (sf, p)
               and "matches_reference" in m]
    wrong = [m["variant"] for m in checked if not m["matches_reference"]]
    return "—" if not checked else f"**no**: {', '.join(wrong)}" if wrong else "yes"


def side_by_side(doc: dict[str, Any], sf: str) -> list[str]:
    """Medians of every variant (seconds) and their ratios, one row per pipeline; then the per-step differences (ms)."""
    head = ["pipeline", *(short for short, _ in VARIANTS.values()), *(f"{x}/{y}" for x, y in RATIOS), "results match"]
    rows = [
        [p, *(_cell(doc, sf, p, v) for v in VARIANTS), *(fmt(ratio(doc, sf, p, x, y), 2) for x, y in RATIOS),
         _match(doc, sf, p)]
        for p in pipelines_of(doc)
    ]
    steps = []
    for p in pipelines_of(doc):
        a, h = measurement(doc, sf, p, "a"), measurement(doc, sf, p, "h")
        by_step = "—"
        if a and h and a.get("steps_median_s") and h.get("steps_median_s"):
            h_steps = h["steps_median_s"]
            by_step = ", ".join(f"{k} {(v - h_steps[k]) * 1000:.2f}" for k, v in a["steps_median_s"].items())
        diffs = [fmt(per_step_ms(doc, sf, p, x, y), 2) for x, y in (("a", "h"), ("h", "b"), ("a", "b"))]
        steps.append([p, *diffs, by_step])
    return [
        *table(head, rows), "", "Per step (ms, difference of the medians over the steps):", "",
        *table(["pipeline", "(a) − (h)", "(h) − (b): Prefect", "(a) − (b)", "(a) − (h) by step"], steps),
    ]


def peer(doc: dict[str, Any]) -> list[str]:
    """(g) per scale factor and pipeline: with and without the default cache policy's hashing, over (a)."""
    rows = []
    for sf in scale_factors(doc):
        for p in pipelines_of(doc):
            g, g0 = median(doc, sf, p, "g"), median(doc, sf, p, "g-nocache")
            if g is not None and g0 is not None:
                rows.append([sf, p, fmt(g), fmt(g0), fmt(g - g0), fmt(ratio(doc, sf, p, "g", "a"), 1),
                             fmt(ratio(doc, sf, p, "g-nocache", "a"), 1)])
    head = ["SF", "pipeline", "(g) s", "(g) NO_CACHE s", "hashing s", "(g)/(a)", "(g) NO_CACHE/(a)"]
    return table(head, rows, text_columns=2) if rows else []


def profile(p: dict[str, Any], top: int = 8) -> list[str]:
    """A :class:`~benchmarks.profiling.StackSampler` report: busy thread-seconds by thread, the top frames."""
    by_thread = ", ".join(f"{k} {v:.2f}" for k, v in p["by_thread"].items())
    inner, ours = p["top_innermost"][:top], p["top_ours"][:top]

    def pair(frames: list[list[Any]], i: int) -> list[str]:
        return [frames[i][0], fmt(frames[i][1], 2)] if i < len(frames) else ["", ""]

    rows = [[*pair(inner, i), *pair(ours, i)] for i in range(max(len(inner), len(ours)))]
    return [
        f"Sampled over {p['wall_s']:.2f} s: {p['busy_s']:.2f} busy thread-seconds, {p['with_our_code_s']:.2f} of them "
        f"with prefect_cudf_polars on the stack; by thread: {by_thread}.", "",
        *table(["innermost frame (busy)", "s", "our function (inclusive)", "s"], rows),
    ]


def task_overhead(doc: dict[str, Any]) -> list[str]:
    """(f) per scale factor: each timer's median ms per call [95 % interval], our cost and Prefect's."""
    rows, profiles = [], []
    for sf in scale_factors(doc):
        if (f := overhead(doc, sf)) is None:
            continue
        timers = [f"{fmt(f['timers'][n]['median'])} {fmt_ci(f['timers'][n]['ci'])}" for n in TIMERS]
        diffs = [f"{fmt(f['differences'][d]['median_ms'])} {fmt_ci(f['differences'][d]['ci_ms'])}" for d in DIFFERENCES]
        rows.append([sf, f["calls"], *timers, *diffs])
        if "profile" in f:
            title = f"Where a `gpu-task` call's time goes (SF {sf}, {f['calls']} calls sampled):"
            profiles += ["", title, "", *profile(f["profile"])]
    head = ["SF", "calls", *TIMERS, "ours (gpu-task − plain-task)", "Prefect (plain-task − bare)"]
    return table(head, rows) + profiles if rows else []


def many_tasks(doc: dict[str, Any]) -> list[str]:
    """The many-small-tasks flow runs: medians per variant (s), the ratio, the profiles."""
    m = doc["many_tasks"]
    if m.get("status") != "ok":
        return [f"Not measured: {m['error']}"] if m else []
    rows = [
        [name, f"{fmt(m[name]['wall']['median'], 2)} {fmt_ci(m[name]['wall']['ci'], 2)}",
         fmt(m[name]["per_task_ms"], 1), *(fmt(m[name][k], 2) for k in FLOW_FIGURES)]
        for name in ("plain", "ours")
    ]
    head = ["variant", "flow run [95 %]", "ms per task", "tasks", "end", "settle", "CPU, this process",
            "CPU, local API"]
    lines = [
        f"{m['tasks']} tasks per flow run, {m['runs']} flow runs of each, interleaved; medians in seconds, "
        f"ours/plain {fmt(m['ratio'], 2)} {fmt_ci(m['ratio_ci'], 2)}.", "", *table(head, rows),
    ]
    for name, p in m.get("profile", {}).items():
        lines += ["", f"Where a flow run's time goes, `{name}`:", "", *profile(p)]
    return lines


def session_start(value: dict[str, Any]) -> list[str]:
    """The session's start, piece by piece (ms)."""
    if value.get("status") != "ok":
        return [f"Not measured: {value.get('error')}"]
    rows = [
        [f"{p['label']} (`{name}`)", p["whose"], fmt(p["first_ms"], 1), fmt(p["later_median_ms"], 1)]
        for name, p in value["pieces"].items() if p["first_ms"] is not None
    ]
    head = ["piece", "whose", "first start (ms)", "later starts, median (ms)"]
    title = f"Backend `{value['backend']}`, {value['repeats']} start(s) in one process."
    return [title, "", *table(head, rows, text_columns=2)]


def data(doc: dict[str, Any]) -> list[str]:
    """The TPC-H tables of each scale factor: rows, bytes, seconds to generate and convert."""
    rows = [
        [sf, f"{d['rows']['lineitem']:,}", f"{d['bytes']:,}", fmt(d["generate_s"], 1), fmt(d["convert_s"], 1),
         d["reused"], d["generator"]]
        for sf, d in doc["data"].items()
    ]
    head = ["SF", "lineitem rows", "parquet bytes", "generate s", "convert s", "reused", "generator"]
    return table(head, rows) if rows else []


def failures(doc: dict[str, Any]) -> list[str]:
    """One line per measurement that did not run, and per error outside one."""
    lines = [f"* SF {m['scale_factor']} {m['pipeline']} {m['variant']}: {m['status']}: {m.get('error', '')[:300]}"
             for m in doc["measurements"] if m["status"] != "ok"]
    lines += [f"* SF {sf} task overhead: {v['status']}: {v.get('error', '')[:300]}"
              for sf, v in doc["task_overhead"].items() if v["status"] != "ok"]
    lines += [f"* {k.replace('_', ' ')}: {doc[k].get('error', '')[:300]}"
              for k in ("many_tasks", "session_start") if doc[k].get("status") == "failed"]
    return lines + [f"* {e['where']}: {e['error'][:300]}" for e in doc["errors"]]


def _header(doc: dict[str, Any]) -> list[str]:
    s, mach = doc["settings"], doc["machine"]
    gpus = [f"{g['name']} ({g['memory_total_mib']} MiB), driver {g['driver_version']}" for g in mach.get("gpus", [])]
    commands = doc.get("commands") or [" ".join(doc["command"])]
    return [
        "# prefect-cudf-polars benchmarks: TPC-H pipelines, per-task overhead, many small tasks, session start", "",
        f"Run {doc['started_at']} – {doc['finished_at'] or '(unfinished)'}; backend `{s['backend']}`; variants "
        f"interleaved round by round; medians of {s['runs']} runs after {s['warmups']} warm-up round(s), seconds.", "",
        "Command(s): " + "; ".join(f"`{c}`" for c in commands) + ".", "",
        f"* GPU: {', '.join(gpus) or 'none'}; CUDA runtime {mach.get('cuda_runtime_version') or '—'}",
        f"* CPU: {mach.get('cpu_model')} ({mach.get('logical_cpus')} logical CPUs), {mach.get('memory_gib')} GiB; "
        f"Python {mach.get('python')}",
        "* Versions: " + ", ".join(f"{k} {v}" for k, v in mach.get("packages", {}).items()), "",
        "Variants: " + "; ".join(f"{short}: {what}" for short, what in VARIANTS.values()) + ".",
    ]


def markdown(doc: dict[str, Any], *, full: bool = True) -> str:
    """The results as markdown: ``results.md`` with ``full`` (machine, seconds per step, data), else the summary."""
    lines = [*(_header(doc) + [""] if full else []), "## Goals", "", *goals_markdown(doc)]
    for sf in scale_factors(doc):
        if not any(m["scale_factor"] == sf for m in doc["measurements"]):
            continue
        lines += ["", f"## Scale factor {sf}", "", *side_by_side(doc, sf)]
        stepped = [m for m in doc["measurements"] if m["scale_factor"] == sf and m.get("steps_median_s")]
        if full and stepped:
            rows = [[m["pipeline"], VARIANTS[m["variant"]][0],
                     ", ".join(f"{k} {v:.3f}" for k, v in m["steps_median_s"].items())] for m in stepped]
            per_step = table(["pipeline", "variant", "steps"], rows, text_columns=3)
            lines += ["", "Median seconds per step:", "", *per_step]
    sections = {
        "The peer a user would pick instead: (g)": peer(doc),
        "Per-task overhead on a tiny query (median ms per call, [95 % interval])": task_overhead(doc),
        "Many small tasks on the cpu backend": many_tasks(doc),
        "The session's start": session_start(doc["session_start"]) if doc["session_start"] else [],
        "Data (tpchgen-cli parquet, money columns as Float64)": data(doc) if full else [],
        "Failures and skips": failures(doc),
    }
    for title, body in sections.items():
        if body:
            lines += ["", f"## {title}", "", *body]
    return "\n".join(lines) + "\n"


def write_reports(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``results.md`` and ``chart.png`` into ``out``; returns their paths (and why there is no chart)."""
    md, png = Path(out) / "results.md", Path(out) / "chart.png"
    md.write_text(markdown(doc))
    problem = chart(doc, png)
    return {"markdown": str(md), "chart": None if problem else str(png), "chart_problem": problem}
