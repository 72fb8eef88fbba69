"""
``results.md`` and ``breakdown.md``: the results of ``results.json`` as markdown tables, and the summary printed last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.breakdown import MODES, PIECES
from benchmarks.chart import chart, has_variants
from benchmarks.figures import (
    OVERHEAD_NAMES,
    fmt,
    measurement,
    median,
    our_overhead_ms,
    overhead_ms,
    per_step_ms,
    pipelines_of,
    prefect_overhead_ms,
    ratio,
    scale_factors,
    steps,
)
from benchmarks.goals import GOAL_PIPELINES, goals_markdown
from benchmarks.variant_names import SHORT, VARIANTS


def _cell(doc: dict[str, Any], sf: str, p: str, v: str) -> str:
    entry = measurement(doc, sf, p, v)
    if entry is None:
        return "—"
    if entry["status"] != "ok":
        return entry["status"]
    return fmt(entry["median_s"]) + (" (cut)" if entry.get("cut_short") else "")


def side_by_side_markdown(doc: dict[str, Any], sf: str) -> list[str]:
    """Medians of every variant (seconds) and their ratios, one row per pipeline."""
    lines = [
        "| pipeline | " + " | ".join(SHORT.values()) + " | a/b | b/c | a/c | d/a | g/a | results match |",
        "|---|" + "---:|" * (len(SHORT) + 5) + "---|",
    ]
    for p in pipelines_of(doc):
        ratios = [
            fmt(ratio(doc, sf, p, "a", "b"), 2),
            fmt(ratio(doc, sf, p, "b", "c"), 2),
            fmt(ratio(doc, sf, p, "a", "c"), 2),
            fmt(ratio(doc, sf, p, "d", "a"), 1),
            fmt(ratio(doc, sf, p, "g", "a"), 1),
        ]
        checks = [
            m
            for m in doc["measurements"]
            if m["scale_factor"] == sf and m["pipeline"] == p and "matches_reference" in m
        ]
        match = (
            "—"
            if not checks
            else "yes"
            if all(m["matches_reference"] for m in checks)
            else "**no**: " + ", ".join(m["variant"] for m in checks if not m["matches_reference"])
        )
        cells = [_cell(doc, sf, p, v) for v in SHORT]
        lines.append(f"| {p} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {match} |")
    return lines


def per_step_markdown(doc: dict[str, Any], sf: str) -> list[str]:
    """Per-step differences (ms): (a)−(h), (h)−(b) (Prefect), (a)−(b); and (a)−(h) step by step."""
    lines = [
        "| pipeline | (a) − (h) | (h) − (b): Prefect | (a) − (b) | Prefect's share of (a) − (b) | (a) − (h) by step |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for p in pipelines_of(doc):
        ah, hb, ab = (per_step_ms(doc, sf, p, x, y) for x, y in (("a", "h"), ("h", "b"), ("a", "b")))
        share = f"{hb / ab:.0%}" if hb is not None and ab else "—"
        a, h = measurement(doc, sf, p, "a"), measurement(doc, sf, p, "h")
        by_step = "—"
        if a and h and a.get("steps_median_s") and h.get("steps_median_s"):
            by_step = ", ".join(
                f"{k} {(v - h['steps_median_s'][k]) * 1000:.2f}"
                for k, v in a["steps_median_s"].items()
                if k in h["steps_median_s"]
            )
        lines.append(f"| {p} | {fmt(ah, 2)} | {fmt(hb, 2)} | {fmt(ab, 2)} | {share} | {by_step} |")
    return lines


def peer_markdown(doc: dict[str, Any]) -> list[str]:
    """(g) per scale factor and pipeline: with and without the default cache policy's hashing, over (a)."""
    lines = [
        "| SF | pipeline | (g) s | (g) NO_CACHE s | hashing s | hashing share of (g) | (g)/(a) | (g) NO_CACHE/(a) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = 0
    for sf in scale_factors(doc):
        for p in pipelines_of(doc):
            g, g0 = median(doc, sf, p, "g"), median(doc, sf, p, "g-nocache")
            if g is None and g0 is None:
                continue
            rows += 1
            hashing = g - g0 if g is not None and g0 is not None else None
            share = f"{hashing / g:.0%}" if hashing is not None and g else "—"
            lines.append(
                f"| {sf} | {p} | {fmt(g)} | {fmt(g0)} | {fmt(hashing)} | {share} | "
                f"{fmt(ratio(doc, sf, p, 'g', 'a'), 1)} | {fmt(ratio(doc, sf, p, 'g-nocache', 'a'), 1)} |"
            )
    return lines if rows else []


def overhead_markdown(doc: dict[str, Any]) -> list[str]:
    """(f) medians per call (ms), our cost and Prefect's."""
    lines = [
        "| SF | " + " | ".join(OVERHEAD_NAMES) + " | ours (gpu − plain) | Prefect (plain − bare) |",
        "|---|" + "---:|" * (len(OVERHEAD_NAMES) + 2),
    ]
    rows = 0
    for sf in scale_factors(doc):
        o = {n: overhead_ms(doc, sf, n) for n in OVERHEAD_NAMES}
        if all(v is None for v in o.values()):
            continue
        rows += 1
        lines.append(
            f"| {sf} | "
            + " | ".join(fmt(o[n], 3) for n in OVERHEAD_NAMES)
            + f" | {fmt(our_overhead_ms(doc, sf), 3)} | {fmt(prefect_overhead_ms(doc, sf), 3)} |"
        )
    return lines if rows else []


def breakdown_markdown(value: dict[str, Any] | None) -> str:
    """
    The per-step breakdown of one scale factor as a markdown table.

    Parameters
    ----------
    value
        ``results.json["breakdown"][sf]`` (:func:`benchmarks.breakdown.run_breakdown`),
        or ``None`` for the empty table (every figure a dash).

    Returns
    -------
    str
        The table (median ms per pipeline run, and per step in brackets; the
        last column is ``gpu-tasks`` minus the row, per step, averaged over the
        pipelines), then how each piece is switched off.
    """
    value = value or {}
    pipes = value.get("pipelines") or list(GOAL_PIPELINES)
    modes = value.get("modes", {})

    def total(mode: str, p: str) -> float | None:
        entry = modes.get(mode, {}).get("pipelines", {}).get(p, {})
        return entry.get("median_s") if entry.get("status") == "ok" else None

    def cell(mode: str, p: str) -> str:
        entry = modes.get(mode, {})
        run = entry.get("pipelines", {}).get(p, {})
        if run and run.get("status") != "ok":
            return run["status"]
        if entry.get("status") not in (None, "ok"):
            return f"**{entry['status']}**"
        t = total(mode, p)
        if t is None:
            return "—"
        per_step = " / ".join(f"{s * 1000:.1f}" for s in run.get("steps_median_s", {}).values())
        return f"{t * 1000:.1f} ({per_step})"

    def saved(mode: str) -> str:
        diffs = []
        for p in pipes:
            base, this = total("gpu-tasks", p), total(mode, p)
            if base is not None and this is not None:
                diffs.append((base - this) / steps(p) * 1000)
        return fmt(sum(diffs) / len(diffs), 2) if diffs else "—"

    lines = [
        "| what runs | "
        + " | ".join(f"{p.split('-')[0]}: ms (per step)" for p in pipes)
        + " | gpu-tasks minus this, ms per step |",
        "|---|" + "---:|" * (len(pipes) + 1),
    ]
    for m in MODES:
        lines.append(
            f"| `{m.name}`: {m.label} | " + " | ".join(cell(m.name, p) for p in pipes) + f" | {saved(m.name)} |"
        )
    lines += ["", "How each piece is switched off:", ""]
    lines += [f"* {p.label} (`-{p.name}`): {p.seam}" for p in PIECES]
    return "\n".join(lines) + "\n"


def session_start_markdown(value: dict[str, Any]) -> list[str]:
    """The session's start, piece by piece (ms)."""
    if value.get("status") != "ok":
        return [f"Not measured: {value.get('error', 'no session-start run')}"]
    lines = [
        f"Backend `{value['backend']}`, {value['repeats']} start(s) in one process.",
        "",
        "| piece | whose | first start (ms) | later starts, median (ms) |",
        "|---|---|---:|---:|",
    ]
    for name, piece in value["pieces"].items():
        if piece["first_ms"] is None and piece["later_median_ms"] is None:
            continue
        lines.append(
            f"| {piece['label']} (`{name}`) | {piece['whose']} | {fmt(piece['first_ms'], 1)} | "
            f"{fmt(piece['later_median_ms'], 1)} |"
        )
    return lines


def _runs_text(settings: dict[str, Any]) -> str:
    runs = settings.get("runs")
    return ", ".join(map(str, runs)) if isinstance(runs, list) else str(runs)


def _header(doc: dict[str, Any]) -> list[str]:
    s = doc["settings"]
    mach = doc.get("machine", {})
    gpus = mach.get("gpus") or []
    gpu_text = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB)" for g in gpus) or "none"
    driver = gpus[0]["driver_version"] if gpus else "—"
    versions = ", ".join(f"{k} {v}" for k, v in mach.get("packages", {}).items())
    commands = doc.get("commands") or [" ".join(doc["command"])]
    return [
        "# TPC-H pipelines: prefect-cudf-polars vs plain Prefect tasks, bare cudf-polars, host round trips and the CPU",
        "",
        f"Run {doc['started_at']} – {doc.get('finished_at') or '(unfinished)'}; backend "
        f"`{s['backend']}`; variants interleaved round by round; medians of {_runs_text(s)} "
        f"runs after {s['warmups']} warm-up round(s), seconds (lower is better).",
        "",
        "Command(s): " + "; ".join(f"`{c}`" for c in commands) + ".",
        "",
        f"* GPU: {gpu_text}; driver {driver}; CUDA (driver) {mach.get('cuda_driver_version') or '—'}, "
        f"CUDA runtime {mach.get('cuda_runtime_version') or '—'}",
        f"* CPU: {mach.get('cpu_model')} ({mach.get('logical_cpus')} logical CPUs), "
        f"{mach.get('memory_gib')} GiB; Python {mach.get('python')}",
        f"* Versions: {versions}",
        "",
        "Variants: " + "; ".join(VARIANTS.values()) + ". a/b is what Prefect and our tasks add to "
        "the chained engine calls, (h) − (b) Prefect's part of it and (a) − (h) ours; b/c what "
        "materializing each step costs cudf-polars over one fused query; a/c = a/b x b/c. (f) "
        "per-task overhead on a tiny query (the nations of one region): `bare` engine.execute(), "
        "a `plain-task` (plain Prefect @task making that call), our `gpu-task`, and a `noop-task`.",
    ]


