"""
From ``results.json`` to the goals, a markdown table (``results.md``) and a chart (``chart.png``).

Goals (the targets ``results.md`` judges the measurements against):

* (a)/(c) <= 1.10 at scale factor 10: our flow costs at most 10 % over the
  same pipeline run as one fused query on bare cudf-polars;
* (d)/(a) >= 20: host round trips between steps are at least 20 times slower;
* our own overhead over a plain Prefect task <= 1 ms per GPU task
  (median ``gpu-task`` minus median ``plain-task``, tiny query); also shown
  corrected for a drift between the two flow runs that time them, with the
  no-op task timed in both: ``(gpu-task - noop-task@ours) - (plain-task - noop-task)``.

They are judged at scale factor 10 where it ran (else at the largest one,
said in the table), and only mean something on a GPU backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS: dict[str, str] = {
    "a": "(a) our Prefect flow, GPU results between tasks",
    "b": "(b) bare engine, chained engine.execute()",
    "c": "(c) bare engine, one fused query",
    "d": "(d) bare engine, collect() + .lazy() host round trips",
    "e": "(e) polars on the CPU, fused query",
}
SHORT = {
    "a": "(a) ours",
    "b": "(b) chained",
    "c": "(c) fused",
    "d": "(d) round trips",
    "e": "(e) CPU",
}
OVERHEAD_NAMES = ("bare", "plain-task", "noop-task", "gpu-task", "noop-task@ours")
GOAL_SF = 10.0


def _median(doc: dict[str, Any], sf: str, pipeline: str, variant: str) -> float | None:
    for m in doc["measurements"]:
        if (m["scale_factor"], m["pipeline"], m["variant"]) == (sf, pipeline, variant):
            return m.get("median_s") if m["status"] == "ok" else None
    return None


def _overhead(doc: dict[str, Any], sf: str, name: str) -> float | None:
    for m in doc["task_overhead"]:
        if (m["scale_factor"], m["name"]) == (sf, name) and m["status"] == "ok":
            return m["median_ms"]
    return None


def scale_factors(doc: dict[str, Any]) -> list[str]:
    """Scale factors of the run, as recorded (text), in the order asked."""
    return [str(s) for s in doc["settings"]["scale_factors"]]


def pipelines_of(doc: dict[str, Any]) -> list[str]:
    """Pipeline names, in the order asked."""
    return list(doc["settings"]["pipelines"])


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """
    Judge the three goals from the measurements.

    Returns
    -------
    list of dict
        ``goal``, ``pipeline`` (or ``"tiny query"``), ``scale_factor``,
        ``value``, ``target``, ``met`` (``None`` when a number is missing) and
        ``note``.
    """
    sfs = scale_factors(doc)
    if not sfs:
        return []
    at = next((s for s in sfs if float(s) == GOAL_SF), max(sfs, key=float))
    note = "" if float(at) == GOAL_SF else f"scale factor {GOAL_SF:g} not run; judged at {at}"
    if doc["settings"].get("backend") == "cpu":
        note = (
            note + "; " if note else ""
        ) + "cpu backend: a check of the harness, not of the goals"
    out = []
    for p in pipelines_of(doc):
        a, c, d = (_median(doc, at, p, v) for v in "acd")
        ratio = a / c if a and c else None
        out.append(
            {
                "goal": "(a)/(c) <= 1.10",
                "pipeline": p,
                "scale_factor": at,
                "value": ratio,
                "target": 1.10,
                "met": None if ratio is None else ratio <= 1.10,
                "note": note,
            }
        )
        ratio = d / a if a and d else None
        out.append(
            {
                "goal": "(d)/(a) >= 20",
                "pipeline": p,
                "scale_factor": at,
                "value": ratio,
                "target": 20.0,
                "met": None if ratio is None else ratio >= 20.0,
                "note": note,
            }
        )
    for sf in sfs:
        ours, corrected = our_overhead_ms(doc, sf)
        if ours is None and _overhead(doc, sf, "gpu-task") is None:
            continue
        out.append(
            {
                "goal": "our overhead per GPU task <= 1 ms",
                "pipeline": "tiny query",
                "scale_factor": sf,
                "value": ours,
                "target": 1.0,
                "met": None if ours is None else ours <= 1.0,
                "note": note,
            }
        )
        if corrected is not None:
            out.append(
                {
                    "goal": "our overhead per GPU task <= 1 ms (drift-corrected)",
                    "pipeline": "tiny query",
                    "scale_factor": sf,
                    "value": corrected,
                    "target": 1.0,
                    "met": corrected <= 1.0,
                    "note": note,
                }
            )
    return out


def our_overhead_ms(doc: dict[str, Any], sf: str) -> tuple[float | None, float | None]:
    """
    Our cost per GPU task (ms): ``gpu-task - plain-task``, and the same corrected
    by the no-op task timed in each flow run; ``None`` where a number is missing.
    """
    o = {n: _overhead(doc, sf, n) for n in OVERHEAD_NAMES}
    ours = (
        o["gpu-task"] - o["plain-task"]
        if o["gpu-task"] is not None and o["plain-task"] is not None
        else None
    )
    corrected = None
    if ours is not None and o["noop-task"] is not None and o["noop-task@ours"] is not None:
        corrected = (o["gpu-task"] - o["noop-task@ours"]) - (o["plain-task"] - o["noop-task"])
    return ours, corrected


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _met(flag: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "n/a"}[flag]


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown document (machine, goals, tables, failures)."""
    s = doc["settings"]
    mach = doc.get("machine", {})
    gpus = mach.get("gpus") or []
    gpu_text = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB)" for g in gpus) or "none"
    driver = gpus[0]["driver_version"] if gpus else "—"
    pk = mach.get("packages", {})
    versions = ", ".join(f"{k} {v}" for k, v in pk.items())
    lines = [
        "# TPC-H pipelines: prefect-cudf-polars vs bare cudf-polars, host round trips and the CPU",
        "",
        f"Run {doc['started_at']} – {doc.get('finished_at') or '(unfinished)'}; "
        f"backend `{s['backend']}`; medians of {s['runs']} runs after {s['warmups']} warm-up(s), "
        "seconds (lower is better). Command: `" + " ".join(doc["command"]) + "`.",
        "",
        f"* GPU: {gpu_text}; driver {driver}; CUDA (driver) {mach.get('cuda_driver_version') or '—'}, "
        f"CUDA runtime {mach.get('cuda_runtime_version') or '—'}",
        f"* CPU: {mach.get('cpu_model')} ({mach.get('logical_cpus')} logical CPUs), "
        f"{mach.get('memory_gib')} GiB; Python {mach.get('python')}",
        f"* Versions: {versions}",
        "",
        "Variants: " + "; ".join(VARIANTS.values()) + ". a/b is what Prefect and our tasks "
        "add to the chained engine calls; b/c what chaining (materializing each step) costs "
        "over one fused query; a/c = a/b x b/c. (f) per-task overhead on a tiny query "
        "(the nations of one region): `bare` engine.execute(), a `plain-task` (plain Prefect "
        "@task making that call), our `gpu-task`, and a `noop-task`.",
        "",
        "## Goals",
        "",
        "| goal | pipeline | SF | value | target | met | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in doc.get("goals", []):
        unit = " ms" if "ms" in g["goal"] else ""
        lines.append(
            f"| {g['goal']} | {g['pipeline']} | {g['scale_factor']} | {_fmt(g['value'], 3)}{unit} "
            f"| {g['target']:g} | {_met(g['met'])} | {g['note']} |"
        )
    for sf in scale_factors(doc):
        lines += [
            "",
            f"## Scale factor {sf}",
            "",
            "| pipeline | "
            + " | ".join(SHORT.values())
            + " | a/b | b/c | a/c | d/a | e/a | results match |",
            "|---|" + "---:|" * (len(SHORT) + 5) + "---|",
        ]
        for p in pipelines_of(doc):
            med = {v: _median(doc, sf, p, v) for v in SHORT}
            cells = []
            for v in SHORT:
                entry = next(
                    (
                        m
                        for m in doc["measurements"]
                        if (m["scale_factor"], m["pipeline"], m["variant"]) == (sf, p, v)
                    ),
                    None,
                )
                if entry is None:
                    cells.append("—")
                elif entry["status"] != "ok":
                    cells.append(entry["status"])
                else:
                    cells.append(_fmt(med[v]) + (" (cut)" if entry.get("cut_short") else ""))
            ratios = [
                _fmt(med["a"] / med["b"], 2) if med["a"] and med["b"] else "—",
                _fmt(med["b"] / med["c"], 2) if med["b"] and med["c"] else "—",
                _fmt(med["a"] / med["c"], 2) if med["a"] and med["c"] else "—",
                _fmt(med["d"] / med["a"], 1) if med["a"] and med["d"] else "—",
                _fmt(med["e"] / med["a"], 1) if med["a"] and med["e"] else "—",
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
                else "**no**: "
                + ", ".join(m["variant"] for m in checks if not m["matches_reference"])
            )
            lines.append(
                f"| {p} | " + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {match} |"
            )
        eng = doc.get("engines", {}).get(sf, {})
        ours = eng.get("ours", {})
        timings = ours.get("session", {}).get("timings", {})
        if ours or "bare_engine_start_s" in eng:
            lines += [
                "",
                f"Engine start (outside the timings): our session {_fmt(timings.get('engine_start_s'), 2)} s, "
                f"bare engine {_fmt(eng.get('bare_engine_start_s'), 2)} s; our flow run took "
                f"{_fmt(ours.get('flow_run_wall_s'), 1)} s of wall time in all "
                f"(engine start and shutdown, warm-ups, runs and (f)).",
            ]
        steps = [
            m
            for m in doc["measurements"]
            if m["scale_factor"] == sf and m["status"] == "ok" and m.get("steps_median_s")
        ]
        if steps:
            lines += [
                "",
                "Median seconds per step:",
                "",
                "| pipeline | variant | steps |",
                "|---|---|---|",
            ]
            for m in steps:
                text = ", ".join(f"{k} {v:.3f}" for k, v in m["steps_median_s"].items())
                lines.append(f"| {m['pipeline']} | {SHORT[m['variant']]} | {text} |")
    lines += [
        "",
        "## Per-task overhead on a tiny query (median ms per call)",
        "",
        "`bare`, `plain-task` and `noop-task` take turns in one flow run next to the bare engine; "
        "`gpu-task` and `noop-task@ours` in our flow run next to the session.",
        "",
        "| SF | "
        + " | ".join(OVERHEAD_NAMES)
        + " | ours (gpu − plain) | ours, drift-corrected | Prefect (plain − bare) |",
        "|---|" + "---:|" * (len(OVERHEAD_NAMES) + 3),
    ]
    for sf in scale_factors(doc):
        o = {n: _overhead(doc, sf, n) for n in OVERHEAD_NAMES}
        if all(v is None for v in o.values()):
            continue
        ours, corrected = our_overhead_ms(doc, sf)
        pref = (
            o["plain-task"] - o["bare"]
            if o["plain-task"] is not None and o["bare"] is not None
            else None
        )
        lines.append(
            f"| {sf} | "
            + " | ".join(_fmt(o[n], 3) for n in OVERHEAD_NAMES)
            + f" | {_fmt(ours, 3)} | {_fmt(corrected, 3)} | {_fmt(pref, 3)} |"
        )
    for sf, prof in doc.get("task_path_profile", {}).items():
        if "status" in prof:
            continue
        lines += [
            "",
            f"Where one GPU task's time goes (SF {sf}, ms per call):",
            "",
            "| piece | ms |",
            "|---|---:|",
        ]
        lines += [f"| {k} | {v:.3f} |" for k, v in prof.items()]
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
                f"{_fmt(d.get('generate_s'), 1)} | {_fmt(d.get('convert_s'), 1)} | {d.get('reused')} | {d.get('generator')} |"
            )
    failures = [m for m in doc["measurements"] + doc["task_overhead"] if m["status"] != "ok"]
    if failures or doc.get("errors"):
        lines += ["", "## Failures and skips", ""]
        for m in failures:
            what = f"{m.get('pipeline', 'task-overhead')} {m.get('variant', m.get('name'))}"
            lines.append(
                f"* SF {m['scale_factor']} {what}: {m['status']}: {m.get('error', '')[:300]}"
            )
        for e in doc.get("errors", []):
            lines.append(f"* {e['where']}: {e['error'][:300]}")
    return "\n".join(lines) + "\n"


