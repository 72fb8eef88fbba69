"""
What the reports read from ``results.json``: the variants' names, medians, ratios, per-step differences and (f).
"""

from __future__ import annotations

from typing import Any

from benchmarks.pipelines import PIPELINES

#: Each measured variant: short label, then what runs.
VARIANTS: dict[str, tuple[str, str]] = {
    "a": ("(a) ours", "our Prefect flow: gpu_tasks, GPU results between tasks"),
    "a-deferred": ("(a) deferred", "(a) with every step but the last deferred, fused into the last task's engine call"),
    "h": ("(h) plain tasks", "Prefect's floor: plain Prefect tasks making (b)'s engine calls"),
    "b": ("(b) chained", "bare engine, chained engine.execute()"),
    "c": ("(c) fused", "bare engine, one fused query"),
    "d": ("(d) round trips", "bare engine, collect() + .lazy() host round trips"),
    "e": ("(e) CPU", "polars on the CPU, fused query"),
    "g": ("(g) peer", "plain Prefect tasks, collect(engine='gpu'), DataFrames between tasks, default cache policy"),
    "g-nocache": ("(g) NO_CACHE", "(g) with cache_policy=NO_CACHE"),
}


def fmt(value: float | None, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; a dash for ``None``."""
    return "—" if value is None else f"{value:.{digits}f}"


def fmt_ci(ci: list[float] | tuple[float, float] | None, digits: int = 3) -> str:
    """A 95 % interval as ``[low, high]``; a dash for ``None``."""
    return "—" if not ci else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"


def measurement(doc: dict[str, Any], sf: str, pipeline: str, variant: str) -> dict[str, Any] | None:
    """The entry of one (scale factor, pipeline, variant), or ``None``."""
    key = (sf, pipeline, variant)
    return next((m for m in doc["measurements"] if (m["scale_factor"], m["pipeline"], m["variant"]) == key), None)


def median(doc: dict[str, Any], sf: str, pipeline: str, variant: str) -> float | None:
    """Median seconds of one measurement; ``None`` unless it ran."""
    m = measurement(doc, sf, pipeline, variant)
    return m["median_s"] if m is not None and m["status"] == "ok" else None


def steps(pipeline: str) -> int:
    """Steps of a pipeline (3 for one this harness does not define)."""
    return len(PIPELINES[pipeline].steps) if pipeline in PIPELINES else 3


def scale_factors(doc: dict[str, Any]) -> list[str]:
    """Scale factors of the run, as recorded (text), in the order asked."""
    return [str(s) for s in doc["settings"].get("scale_factors", [])]


def pipelines_of(doc: dict[str, Any]) -> list[str]:
    """Pipeline names, in the order asked."""
    return list(doc["settings"].get("pipelines", []))


def sf_of(doc: dict[str, Any], value: float) -> str | None:
    """The recorded text of scale factor ``value`` in this run, or ``None``."""
    return next((s for s in scale_factors(doc) if float(s) == value), None)


def per_step_ms(doc: dict[str, Any], sf: str, pipeline: str, minuend: str, subtrahend: str) -> float | None:
    """``(median(minuend) - median(subtrahend)) / steps`` in ms; ``None`` where one is missing."""
    x, y = median(doc, sf, pipeline, minuend), median(doc, sf, pipeline, subtrahend)
    return None if x is None or y is None else (x - y) / steps(pipeline) * 1000


def ratio(doc: dict[str, Any], sf: str, pipeline: str, top: str, bottom: str) -> float | None:
    """``median(top) / median(bottom)``; ``None`` where one is missing."""
    x, y = median(doc, sf, pipeline, top), median(doc, sf, pipeline, bottom)
    return x / y if x and y else None


def overhead(doc: dict[str, Any], sf: str) -> dict[str, Any] | None:
    """(f) at ``sf`` (:func:`benchmarks.task_overhead.measure`) where it ran, else ``None``."""
    value = doc["task_overhead"].get(sf)
    return value if value and value["status"] == "ok" else None
