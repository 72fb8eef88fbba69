"""
The cost of reading one result twice in one plan, against the same query over two inputs.

``python -m benchmarks.extra_read --rows N --runs R --out DIR`` makes a table of ``N`` rows
(``k`` int64, ``v`` float64: 16 bytes a row), writes it once as parquet, and in one flow run
on the block's engine times, interleaved, ``R`` rounds (after one warm-up round) of one query:
a join of the table with a filter of itself, summed, collected to the host.

======================  ====================================================================
variant                 the query's inputs
======================  ====================================================================
``one result, 2 reads`` one result (``execute`` of the table), read twice in the plan
``two results``         two results of the same table, each read once
``two parquet scans``   the parquet file scanned twice (no result)
======================  ====================================================================

Each variant is the same ``gpu_task`` followed by ``collect``; only that pair is timed
(``time.perf_counter``, milliseconds), the results it reads are made before the timer starts.
Sharing one result between two reads costs the first variant's median less the second's (with
a bootstrap interval of that difference), per GB of the result.
Writes ``DIR/extra_read.json`` and prints one line per variant and the difference.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
from prefect import flow

from benchmarks.stats import bootstrap_ci, summary
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

VARIANTS = ("one result, 2 reads", "two results", "two parquet scans")


def query(left: pl.LazyFrame, right: pl.LazyFrame) -> pl.LazyFrame:
    """The timed query: the table joined with a filter of itself, summed."""
    return left.join(right.filter(pl.col("v") > 0.5), on="k").select(pl.len(), pl.col("v_right").sum())


@gpu_task(name="join")
def joined(left: GPUResult | str, right: GPUResult | str) -> pl.LazyFrame:
    """:func:`query` over two inputs, each a result or a parquet file's path."""

    def read(x: GPUResult | str) -> pl.LazyFrame:
        return pl.scan_parquet(x) if isinstance(x, str) else x.lazy()

    return query(read(left), read(right))


def measure(block: CudfPolarsEngine, rows: int, runs: int, folder: Path) -> dict[str, object]:
    """
    Time the three variants, ``runs`` interleaved rounds after one warm-up round.

    Parameters
    ----------
    block : CudfPolarsEngine
        The engine the flow run uses.
    rows : int
        Rows of the table (16 bytes each).
    runs : int
        Timed rounds.
    folder : pathlib.Path
        Where the parquet file is written.

    Returns
    -------
    dict
        ``ms`` (per variant: median, 95 % interval, values, in milliseconds), ``extra_read_ms``
        (the first variant's median less the second's) and its bootstrap interval, the paired
        differences, ``result_gb`` and the query's answer.

    Raises
    ------
    RuntimeError
        If the variants' answers differ.
    """
    rng = np.random.default_rng(0)
    table = pl.DataFrame({"k": np.arange(rows, dtype=np.int64), "v": rng.random(rows)})
    path = folder / "table.parquet"
    table.write_parquet(path)
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    answers: list[tuple[int, float]] = []

    @flow(task_runner=CudfPolarsTaskRunner(block))
    def rounds() -> None:
        for i in range(runs + 1):
            for variant in VARIANTS[i % 3:] + VARIANTS[:i % 3]:  # rotate the order each round
                if variant == VARIANTS[0]:
                    one = execute(table.lazy(), name="table")
                    inputs = (one, one)
                elif variant == VARIANTS[1]:
                    inputs = (execute(table.lazy(), name="table"), execute(table.lazy(), name="table"))
                else:
                    inputs = (str(path), str(path))
                start = time.perf_counter()
                out = collect(joined(*inputs))
                elapsed = (time.perf_counter() - start) * 1000
                answers.append((out.item(0, 0), out.item(0, 1)))
                if i:
                    times[variant].append(elapsed)

    rounds()
    count, total = answers[0]  # the sums may differ in their last bits (the order of the additions)
    if any(n != count or not math.isclose(t, total, rel_tol=1e-9) for n, t in answers):
        raise RuntimeError(f"the variants' answers differ: {sorted(set(answers))}")
    gb = table.estimated_size() / 1e9
    extra = [a - b for a, b in zip(times[VARIANTS[0]], times[VARIANTS[1]])]
    diff_ci = bootstrap_ci(times[VARIANTS[0]], times[VARIANTS[1]], lambda a, b: a - b)
    return {
        "rows": rows, "result_gb": gb, "backend": block.backend, "answer": [count, total],
        "ms": {v: summary(t) for v, t in times.items()},
        "extra_read_ms": statistics.median(times[VARIANTS[0]]) - statistics.median(times[VARIANTS[1]]),
        "extra_read_ms_ci": diff_ci, "paired_extra_read_ms": summary(extra),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, measure, write ``extra_read.json`` and print the summary lines."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.extra_read", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000_000, help="rows of the table (16 bytes each)")
    parser.add_argument("--runs", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--backend", default="spmd", help="the engine block's backend (default spmd)")
    parser.add_argument("--out", type=Path, required=True, help="folder for extra_read.json")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        doc = measure(CudfPolarsEngine(backend=args.backend), args.rows, args.runs, Path(folder))
    (args.out / "extra_read.json").write_text(json.dumps(doc, indent=2))
    for variant, s in doc["ms"].items():
        print(f"{variant:>20}: median {s['median']:8.1f} ms  95% CI {s['ci']}  n={s['n']}")
    gb = doc["result_gb"]
    print(f"extra read of a {gb:.2f} GB result: {doc['extra_read_ms']:.1f} ms "
          f"(95% CI {doc['extra_read_ms_ci']}), {doc['extra_read_ms'] / gb:.1f} ms per GB; "
          f"paired median {doc['paired_extra_read_ms']['median']:.1f} ms")


if __name__ == "__main__":
    main()
