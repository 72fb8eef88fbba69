"""
``chart.png``: median seconds per pipeline and variant, one panel per scale factor, and (f)'s panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.figures import VARIANTS, median, overhead, pipelines_of, scale_factors
from benchmarks.task_overhead import TIMERS


def chart(doc: dict[str, Any], path: Path) -> str | None:
    """
    Draw ``chart.png``: median seconds per pipeline and variant (log scale) per scale factor, and (f) (ms per call).

    Returns
    -------
    str or None
        ``None`` when written; else why not (matplotlib missing, nothing measured).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no chart: {exc} (pip install matplotlib)"
    ok = {m["scale_factor"] for m in doc["measurements"] if m["status"] == "ok"}
    sfs = [sf for sf in scale_factors(doc) if sf in ok]
    f_sfs = [sf for sf in scale_factors(doc) if overhead(doc, sf)]
    if not sfs and not f_sfs:
        return "no chart: no variant was measured"
    pipes = pipelines_of(doc)
    fig, axes = plt.subplots(1, len(sfs) + 1, figsize=(6 * (len(sfs) + 1), 4.8), squeeze=False)
    width = 0.8 / len(VARIANTS)
    for ax, sf in zip(axes[0], sfs, strict=False):
        for i, (v, (short, _)) in enumerate(VARIANTS.items()):
            xs = [j + (i - (len(VARIANTS) - 1) / 2) * width for j in range(len(pipes))]
            ax.bar(xs, [median(doc, sf, p, v) or 0.0 for p in pipes], width, label=short)
        ax.set_yscale("log")
        ax.set_xticks(range(len(pipes)), [p.split("-")[0] for p in pipes])
        ax.set_ylabel("median seconds (log)")
        ax.set_title(f"TPC-H SF {sf}, backend {doc['settings']['backend']}")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for i, sf in enumerate(f_sfs):
        timers = overhead(doc, sf)["timers"]  # type: ignore[index]
        xs = [j + (i - (len(f_sfs) - 1) / 2) * (0.8 / len(f_sfs)) for j in range(len(TIMERS))]
        ax.bar(xs, [timers[n]["median"] for n in TIMERS], 0.8 / len(f_sfs), label=f"SF {sf}")
    ax.set_xticks(range(len(TIMERS)), TIMERS)
    ax.set_ylabel("median ms per call")
    ax.set_title("(f) per-task overhead, tiny query")
    if f_sfs:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
