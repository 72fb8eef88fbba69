"""
The one command: generate TPC-H data, run every variant of every pipeline, write JSON, markdown and a chart.

::

    python -m benchmarks --scale-factors 1,10 --runs 5 --out DIR

For each scale factor, in this order (the most important first, so that a spent
``--budget-s`` cuts the least important):

1. data: ``tpchgen-cli`` parquet (reused when already generated);
2. (a) our Prefect flow for every pipeline, then (f) ``gpu-task`` and the
   task-path profile, in one flow run with one engine session;
3. a bare engine: (b) chained, (c) fused, (d) host round trips per pipeline,
   then (f) ``bare``, ``plain-task`` and ``noop-task`` in a plain flow run;
4. (e) polars on the CPU per pipeline;
5. every final result compared with the CPU's; goals; ``results.md`` and
   ``chart.png`` rewritten.

Every measurement is guarded: a failure is recorded in ``results.json`` and the
next one runs. ``results.json`` is rewritten after each measurement. The exit
status is 0 when nothing failed (skips for the budget included), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import polars as pl
from polars.testing import assert_frame_equal

from benchmarks import bare_variants, machine, report
from benchmarks.pipelines import PIPELINES, Pipeline
from benchmarks.prefect_flows import OURS_OVERHEAD, PLAIN_OVERHEAD, run_ours, run_plain_tasks
from benchmarks.results_file import ResultsFile, error_text
from benchmarks.timing import Budget, repeat
from benchmarks.tpch_data import default_data_dir, ensure_tpch, sf_label

ALL_VARIANTS = ("a", "b", "c", "d", "e", "f")


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of numbers"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive scale factors, e.g. 1,10")
    return values


def _names(allowed: tuple[str, ...] | list[str]) -> Any:
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        if bad := [n for n in names if n not in allowed]:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="TPC-H pipelines: our Prefect flow vs bare cudf-polars, host round trips and the CPU.",
    )
    p.add_argument("--scale-factors", type=_floats, default=[1.0, 10.0], help="e.g. 1,10 (default)")
    p.add_argument("--runs", type=int, default=5, help="timed runs per variant (median), default 5")
    p.add_argument("--warmups", type=int, default=1, help="untimed warm-up runs, default 1")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json/.md, chart.png")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite results.md and chart.png from OUT/results.json (e.g. after a timeout)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="TPC-H parquet cache (default $PREFECT_CUDF_POLARS_TPCH or ~/.cache/prefect-cudf-polars/tpch)",
    )
    p.add_argument(
        "--backend",
        choices=("spmd", "dask", "auto", "cpu"),
        default="spmd",
        help="engine backend for (a)-(d) and (f); cpu runs the harness without a GPU",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="GPUs to use (sets CUDA_VISIBLE_DEVICES=0..N-1 unless set); for --backend dask",
    )
    p.add_argument("--pipelines", type=_names(list(PIPELINES)), default=list(PIPELINES))
    p.add_argument(
        "--variants",
        type=_names(ALL_VARIANTS),
        default=list(ALL_VARIANTS),
        help="subset of a,b,c,d,e,f (default all)",
    )
    p.add_argument("--overhead-calls", type=int, default=50, help="timed calls per (f) measurement")
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="wall seconds for the whole command; once spent, no new run starts "
        "(at least one run per started variant) and later variants are skipped",
    )
    p.add_argument("--tpchgen", default=None, help="path of tpchgen-cli (default: found on PATH)")
    p.add_argument(
        "--threads", type=int, default=None, help="tpchgen-cli threads (default: all CPUs)"
    )
    p.add_argument(
        "--target-partition-size",
        type=int,
        default=None,
        help="bytes per IO partition (engine block field; default cudf-polars')",
    )
    return p


def compare(got: Any, want: Any) -> str | None:
    """``None`` when two final results agree (floats to 1e-5 relative), else why not."""
    if not isinstance(got, pl.DataFrame) or not isinstance(want, pl.DataFrame):
        return f"not DataFrames: {type(got).__name__} vs {type(want).__name__}"
    try:
        assert_frame_equal(got, want, check_exact=False, rtol=1e-5, check_dtypes=False)
    except AssertionError as exc:
        return str(exc)
    return None


def run_scale_factor(
    sf: float,
    *,
    args: argparse.Namespace,
    backend: str | None,
    backend_error: Exception | None,
    block: Any,
    results: ResultsFile,
    budget: Budget,
) -> None:
    """Run every phase for one scale factor (see the module docstring)."""
    label = sf_label(sf)
    pipes: list[Pipeline] = [PIPELINES[n] for n in args.pipelines]
    want = set(args.variants)
    guard = results.guard_for(label)
    gpu_keys = [(p.name, v) for p in pipes for v in "abcd" if v in want]
    if "f" in want:
        gpu_keys += [("task-overhead", n) for n in (OURS_OVERHEAD, "profile", PLAIN_OVERHEAD)]

    print(f"== scale factor {label}: data", flush=True)
    try:
        data = ensure_tpch(
            sf, args.data_dir or default_data_dir(), tpchgen=args.tpchgen, threads=args.threads
        )
    except Exception as exc:
        traceback.print_exc()
        results.error(f"data sf{label}", exc)
        for key in gpu_keys + [(p.name, "e") for p in pipes if "e" in want]:
            results.fail(label, key, exc)
        return
    paths = data["paths"]
    results.set("data", {k: v for k, v in data.items() if k != "paths"}, sf=label)
    engines: dict[str, Any] = {}

    if backend is None:
        for key in gpu_keys:
            results.fail(label, key, backend_error or RuntimeError("no backend"))
    else:
        if "a" in want or "f" in want:
            print(f"== scale factor {label}: (a) our Prefect flow", flush=True)
            try:
                engines["ours"] = run_ours(
                    label=label,
                    block=block,
                    pipelines=pipes if "a" in want else [],
                    paths=paths,
                    runs=args.runs,
                    warmups=args.warmups,
                    budget=budget,
                    overhead_calls=args.overhead_calls,
                    overhead="f" in want,
                    guard=guard,
                )
            except Exception as exc:
                traceback.print_exc()
                results.error(f"our flow sf{label}", exc)
                for key in [k for k in gpu_keys if k[1] in ("a", OURS_OVERHEAD, "profile")]:
                    results.fail(label, key, exc)
        if want & set("bcdf"):
            print(f"== scale factor {label}: (b)-(d) bare engine", flush=True)
            run_bare(
                label, backend, block, pipes, paths, want, args, guard, results, budget, engines
            )
    results.set("engines", engines, sf=label)

    if "e" in want:
        print(f"== scale factor {label}: (e) polars CPU", flush=True)
        for p in pipes:
            guard(
                (p.name, "e"),
                lambda p=p: repeat(
                    lambda: bare_variants.cpu_polars(p, paths),
                    runs=args.runs,
                    warmups=args.warmups,
                    budget=budget,
                ),
            )
    results.check_results(label, compare)


def run_bare(
    label: str,
    backend: str,
    block: Any,
    pipes: list[Pipeline],
    paths: dict[str, str],
    want: set[str],
    args: argparse.Namespace,
    guard: Any,
    results: ResultsFile,
    budget: Budget,
    engines: dict[str, Any],
) -> None:
    """(b), (c), (d) per pipeline and (f) bare / plain-task / noop-task on one bare engine."""
    keys = [(p.name, v) for p in pipes for v in "bcd" if v in want]
    if "f" in want:
        keys += [("task-overhead", PLAIN_OVERHEAD)]
    try:
        engine = bare_variants.BareEngine(backend, block)
    except Exception as exc:
        traceback.print_exc()
        results.error(f"bare engine sf{label}", exc)
        for key in keys:
            results.fail(label, key, exc)
        return
    engines["bare_engine_start_s"] = engine.start_s
    runners = {"b": bare_variants.chained, "c": bare_variants.fused, "d": bare_variants.round_trips}
    try:
        for p in pipes:
            for v in "bcd":
                if v in want:
                    guard(
                        (p.name, v),
                        lambda p=p, fn=runners[v]: repeat(
                            lambda: fn(engine, p, paths),
                            runs=args.runs,
                            warmups=args.warmups,
                            budget=budget,
                        ),
                    )
        if "f" in want:
            try:
                run_plain_tasks(
                    label=label,
                    engine=engine,
                    paths=paths,
                    calls=args.overhead_calls,
                    warmups=max(3, args.warmups),
                    guard=guard,
                )
            except Exception as exc:
                traceback.print_exc()
                results.fail(label, ("task-overhead", PLAIN_OVERHEAD), exc)
    finally:
        try:
            engine.shutdown()
        except Exception as exc:
            results.error(f"bare engine shutdown sf{label}", exc)


def rewrite_reports(out: Path) -> int:
    """Rewrite ``results.md`` and ``chart.png`` from ``out/results.json``; 2 when it is missing."""
    import json

    source = Path(out) / "results.json"
    if not source.exists():
        print(
            f"{source} does not exist: run the benchmark with --out {out} first.", file=sys.stderr
        )
        return 2
    doc = json.loads(source.read_text())
    doc["goals"] = report.goals(doc)
    print(report.write_reports(doc, Path(out)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (0: nothing failed)."""
    args = parser().parse_args(argv)
    if args.report_only:
        return rewrite_reports(args.out)
    if args.gpus is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(args.gpus))
    from prefect_cudf_polars.blocks import CudfPolarsEngine
    from prefect_cudf_polars.blocks.backends.choice import resolve_backend

    settings = {
        "scale_factors": [sf_label(s) for s in args.scale_factors],
        "runs": args.runs,
        "warmups": args.warmups,
        "backend": args.backend,
        "gpus": args.gpus,
        "pipelines": args.pipelines,
        "variants": args.variants,
        "overhead_calls": args.overhead_calls,
        "budget_s": args.budget_s,
        "target_partition_size": args.target_partition_size,
    }
    command = ["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
    results = ResultsFile(args.out, command=command, settings=settings)
    budget = Budget(args.budget_s)
    results.set("machine", machine.describe())
    block = CudfPolarsEngine(
        backend=args.backend, raise_on_fail=True, target_partition_size=args.target_partition_size
    )
    backend: str | None
    backend_error: Exception | None = None
    try:
        backend, _ = resolve_backend(block)
    except Exception as exc:
        backend = None
        backend_error = exc
        results.error("backend", exc)
        print(f"GPU variants will be recorded as failed: {error_text(exc)}", flush=True)
    for sf in args.scale_factors:
        run_scale_factor(
            sf,
            args=args,
            backend=backend,
            backend_error=backend_error,
            block=block,
            results=results,
            budget=budget,
        )
        results.set("goals", report.goals(results.doc))
        results.set("reports", report.write_reports(results.doc, args.out))
    results.finish()
    results.set("reports", report.write_reports(results.doc, args.out))
    print(report.markdown(results.doc), flush=True)
    failed = [
        m
        for m in results.doc["measurements"] + results.doc["task_overhead"]
        if m["status"] == "failed"
    ]
    return 1 if failed or results.doc["errors"] else 0