def chart(doc: dict[str, Any], path: Path) -> str | None:
    """
    Draw ``chart.png``: median seconds per pipeline and variant (log scale), one panel
    per scale factor, and the per-task overhead panel.

    Returns
    -------
    str or None
        ``None`` when written; else why not (matplotlib missing).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no chart: {exc} (pip install matplotlib)"
    sfs = scale_factors(doc)
    pipes = pipelines_of(doc)
    fig, axes = plt.subplots(1, len(sfs) + 1, figsize=(6 * (len(sfs) + 1), 4.8), squeeze=False)
    width = 0.8 / len(SHORT)
    for ax, sf in zip(axes[0], sfs, strict=False):
        for i, v in enumerate(SHORT):
            values = [_median(doc, sf, p, v) or 0.0 for p in pipes]
            xs = [j + (i - (len(SHORT) - 1) / 2) * width for j in range(len(pipes))]
            ax.bar(xs, values, width, label=SHORT[v])
        ax.set_yscale("log")
        ax.set_xticks(range(len(pipes)))
        ax.set_xticklabels([p.split("-")[0] for p in pipes])
        ax.set_ylabel("median seconds (log)")
        ax.set_title(f"TPC-H SF {sf}, backend {doc['settings']['backend']}")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for i, sf in enumerate(sfs):
        values = [_overhead(doc, sf, n) or 0.0 for n in OVERHEAD_NAMES]
        xs = [j + (i - (len(sfs) - 1) / 2) * (0.8 / len(sfs)) for j in range(len(OVERHEAD_NAMES))]
        ax.bar(xs, values, 0.8 / len(sfs), label=f"SF {sf}")
    ax.set_xticks(range(len(OVERHEAD_NAMES)))
    ax.set_xticklabels(OVERHEAD_NAMES)
    ax.set_ylabel("median ms per call")
    ax.set_title("(f) per-task overhead, tiny query")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_reports(doc: dict[str, Any], out: Path) -> dict[str, Any]:
    """Write ``results.md`` and ``chart.png`` into ``out``; return what was written."""
    out = Path(out)
    (out / "results.md").write_text(markdown(doc))
    problem = chart(doc, out / "chart.png")
    return {
        "markdown": str(out / "results.md"),
        "chart": None if problem else str(out / "chart.png"),
        "chart_problem": problem,
    }
