"""
Figures read from ``results.json``: medians, ratios and per-step differences of the variants, and (f)'s overheads.
"""

from __future__ import annotations

from typing import Any

from benchmarks.pipelines import PIPELINES

OVERHEAD_NAMES = ("bare", "plain-task", "noop-task", "gpu-task")


def fmt(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; a dash for ``None``."""
    return "—" if value is None else f"{value:.{digits}f}"


def measurement(doc: dict[str, Any], sf: str, pipeline: str, variant: str) -> dict[str, Any] | None:
    """The entry of one (scale factor, pipeline, variant), or ``None``."""
    for m in doc["measurements"]:
        if (m["scale_factor"], m["pipeline"], m["variant"]) == (sf, pipeline, variant):
            return m
    return None


def median(doc: dict[str, Any], sf: str, pipeline: str, variant: str) -> float | None:
    """Median seconds of one measurement; ``None`` unless it ran."""
    m = measurement(doc, sf, pipeline, variant)
    return m.get("median_s") if m is not None and m["status"] == "ok" else None


def overhead_ms(doc: dict[str, Any], sf: str, name: str) -> float | None:
    """Median ms per call of one (f) timer; ``None`` unless it ran."""
    for m in doc["task_overhead"]:
        if (m["scale_factor"], m["name"]) == (sf, name) and m["status"] == "ok":
            return m["median_ms"]
    return None


def steps(pipeline: str) -> int:
    """Steps of a pipeline (3 for one this harness does not define)."""
    p = PIPELINES.get(pipeline)
    return len(p.steps) if p is not None else 3


def scale_factors(doc: dict[str, Any]) -> list[str]:
    """Scale factors of the run, as recorded (text), in the order asked."""
    return [str(s) for s in doc["settings"]["scale_factors"]]


def pipelines_of(doc: dict[str, Any]) -> list[str]:
    """Pipeline names, in the order asked."""
    return list(doc["settings"]["pipelines"])


def sf_of(doc: dict[str, Any], value: float) -> str | None:
    """The recorded text of scale factor ``value`` in this run, or ``None``."""
    return next((s for s in scale_factors(doc) if float(s) == value), None)


def per_step_ms(doc: dict[str, Any], sf: str, pipeline: str, minuend: str, subtrahend: str) -> float | None:
    """``(median(minuend) - median(subtrahend)) / steps`` in ms; ``None`` where one is missing."""
    x, y = median(doc, sf, pipeline, minuend), median(doc, sf, pipeline, subtrahend)
    if x is None or y is None:
        return None
    return (x - y) / steps(pipeline) * 1000


def ratio(doc: dict[str, Any], sf: str, pipeline: str, top: str, bottom: str) -> float | None:
    """``median(top) / median(bottom)``; ``None`` where one is missing."""
    x, y = median(doc, sf, pipeline, top), median(doc, sf, pipeline, bottom)
    return x / y if x and y else None


def our_overhead_ms(doc: dict[str, Any], sf: str) -> float | None:
    """(f) our cost per GPU task (ms): median ``gpu-task`` minus median ``plain-task``."""
    gpu, plain = overhead_ms(doc, sf, "gpu-task"), overhead_ms(doc, sf, "plain-task")
    return gpu - plain if gpu is not None and plain is not None else None


def prefect_overhead_ms(doc: dict[str, Any], sf: str) -> float | None:
    """(f) Prefect's cost per task (ms): median ``plain-task`` minus median ``bare``."""
    plain, bare = overhead_ms(doc, sf, "plain-task"), overhead_ms(doc, sf, "bare")
    return plain - bare if plain is not None and bare is not None else None
