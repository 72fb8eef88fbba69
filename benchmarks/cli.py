"""
The one command, ``python -m benchmarks``: every mode writes ``results.json``, ``results.md`` and ``chart.png``.

::

    python -m benchmarks --scale-factors 10 --runs 10 --out DIR     # the variants and (f)
    python -m benchmarks --many-tasks --tasks 200 --runs 5 --out DIR # many small tasks, cpu backend
    python -m benchmarks --session-start --runs 5 --out DIR         # the session's start
    python -m benchmarks --merge DIR1 DIR2 ... --out DIR            # several commands as one report
    python -m benchmarks --report-only --out DIR                    # the reports again, from results.json

The variants, per scale factor: the TPC-H tables (``tpchgen-cli`` parquet,
reused when already generated), one flow run in which each pipeline's variants
run round-robin, then (f) (:mod:`benchmarks.flow_run`); every final result is
compared with polars on the CPU ((e), or the fused query collected on the CPU,
untimed, when (e) is not asked for). Every measurement is guarded: a failure
is recorded in ``results.json`` and the next one runs. The exit status is 0
when nothing failed (skips for the budget included), 1 otherwise, 2 for a bad
command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import polars as pl
from polars.testing import assert_frame_equal

from benchmarks import machine, many_tasks, report, session_start
from benchmarks.flow_run import round_keys, run_variants
from benchmarks.goals import goals
from benchmarks.pipelines import PIPELINES
from benchmarks.results_file import ResultsFile, attempt, error_text, merge_documents
from benchmarks.timing import Budget
from benchmarks.tpch_data import default_data_dir, ensure_tpch, sf_label
from benchmarks.variants import SESSION_VARIANTS

ALL_VARIANTS = ("a", "a-deferred", "b", "c", "d", "e", "f", "g", "h")


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive scale factors, e.g. 1,10")
    return values


def _names(allowed: tuple[str, ...]) -> Any:
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
        description="TPC-H pipelines: our Prefect flow vs bare cudf-polars, plain Prefect tasks, host round "
        "trips and the CPU; per-task overhead; many small tasks; the session's start.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--many-tasks", action="store_true",
                      help="N tiny gpu_tasks vs N plain tasks per flow run, cpu backend")
    mode.add_argument("--session-start", action="store_true", help="time the engine session's start (no data needed)")
    mode.add_argument("--merge", type=Path, nargs="+", metavar="DIR",
                      help="merge the results.json of these folders into OUT; the first folder's entry wins")
    mode.add_argument("--report-only", action="store_true",
                      help="rewrite results.md and chart.png from OUT/results.json")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json, results.md, chart.png")
    p.add_argument("--scale-factors", type=_floats, default=[1.0, 10.0], help="e.g. 1,10 (default)")
    p.add_argument("--runs", type=int, default=10, help="timed rounds (flow runs per variant with --many-tasks, "
                   "starts with --session-start), default 10")
    p.add_argument("--warmups", type=int, default=1, help="untimed warm-up rounds, default 1")
    p.add_argument("--data-dir", type=Path, default=None, help="TPC-H parquet cache (default $PREFECT_CUDF_POLARS_TPCH "
                   "or ~/.cache/prefect-cudf-polars/tpch); a scale factor already there is reused")
    p.add_argument("--backend", choices=("spmd", "dask", "auto", "cpu"), default="spmd",
                   help="engine backend; cpu runs the harness without a GPU")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs to use (CUDA_VISIBLE_DEVICES=0..N-1 unless set), for dask")
    p.add_argument("--pipelines", type=_names(tuple(PIPELINES)), default=list(PIPELINES))
    p.add_argument("--variants", type=_names(ALL_VARIANTS), default=None,
                   help="subset of a,a-deferred,b,c,d,e,f,g,h (default: all on cpu; all but g on a GPU, "
                   "where g runs alone)")
    p.add_argument("--overhead-calls", type=int, default=300, help="timed calls per (f) timer, default 300")
    p.add_argument("--tasks", type=int, default=200, help="tasks per flow run with --many-tasks, default 200")
    p.add_argument("--profile", action="store_true",
                   help="also sample where the time goes: of the (f) gpu-task calls, of one --many-tasks flow run each")
    p.add_argument("--budget-s", type=float, default=420.0, help="wall seconds for the command; once spent, no new "
                   "round starts (one timed round always runs) and later measurements are skipped")
    p.add_argument("--tpchgen", default=None, help="path of tpchgen-cli (default: found on PATH)")
    p.add_argument("--threads", type=int, default=None, help="tpchgen-cli threads (default: all CPUs)")
    p.add_argument("--target-partition-size", type=int, default=None, help="bytes per IO partition (block field)")
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


def run_scale_factor(sf: float, args: argparse.Namespace, results: ResultsFile, **engine: Any) -> None:
    """The data, then the variants' flow run at one scale factor; failures are recorded."""
    label, pipes = sf_label(sf), [PIPELINES[n] for n in args.pipelines]
    print(f"== scale factor {label}: data, then variants {','.join(args.variants)}, interleaved", flush=True)
    try:
        data = ensure_tpch(sf, args.data_dir or default_data_dir(), tpchgen=args.tpchgen, threads=args.threads)
        results.set("data", {k: v for k, v in data.items() if k != "paths"}, sf=label)
        info = run_variants(label=label, pipelines=pipes, paths=data["paths"], settings=args, results=results, **engine)
    except Exception as exc:
        traceback.print_exc()
        results.error(f"scale factor {label}", exc)
        done = {(m["scale_factor"], m["pipeline"], m["variant"]) for m in results.doc["measurements"]}
        for p in pipes:
            for key in round_keys(args.variants):
                if (label, p.name, key) not in done:
                    results.record(label, p.name, key, exc)
        return
    results.set("engines", info, sf=label)
    references = {} if "e" in args.variants else {p.name: p.fused(data["paths"]).collect() for p in pipes}
    results.check_results(label, compare, references)


