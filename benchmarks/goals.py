"""
The goals: each target the pipelines split into Prefect tasks are held to, with the measured figure, computed from ``results.json``.

* (a) − (h) <= 1 ms per step at scale factor 10 for Q1, Q3 and Q5: our GPU
  tasks over the same engine calls in plain Prefect tasks (Prefect's floor),
  difference of the medians divided by the steps;
* our overhead over a plain Prefect task <= 1 ms per GPU task on the tiny
  query ((f): median ``gpu-task`` minus median ``plain-task``);
* a/b <= 1.05 at scale factors 30 and 100; at 10, a/b as reached, with
  Prefect's share of it ((h) − (b) over (a) − (b));
* a/c <= 1.10 at scale factor 10 with every step but the last deferred (the
  variant ``a-deferred``, where it ran).

A target is judged only where its scale factor ran; it asks for medians of at
least 10 interleaved runs, and the note says when fewer were taken or when the
two medians come from different commands of a merged run. On the ``cpu``
backend the table checks the harness, not the goals.
"""

from __future__ import annotations

from typing import Any

from benchmarks.figures import (
    fmt,
    measurement,
    our_overhead_ms,
    per_step_ms,
    pipelines_of,
    ratio,
    sf_of,
)
from benchmarks.pipelines import PIPELINES

GOAL_PIPELINES = ("q1-pricing-summary", "q3-shipping-priority", "q5-local-supplier-volume")
MIN_RUNS = 10


def _evidence_note(doc: dict[str, Any], entries: list[dict[str, Any] | None]) -> list[str]:
    notes = []
    present = [m for m in entries if m is not None and m["status"] == "ok"]
    few = sorted({len(m["runs_s"]) for m in present if len(m["runs_s"]) < MIN_RUNS})
    if few:
        notes.append(f"from {', '.join(map(str, few))} run(s), fewer than {MIN_RUNS}")
    if len({m.get("part") for m in present}) > 1:
        notes.append("medians from different commands of a merged run")
    return notes


def _row(
    doc: dict[str, Any],
    goal: str,
    pipeline: str,
    sf_value: float,
    compute: Any,
    target: float | None,
    *,
    unit: str,
    meets: Any = None,
    uses: tuple[str, ...] = (),
) -> dict[str, Any]:
    sf = sf_of(doc, sf_value)
    notes: list[str] = []
    value = None
    if sf is None:
        notes.append(f"scale factor {sf_value:g} not in this run")
    elif pipeline in PIPELINES and pipeline not in pipelines_of(doc):
        notes.append("pipeline not in this run")
    else:
        value, extra = compute(sf)
        notes += extra
        notes += _evidence_note(doc, [measurement(doc, sf, pipeline, v) for v in uses])
        if value is None and not extra:
            notes.append("not measured in this run")
    met = None if value is None or meets is None else bool(meets(value))
    return {
        "goal": goal,
        "pipeline": pipeline,
        "scale_factor": f"{sf_value:g}",
        "value": value,
        "unit": unit,
        "target": target,
        "met": met,
        "kind": "target" if meets is not None else "report",
        "note": "; ".join(notes),
    }


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """
    Every target, with its measured figure and whether it is met.

    Returns
    -------
    list of dict
        ``goal``, ``pipeline`` (or ``"tiny query"``), ``scale_factor``,
        ``value``, ``unit`` (``"ms"`` or ``""``), ``target``, ``met`` (``None``
        where a figure is missing, or for a figure only reported), ``kind``
        (``"target"`` or ``"report"``) and ``note``.
    """
    rows = []
    for p in GOAL_PIPELINES:
        rows.append(
            _row(
                doc,
                "(a) − (h) ≤ 1 ms per step",
                p,
                10,
                lambda sf, p=p: (per_step_ms(doc, sf, p, "a", "h"), []),
                1.0,
                unit="ms",
                meets=lambda v: v <= 1.0,
                uses=("a", "h"),
            )
        )
    f_sfs = sorted({m["scale_factor"] for m in doc["task_overhead"]}, key=float) or ["10"]
    for sf in f_sfs:
        rows.append(
            _row(
                doc,
                "our overhead over a plain Prefect task ≤ 1 ms per GPU task",
                "tiny query",
                float(sf),
                lambda s: (our_overhead_ms(doc, s), []),
                1.0,
                unit="ms",
                meets=lambda v: v <= 1.0,
            )
        )
    for sf_value in (30, 100):
        for p in GOAL_PIPELINES:
            rows.append(
                _row(
                    doc,
                    "a/b ≤ 1.05",
                    p,
                    sf_value,
                    lambda sf, p=p: (ratio(doc, sf, p, "a", "b"), []),
                    1.05,
                    unit="",
                    meets=lambda v: v <= 1.05,
                    uses=("a", "b"),
                )
            )
    for p in GOAL_PIPELINES:
        rows.append(
            _row(
                doc,
                "a/b as reached, with Prefect's share",
                p,
                10,
                lambda sf, p=p: (ratio(doc, sf, p, "a", "b"), [_prefect_share(doc, sf, p)]),
                None,
                unit="",
                uses=("a", "b", "h"),
            )
        )
    for p in GOAL_PIPELINES:
        rows.append(
            _row(
                doc,
                "a/c ≤ 1.10, every step but the last deferred",
                p,
                10,
                lambda sf, p=p: _deferred(doc, sf, p),
                1.10,
                unit="",
                meets=lambda v: v <= 1.10,
                uses=("a-deferred", "c"),
            )
        )
    return rows


def _prefect_share(doc: dict[str, Any], sf: str, p: str) -> str:
    prefect = per_step_ms(doc, sf, p, "h", "b")
    total = per_step_ms(doc, sf, p, "a", "b")
    if prefect is None or total is None:
        return "Prefect's share: needs (a), (b) and (h)"
    share = f" ({prefect / total:.0%})" if total > 0 else ""
    return f"Prefect's share (h) − (b): {prefect:.2f} ms of (a) − (b) {total:.2f} ms per step{share}"


def _deferred(doc: dict[str, Any], sf: str, p: str) -> tuple[float | None, list[str]]:
    if measurement(doc, sf, p, "a-deferred") is None:
        return None, ["no deferred-steps variant (a-deferred) in this run"]
    return ratio(doc, sf, p, "a-deferred", "c"), []


def _met(row: dict[str, Any]) -> str:
    if row["kind"] == "report":
        return "report"
    return {True: "yes", False: "**no**", None: "n/a"}[row["met"]]


def goals_markdown(doc: dict[str, Any]) -> list[str]:
    """The goals table (``doc["goals"]``)."""
    lines = []
    if doc["settings"].get("backend") == "cpu":
        lines += ["On the cpu backend this table checks the harness, not the goals.", ""]
    lines += [
        "| goal | pipeline | SF | measured | target | met | note |",
        "|---|---|---|---:|---|---|---|",
    ]
    for g in doc.get("goals", []):
        unit = f" {g['unit']}" if g.get("unit") and g["value"] is not None else ""
        target = "—" if g["target"] is None else f"{g['target']:g}{' ' + g['unit'] if g.get('unit') else ''}"
        lines.append(
            f"| {g['goal']} | {g['pipeline']} | {g['scale_factor']} | {fmt(g['value'], 3)}{unit} "
            f"| {target} | {_met(g)} | {g['note']} |"
        )
    return lines
