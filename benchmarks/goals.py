"""
The goals: each target the product is held to, with the measured figure, computed from ``results.json``.

==============================================================  ==========================================
target                                                          figure
==============================================================  ==========================================
(a) − (h) ≤ 1 ms per step, SF 10, Q1, Q3, Q5                    (median (a) − median (h)) / 3 steps
our overhead over a plain Prefect task ≤ 1 ms, tiny query       (f): median ``gpu-task`` − median
                                                                ``plain-task``, with its 95 % interval
a/b ≤ 1.05 at SF 30 and SF 100                                  median (a) / median (b)
a/b at SF 10, with Prefect's share (reported)                   a/b; (h) − (b) over (a) − (b)
a/c ≤ 1.10 at SF 10, every step but the last deferred           median ``a-deferred`` / median (c)
many small tasks ≤ 1.5 × plain tasks (``cpu`` backend)          median flow run ``ours`` / ``plain``
==============================================================  ==========================================

A target is judged only where its scale factor ran; the note says when a
median comes from fewer than 10 runs, or when two medians come from different
commands of a merged run. On the ``cpu`` backend the TPC-H rows check the
harness, not the goals; the many-small-tasks target is a ``cpu`` measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.figures import fmt, fmt_ci, measurement, overhead, per_step_ms, pipelines_of, ratio, sf_of

GOAL_PIPELINES = ("q1-pricing-summary", "q3-shipping-priority", "q5-local-supplier-volume")
MIN_RUNS = 10
Compute = Callable[[str], tuple[float | None, list[str]]]


def _row(
    doc: dict[str, Any], goal: str, pipeline: str, sf_value: float | None, compute: Compute,
    target: float | None, *, unit: str = "", uses: tuple[str, ...] = (),
) -> dict[str, Any]:
    sf = sf_of(doc, sf_value) if sf_value is not None else ""
    value, notes = None, []
    if sf is None:
        notes.append(f"scale factor {sf_value:g} not in this run")
    elif pipeline in GOAL_PIPELINES and pipeline not in pipelines_of(doc):
        notes.append("pipeline not in this run")
    else:
        value, notes = compute(sf)
        present = [m for m in (measurement(doc, sf, pipeline, v) for v in uses) if m and m["status"] == "ok"]
        if few := sorted({len(m["runs_s"]) for m in present if len(m["runs_s"]) < MIN_RUNS}):
            notes.append(f"from {', '.join(map(str, few))} run(s), fewer than {MIN_RUNS}")
        if len({m.get("part") for m in present}) > 1:
            notes.append("medians from different commands of a merged run")
        if value is None and not notes:
            notes.append("not measured in this run")
    return {
        "goal": goal, "pipeline": pipeline, "scale_factor": "—" if sf_value is None else f"{sf_value:g}",
        "value": value, "unit": unit, "target": target, "kind": "report" if target is None else "target",
        "met": None if value is None or target is None else value <= target, "note": "; ".join(notes),
    }


def _prefect_share(doc: dict[str, Any], sf: str, p: str) -> str:
    prefect, total = per_step_ms(doc, sf, p, "h", "b"), per_step_ms(doc, sf, p, "a", "b")
    if prefect is None or total is None:
        return "Prefect's share: needs (a), (b) and (h)"
    share = f" ({prefect / total:.0%})" if total > 0 else ""
    return f"Prefect's share (h) − (b): {prefect:.2f} ms of (a) − (b) {total:.2f} ms per step{share}"


def _our_overhead(doc: dict[str, Any], sf: str) -> tuple[float | None, list[str]]:
    f = overhead(doc, sf)
    if f is None:
        return None, []
    ours = f["differences"]["ours"]
    return ours["median_ms"], [f"95 % interval {fmt_ci(ours['ci_ms'], 3)} ms; {f['calls']} calls per timer"]


def _many_tasks(doc: dict[str, Any]) -> tuple[float | None, list[str]]:
    m = doc["many_tasks"]
    if m.get("status") != "ok":
        return None, [m.get("error", "not measured in this run")[:200]] if m else []
    return m["ratio"], [
        f"95 % interval {fmt_ci(m['ratio_ci'], 2)}; medians {fmt(m['ours']['wall']['median'], 2)} s vs "
        f"{fmt(m['plain']['wall']['median'], 2)} s of {m['runs']} flow runs each, {m['tasks']} tasks"
    ]


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """
    Every target of the module docstring, with its measured figure and whether it is met.

    Returns
    -------
    list of dict
        ``goal``, ``pipeline``, ``scale_factor``, ``value``, ``unit`` (``"ms"``
        or ``""``), ``target``, ``met`` (``None`` where a figure is missing or
        only reported), ``kind`` (``"target"`` or ``"report"``) and ``note``.
    """
    rows = [
        _row(doc, "(a) − (h) ≤ 1 ms per step", p, 10, lambda sf, p=p: (per_step_ms(doc, sf, p, "a", "h"), []),
             1.0, unit="ms", uses=("a", "h"))
        for p in GOAL_PIPELINES
    ]
    for sf in sorted(doc["task_overhead"], key=float) or ["10"]:
        rows.append(_row(doc, "our overhead over a plain Prefect task ≤ 1 ms per GPU task", "tiny query", float(sf),
                         lambda s: _our_overhead(doc, s), 1.0, unit="ms"))
    rows += [
        _row(doc, "a/b ≤ 1.05", p, sf, lambda s, p=p: (ratio(doc, s, p, "a", "b"), []), 1.05, uses=("a", "b"))
        for sf in (30, 100) for p in GOAL_PIPELINES
    ]
    rows += [
        _row(doc, "a/b as reached, with Prefect's share", p, 10,
             lambda s, p=p: (ratio(doc, s, p, "a", "b"), [_prefect_share(doc, s, p)]), None, uses=("a", "b", "h"))
        for p in GOAL_PIPELINES
    ]
    rows += [
        _row(doc, "a/c ≤ 1.10, every step but the last deferred", p, 10,
             lambda s, p=p: (ratio(doc, s, p, "a-deferred", "c"), [] if measurement(doc, s, p, "a-deferred") else
                             ["no deferred-steps variant (a-deferred) in this run"]), 1.10, uses=("a-deferred", "c"))
        for p in GOAL_PIPELINES
    ]
    tasks = doc["many_tasks"].get("tasks", 200)
    rows.append(_row(doc, "many small tasks ≤ 1.5 × plain tasks (cpu backend)", f"{tasks} tiny tasks", None,
                     lambda s: _many_tasks(doc), 1.5))
    return rows


def goals_markdown(doc: dict[str, Any]) -> list[str]:
    """The goals table (``doc["goals"]``)."""
    lines = []
    if doc["settings"].get("backend") == "cpu":
        lines += ["On the cpu backend the TPC-H rows check the harness, not the goals.", ""]
    lines += ["| goal | pipeline | SF | measured | target | met | note |", "|---|---|---|---:|---|---|---|"]
    for g in doc.get("goals", []):
        unit = f" {g['unit']}" if g["unit"] else ""
        target = "—" if g["target"] is None else f"{g['target']:g}{unit}"
        met = "report" if g["kind"] == "report" else {True: "yes", False: "**no**", None: "n/a"}[g["met"]]
        value = fmt(g["value"], 3) + (unit if g["value"] is not None else "")
        lines.append(f"| {g['goal']} | {g['pipeline']} | {g['scale_factor']} | {value} | {target} | {met} "
                     f"| {g['note']} |")
    return lines