def publish(doc: dict[str, Any], out: Path) -> None:
    """Goals, ``results.md`` and ``chart.png`` from ``doc``, then ``results.json``; prints the summary."""
    out.mkdir(parents=True, exist_ok=True)
    doc["goals"] = goals(doc)
    doc["reports"] = report.write_reports(doc, out)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    print(report.markdown(doc, full=False), flush=True)


def failed(doc: dict[str, Any]) -> bool:
    """Whether a measurement failed or an error was recorded."""
    entries = doc["measurements"] + list(doc["task_overhead"].values()) + [doc["many_tasks"], doc["session_start"]]
    return bool(doc["errors"]) or any(e.get("status") == "failed" for e in entries)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (0: nothing failed)."""
    cli = parser()
    args = cli.parse_args(argv)
    on_gpu = args.backend != "cpu"
    if args.variants is None:
        args.variants = [v for v in ALL_VARIANTS if not (on_gpu and v == "g")]
    elif on_gpu and "g" in args.variants and set(args.variants) & SESSION_VARIANTS:
        cli.error("variant g runs cudf-polars' default GPU engine (collect(engine='gpu')), which cudf-polars 26.10 "
                  "does not start while the session's streaming engine is alive: run g in a command of its own "
                  "(--variants g), as benchmarks/device-bench.sh's peer step does")
    if args.report_only or args.merge:
        sources = args.merge or [args.out]
        if missing := [str(s / "results.json") for s in sources if not (s / "results.json").exists()]:
            print(f"{', '.join(missing)} does not exist: run the benchmark with --out there first.", file=sys.stderr)
            return 2
        docs = [json.loads((s / "results.json").read_text()) for s in sources]
        try:
            publish(merge_documents(docs, [str(s) for s in sources]) if args.merge else docs[0], args.out)
        except ValueError as exc:
            print(f"Not merged: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.gpus is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(args.gpus))
    from prefect_cudf_polars.blocks import CudfPolarsEngine
    from prefect_cudf_polars.blocks.backends.choice import resolve_backend

    mode = "many-tasks" if args.many_tasks else "session-start" if args.session_start else "variants"
    kept = ("runs", "warmups", "backend", "gpus", "pipelines", "overhead_calls", "tasks", "profile", "budget_s",
            "target_partition_size")
    settings = {k: getattr(args, k) for k in kept}
    settings |= {"mode": mode, "scale_factors": [sf_label(s) for s in args.scale_factors] if mode == "variants" else [],
                 "variants": args.variants if mode == "variants" else []}
    command = ["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
    results = ResultsFile(args.out, command=command, settings=settings)
    budget = Budget(args.budget_s)
    block = CudfPolarsEngine(backend=args.backend, raise_on_fail=True, target_partition_size=args.target_partition_size)
    if mode == "session-start":  # first, so that the first start in this process is a cold one
        results.set("session_start", session_start.measure(block, repeats=args.runs))
    results.set("machine", machine.describe())
    if mode == "many-tasks":
        print(f"== many small tasks: {args.tasks} per flow run, cpu backend", flush=True)
        results.set("many_tasks", attempt(lambda: many_tasks.measure(
            tasks=args.tasks, runs=args.runs, warmups=args.warmups, budget=budget, profile=args.profile)))
    elif mode == "variants":
        backend, backend_error = None, None
        try:
            backend = resolve_backend(block)[0]
        except Exception as exc:
            backend_error = exc
            results.error("backend", exc)
            print(f"GPU variants will be recorded as failed: {error_text(exc)}", flush=True)
        for sf in args.scale_factors:
            engine = {"block": block, "backend": backend, "backend_error": backend_error, "budget": budget}
            run_scale_factor(sf, args, results, **engine)
            report.write_reports(results.doc | {"goals": goals(results.doc)}, args.out)
    results.finish()
    publish(results.doc, args.out)
    return 1 if failed(results.doc) else 0
