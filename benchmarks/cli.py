"""
The one command: generate TPC-H data, run the variants of every pipeline interleaved, write JSON, markdown and a chart.

::

    python -m benchmarks --scale-factors 1,10 --runs 10 --out DIR
    python -m benchmarks --breakdown --scale-factors 10 --out DIR
    python -m benchmarks --session-start --out DIR
    python -m benchmarks --merge DIR1 DIR2 ... --out DIR
    python -m benchmarks --report-only --out DIR

Modes:

* variants (the default), for each scale factor: data (``tpchgen-cli``
  parquet, reused when already generated); one flow run with one engine
  session in which each pipeline's variants run round-robin, then (f)
  (:mod:`benchmarks.prefect_flows`); every final result compared with polars
  on the CPU ((e), or the fused query collected on the CPU untimed when (e)
  is not asked for);
* ``--breakdown``: where the per-step time goes (:mod:`benchmarks.breakdown`);
* ``--session-start``: the engine session's start, split into its parts
  (:mod:`benchmarks.session_start`);
* ``--merge``: the ``results.json`` of several commands (a run split by
  ``--variants`` and ``--pipelines``) as one, with its reports;
* ``--report-only``: rewrite ``results.md`` and ``chart.png`` from ``results.json``.

Every measurement is guarded: a failure is recorded in ``results.json`` and the
next one runs. ``results.json`` is rewritten after each measurement; goals,
``results.md`` and ``chart.png`` after each scale factor. The exit status is 0
when nothing failed (skips for the budget included), 1 otherwise.
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

from benchmarks import breakdown, goals, machine, report, session_start
from benchmarks.pipelines import PIPELINES, Pipeline
from benchmarks.prefect_flows import OVERHEAD, SESSION_VARIANTS, round_keys, run_variants
from benchmarks.results_file import ResultsFile, error_text, merge_documents
from benchmarks.timing import Budget
from benchmarks.tpch_data import default_data_dir, ensure_tpch, sf_label

ALL_VARIANTS = ("a", "a-deferred", "b", "c", "d", "e", "f", "g", "h")


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
        description="TPC-H pipelines: our Prefect flow vs bare cudf-polars, plain Prefect "
        "tasks, host round trips and the CPU; where the per-step time goes; the session's start.",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--breakdown",
        action="store_true",
        help="time each step with and without each piece of ours, in one flow run and one "
        "session per scale factor (instead of the variants)",
    )
    mode.add_argument(
        "--session-start",
        action="store_true",
        help="time the engine session's start, split into ours and cudf-polars' (no data needed)",
    )
    mode.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="merge the results.json of these folders into OUT (a run split into several "
        "commands); the first folder's entry wins where two hold the same measurement",
    )
    mode.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite results.md and chart.png from OUT/results.json (e.g. after a timeout)",
    )
    p.add_argument("--scale-factors", type=_floats, default=[1.0, 10.0], help="e.g. 1,10 (default)")
    p.add_argument(
        "--runs",
        type=int,
        default=10,
        help="timed rounds (median per variant; session starts with --session-start), default 10",
    )
    p.add_argument("--warmups", type=int, default=1, help="untimed warm-up rounds, default 1")
    p.add_argument("--out", type=Path, required=True, help="folder for results.json/.md, chart.png")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="TPC-H parquet cache (default $PREFECT_CUDF_POLARS_TPCH or ~/.cache/prefect-cudf-polars/tpch); "
        "a scale factor already generated there is reused",
    )
    p.add_argument(
        "--backend",
        choices=("spmd", "dask", "auto", "cpu"),
        default="spmd",
        help="engine backend; cpu runs the harness without a GPU",
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
        default=None,
        help="subset of a,a-deferred,b,c,d,e,f,g,h (default: all on the cpu backend, all but g on a GPU "
        "backend, where g runs on its own; g also runs its NO_CACHE sub-variant)",
    )
    p.add_argument("--overhead-calls", type=int, default=50, help="timed calls per (f) timer")
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="wall seconds for the whole command; once spent, no new round starts "
        "(at least one timed round per started pipeline) and later measurements are skipped",
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


def load_data(
    sf: float, args: argparse.Namespace, results: ResultsFile, keys: list[tuple[str, str]]
) -> dict[str, str] | None:
    """The tables of one scale factor (generated unless already there); ``None`` after a recorded failure."""
    label = sf_label(sf)
    print(f"== scale factor {label}: data", flush=True)
    try:
        data = ensure_tpch(
            sf, args.data_dir or default_data_dir(), tpchgen=args.tpchgen, threads=args.threads
        )
    except Exception as exc:
        traceback.print_exc()
        results.error(f"data sf{label}", exc)
        for key in keys:
            results.fail(label, key, exc)
        return None
    results.set("data", {k: v for k, v in data.items() if k != "paths"}, sf=label)
    return data["paths"]  # type: ignore[return-value]


def cpu_references(
    pipes: list[Pipeline], paths: dict[str, str], results: ResultsFile, label: str
) -> dict[str, pl.DataFrame]:
    """Each pipeline's fused query collected on polars' CPU engine, untimed (the reference without (e))."""
    frames = {}
    for p in pipes:
        try:
            frames[p.name] = p.fused(paths).collect()
        except Exception as exc:
            results.error(f"cpu reference sf{label} {p.name}", exc)
    return frames


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
    """The variants at one scale factor (see the module docstring)."""
    label = sf_label(sf)
    pipes: list[Pipeline] = [PIPELINES[n] for n in args.pipelines]
    keys = [(p.name, v) for p in pipes for v in round_keys(args.variants)]
    if "f" in args.variants:
        keys += [("task-overhead", OVERHEAD), ("task-overhead", "profile")]
    paths = load_data(sf, args, results, keys)
    if paths is None:
        return
    print(f"== scale factor {label}: variants {','.join(args.variants)}, interleaved", flush=True)
    try:
        info = run_variants(
            label=label,
            block=block,
            backend=backend,
            backend_error=backend_error,
            pipelines=pipes,
            paths=paths,
            variants=args.variants,
            runs=args.runs,
            warmups=args.warmups,
            budget=budget,
            overhead_calls=args.overhead_calls,
            guard=results.guard_for(label),
        )
    except Exception as exc:
        traceback.print_exc()
        results.error(f"flow run sf{label}", exc)
        for key in keys:
            results.fail(label, key, exc)
        info = {}
    results.set("engines", info, sf=label)
    references = {} if "e" in args.variants else cpu_references(pipes, paths, results, label)
    results.check_results(label, compare, references)


def run_breakdown(
    sf: float, *, args: argparse.Namespace, block: Any, results: ResultsFile, budget: Budget
) -> None:
    """The per-step breakdown at one scale factor."""
    label = sf_label(sf)
    paths = load_data(sf, args, results, [])
    if paths is None:
        return
    print(f"== scale factor {label}: per-step breakdown", flush=True)
    try:
        value = breakdown.run_breakdown(
            label=label,
            block=block,
            pipelines=[PIPELINES[n] for n in args.pipelines],
            paths=paths,
            runs=args.runs,
            warmups=args.warmups,
            budget=budget,
        )
    except Exception as exc:
        traceback.print_exc()
        results.error(f"breakdown sf{label}", exc)
        value = {"status": "failed", "error": error_text(exc)}
    results.set("breakdown", value, sf=label)


def rewrite_reports(out: Path) -> int:
    """Rewrite ``results.md`` and ``chart.png`` from ``out/results.json``; 2 when it is missing."""
    source = Path(out) / "results.json"
    if not source.exists():
        print(
            f"{source} does not exist: run the benchmark with --out {out} first.", file=sys.stderr
        )
        return 2
    doc = json.loads(source.read_text())
    doc["goals"] = goals.goals(doc)
    print(report.write_reports(doc, Path(out)))
    return 0


def merge_parts(out: Path, parts: list[Path]) -> int:
    """Merge the parts' ``results.json`` into ``out``; 2 when one is missing or they do not fit."""
    docs = []
    for part in parts:
        source = Path(part) / "results.json"
        if not source.exists():
            print(f"{source} does not exist: nothing merged.", file=sys.stderr)
            return 2
        docs.append(json.loads(source.read_text()))
    try:
        doc = merge_documents(docs, [str(p) for p in parts])
    except ValueError as exc:
        print(f"Not merged: {exc}", file=sys.stderr)
        return 2
    doc["goals"] = goals.goals(doc)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    doc["reports"] = report.write_reports(doc, out)
    (out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    print(report.summary(doc), flush=True)
    return 0


def failed(doc: dict[str, Any]) -> bool:
    """Whether a measurement, a breakdown mode or the session-start mode failed, or an error was recorded."""
    if doc["errors"]:
        return True
    if any(m["status"] == "failed" for m in doc["measurements"] + doc["task_overhead"]):
        return True
    for value in doc["breakdown"].values():
        modes = value.get("modes", {}).values()
        if value.get("status") == "failed" or any(m["status"] not in ("ok", "skipped") for m in modes):
            return True
    return doc["session_start"].get("status", "ok") == "failed"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (0: nothing failed)."""
    cli = parser()
    args = cli.parse_args(argv)
    on_gpu = args.backend != "cpu"
    if args.variants is None:
        args.variants = [v for v in ALL_VARIANTS if not (on_gpu and v == "g")]
    elif on_gpu and "g" in args.variants and set(args.variants) & SESSION_VARIANTS:
        cli.error(
            "variant g runs cudf-polars' default GPU engine (collect(engine='gpu')), which "
            "cudf-polars 26.10 does not start while the engine session's explicit streaming "
            "engine is alive: run g in a command of its own (--variants g), as "
            "benchmarks/device-bench.sh's peer step does"
        )
    if args.report_only:
        return rewrite_reports(args.out)
    if args.merge:
        return merge_parts(args.out, args.merge)
    if args.gpus is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(args.gpus))
    from prefect_cudf_polars.blocks import CudfPolarsEngine
    from prefect_cudf_polars.blocks.backends.choice import resolve_backend

    mode = "breakdown" if args.breakdown else "session-start" if args.session_start else "variants"
    settings = {
        "mode": mode,
        "scale_factors": [] if mode == "session-start" else [sf_label(s) for s in args.scale_factors],
        "runs": args.runs,
        "warmups": args.warmups,
        "backend": args.backend,
        "gpus": args.gpus,
        "pipelines": args.pipelines,
        "variants": args.variants if mode == "variants" else [],
        "overhead_calls": args.overhead_calls,
        "budget_s": args.budget_s,
        "target_partition_size": args.target_partition_size,
    }
    command = ["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
    results = ResultsFile(args.out, command=command, settings=settings)
    budget = Budget(args.budget_s)
    block = CudfPolarsEngine(
        backend=args.backend, raise_on_fail=True, target_partition_size=args.target_partition_size
    )
    if mode == "session-start":
        # First, so that the first start in this process is a cold one (the machine's
        # description below loads the CUDA runtime).
        print("== session start", flush=True)
        results.set("session_start", session_start.measure(block, repeats=args.runs))
        results.set("machine", machine.describe())
    else:
        results.set("machine", machine.describe())
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
            if mode == "breakdown":
                run_breakdown(sf, args=args, block=block, results=results, budget=budget)
            else:
                run_scale_factor(
                    sf,
                    args=args,
                    backend=backend,
                    backend_error=backend_error,
                    block=block,
                    results=results,
                    budget=budget,
                )
            results.set("goals", goals.goals(results.doc))
            results.set("reports", report.write_reports(results.doc, args.out))
    results.finish()
    results.set("goals", goals.goals(results.doc))
    results.set("reports", report.write_reports(results.doc, args.out))
    print(report.summary(results.doc), flush=True)
    return 1 if failed(results.doc) else 0