def _failures(doc: dict[str, Any]) -> list[str]:
    lines = []
    for m in doc["measurements"] + doc["task_overhead"]:
        if m["status"] != "ok":
            what = f"{m.get('pipeline', 'task-overhead')} {m.get('variant', m.get('name'))}"
            lines.append(f"* SF {m['scale_factor']} {what}: {m['status']}: {m.get('error', '')[:300]}")
    for sf, value in doc.get("breakdown", {}).items():
        if value.get("status") == "failed":
            lines.append(f"* SF {sf} breakdown: {value.get('error', '')[:300]}")
        for name, mode in value.get("modes", {}).items():
            if mode["status"] != "ok":
                lines.append(f"* SF {sf} breakdown `{name}`: {mode['status']}: {mode.get('error', '')[:300]}")
    if doc.get("session_start", {}).get("status") == "failed":
        lines.append(f"* session start: {doc['session_start'].get('error', '')[:300]}")
    for e in doc.get("errors", []):
        lines.append(f"* {e['where']}: {e['error'][:300]}")
    return lines


def summary(doc: dict[str, Any]) -> str:
    """The tables to read first: goals, each scale factor side by side, per step, (g), (f), breakdown, session start."""
    lines = ["## Goals", "", *goals_markdown(doc)]
    for sf in scale_factors(doc):
        if has_variants(doc, sf):
            lines += ["", f"## Scale factor {sf}", "", *side_by_side_markdown(doc, sf)]
            lines += ["", "Per step (ms, difference of the medians over the steps):", ""]
            lines += per_step_markdown(doc, sf)
    if peer := peer_markdown(doc):
        lines += ["", "## The peer a user would pick instead: (g)", "", *peer]
    if overhead := overhead_markdown(doc):
        lines += ["", "## Per-task overhead on a tiny query (median ms per call)", "", *overhead]
    for sf, value in doc.get("breakdown", {}).items():
        if "modes" in value:
            lines += ["", f"## Where the per-step time goes (SF {sf})", "", breakdown_markdown(value)]
    if doc.get("session_start"):
        lines += ["", "## The session's start", "", *session_start_markdown(doc["session_start"])]
    if failures := _failures(doc):
        lines += ["", "## Failures and skips", "", *failures]
    return "\n".join(lines) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown document (machine, goals, tables, failures)."""
    lines = [*_header(doc), "", "## Goals", "", *goals_markdown(doc)]
    for sf in scale_factors(doc):
        if not has_variants(doc, sf):
            continue
        lines += ["", f"## Scale factor {sf}", "", *side_by_side_markdown(doc, sf)]
        lines += ["", "Per step (ms, difference of the medians divided by the steps):", ""]
        lines += per_step_markdown(doc, sf)
        eng = doc.get("engines", {}).get(sf, {})
        timings = (eng.get("session") or {}).get("timings", {})
        if eng.get("flow_run_wall_s") is not None:
            lines += [
                "",
                f"Engine start (outside the timings): {fmt(timings.get('engine_start_s'), 2)} s; the "
                f"flow run took {fmt(eng.get('flow_run_wall_s'), 1)} s of wall time in all (engine "
                "start and shutdown, warm-ups, runs and (f)).",
            ]
        stepped = [
            m
            for m in doc["measurements"]
            if m["scale_factor"] == sf and m["status"] == "ok" and m.get("steps_median_s")
        ]
        if stepped:
            lines += ["", "Median seconds per step:", "", "| pipeline | variant | steps |", "|---|---|---|"]
            for m in stepped:
                text = ", ".join(f"{k} {v:.3f}" for k, v in m["steps_median_s"].items())
                lines.append(f"| {m['pipeline']} | {SHORT.get(m['variant'], m['variant'])} | {text} |")
    if peer := peer_markdown(doc):
        lines += [
            "",
            "## The peer a user would pick instead: (g)",
            "",
            "Prefect's default cache policy hashes each task's inputs (here the DataFrames "
            "between the steps) and its source; `hashing` is (g) minus (g) with NO_CACHE.",
            "",
            *peer,
        ]
    if overhead := overhead_markdown(doc):
        lines += [
            "",
            "## Per-task overhead on a tiny query (median ms per call)",
            "",
            "The four take turns call by call in one flow run with one engine session: `bare` and "
            "`plain-task` on the engine's thread, `gpu-task` and `noop-task` in the flow body.",
            "",
            *overhead,
        ]
    for sf, prof in doc.get("task_path_profile", {}).items():
        if "status" in prof:
            continue
        lines += ["", f"Where one GPU task's time goes (SF {sf}, ms per call):", "", "| piece | ms |", "|---|---:|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in prof.items()]
    for sf, value in doc.get("breakdown", {}).items():
        if "modes" in value:
            lines += [
                "",
                f"## Where the per-step time goes (SF {sf})",
                "",
                f"Median ms of {value['runs']} interleaved runs per pipeline, per step in brackets, "
                "in one flow run and one engine session.",
                "",
                breakdown_markdown(value),
            ]
    if doc.get("session_start"):
        lines += ["", "## The session's start", "", *session_start_markdown(doc["session_start"])]
    if doc.get("data"):
        lines += [
            "",
            "## Data (tpchgen-cli parquet, money columns as Float64)",
            "",
            "| SF | lineitem rows | parquet bytes | generate s | convert s | reused | generator |",
            "|---|---:|---:|---:|---:|---|---|",
        ]
        for sf, d in doc["data"].items():
            if "rows" not in d:
                continue
            lines.append(
                f"| {sf} | {d['rows'].get('lineitem', 0):,} | {d.get('bytes', 0):,} | "
                f"{fmt(d.get('generate_s'), 1)} | {fmt(d.get('convert_s'), 1)} | {d.get('reused')} | {d.get('generator')} |"
            )
    if failures := _failures(doc):
        lines += ["", "## Failures and skips", "", *failures]
    return "\n".join(lines) + "\n"


def write_reports(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``results.md``, ``chart.png`` and, with a breakdown, ``breakdown.md`` into ``out``."""
    out = Path(out)
    (out / "results.md").write_text(markdown(doc))
    problem = chart(doc, out / "chart.png")
    written = {
        "markdown": str(out / "results.md"),
        "chart": None if problem else str(out / "chart.png"),
        "chart_problem": problem,
    }
    tables = [
        f"### SF {sf}\n\n" + breakdown_markdown(value)
        for sf, value in doc.get("breakdown", {}).items()
        if "modes" in value
    ]
    if tables:
        (out / "breakdown.md").write_text("\n".join(tables))
        written["breakdown"] = str(out / "breakdown.md")
    return written
