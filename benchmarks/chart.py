"""
``chart.png``: median seconds per pipeline and variant, one panel per scale factor, and (f)'s panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.figures import OVERHEAD_NAMES, median, overhead_ms, pipelines_of, scale_factors
from benchmarks.variant_names import SHORT


def has_variants(doc: dict[str, Any], sf: str) -> bool:
    """Whether any pipeline variant was measured at ``sf``."""
    return any(m["scale_factor"] == sf for m in doc["measurements"])


def chart(doc: dict[str, Any], path: Path) -> str | None:
    """
    Draw ``chart.png``: median seconds per pipeline and variant (log scale), one panel
    per scale factor with variants, and the per-task overhead panel.

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
    sfs = [sf for sf in scale_factors(doc) if has_variants(doc, sf)]
    f_sfs = [sf for sf in scale_factors(doc) if any(overhead_ms(doc, sf, n) for n in OVERHEAD_NAMES)]
    if not sfs and not f_sfs:
        return "no chart: no variant was measured"
    pipes = pipelines_of(doc)
    fig, axes = plt.subplots(1, len(sfs) + 1, figsize=(6 * (len(sfs) + 1), 4.8), squeeze=False)
    width = 0.8 / len(SHORT)
    for ax, sf in zip(axes[0], sfs, strict=False):
        for i, v in enumerate(SHORT):
            values = [median(doc, sf, p, v) or 0.0 for p in pipes]
            xs = [j + (i - (len(SHORT) - 1) / 2) * width for j in range(len(pipes))]
            ax.bar(xs, values, width, label=SHORT[v])
        ax.set_yscale("log")
        ax.set_xticks(range(len(pipes)))
        ax.set_xticklabels([p.split("-")[0] for p in pipes])
        ax.set_ylabel("median seconds (log)")
        ax.set_title(f"TPC-H SF {sf}, backend {doc['settings']['backend']}")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for i, sf in enumerate(f_sfs):
        values = [overhead_ms(doc, sf, n) or 0.0 for n in OVERHEAD_NAMES]
        xs = [j + (i - (len(f_sfs) - 1) / 2) * (0.8 / len(f_sfs)) for j in range(len(OVERHEAD_NAMES))]
        ax.bar(xs, values, 0.8 / len(f_sfs), label=f"SF {sf}")
    ax.set_xticks(range(len(OVERHEAD_NAMES)))
    ax.set_xticklabels(OVERHEAD_NAMES)
    ax.set_ylabel("median ms per call")
    ax.set_title("(f) per-task overhead, tiny query")
    if f_sfs:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
