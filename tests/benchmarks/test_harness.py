"""
The benchmark harness on the CPU (SF 0.01, ``--backend cpu``), so it never rots, and on a GPU (marked ``gpu``).

The real command, ``python -m benchmarks``, runs in a subprocess against the test
session's Prefect API, with data from the real ``tpchgen-cli``. No timing target
is asserted: only that every variant ran round by round and matches polars on the
CPU, that the figures are present, sane and follow from one another (medians
inside their intervals, differences of the medians, goals from the
measurements), that (f)'s GPU task sent its events, that the many-small-tasks
flow runs released every result, and that the files are written.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import polars.selectors as cs
import pytest
from polars.testing import assert_frame_equal

from api_reads import task_run_list
from prefect_cudf_polars.blocks.backends import probe as gpu_probe

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

PIPELINES = ("q1-pricing-summary", "q3-shipping-priority", "q5-local-supplier-volume")
PIPELINE_VARIANTS = ("a", "a-deferred", "h", "b", "c", "d", "g", "g-nocache", "e")
#: Variants that run a chain of Prefect tasks, by the prefix of their task names ((a): none).
TASK_PREFIXES = {"deferred.": "a-deferred", "floor.": "h", "peer-nocache.": "g-nocache", "peer.": "g"}
SF001_ROWS = {"lineitem": 60_175, "orders": 15_000, "customer": 1_500, "supplier": 100, "nation": 25, "region": 5}
CALLS = 6  # (f) calls per timer: the fewest with a 95 % interval on the median
PNG = b"\x89PNG\r\n\x1a\n"


@dataclass
class BenchRun:
    """A finished ``python -m benchmarks`` command."""

    returncode: int
    output: str
    out: Path

    @property
    def results(self) -> dict[str, Any]:
        return json.loads((self.out / "results.json").read_text())


@pytest.fixture(scope="module")
def tpch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One TPC-H data folder for the module (SF 0.01 is generated once)."""
    return tmp_path_factory.mktemp("tpch")


@pytest.fixture(scope="module")
def run_bench(tpch_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Run ``python -m benchmarks ARGS --out <tmp> --data-dir <module tpch>`` against the test API."""
    from prefect.settings import get_current_settings

    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url), "PYTHONUNBUFFERED": "1"}

    def run(*args: str, timeout: float = 240) -> BenchRun:
        out = tmp_path_factory.mktemp("bench-out")
        command = [sys.executable, "-m", "benchmarks", *args, "--out", str(out), "--data-dir", str(tpch_dir)]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        return BenchRun(done.returncode, done.stdout + done.stderr, out)

    return run


def small(backend: str, *args: str, runs: int = 2, warmups: int = 1) -> tuple[str, ...]:
    """A run at SF 0.01."""
    return ("--scale-factors", "0.01", "--runs", str(runs), "--warmups", str(warmups), "--backend", backend, *args)


@pytest.fixture(scope="module")
def cpu_run(run_bench):
    return run_bench(*small("cpu", "--overhead-calls", str(CALLS), "--profile"))


def test_cpu_run_records_every_variant_and_matches_cpu(cpu_run):
    assert cpu_run.returncode == 0, cpu_run.output[-4000:]
    doc = cpu_run.results
    got = {(m["pipeline"], m["variant"]): m for m in doc["measurements"]}
    assert set(got) == {(p, v) for p in PIPELINES for v in PIPELINE_VARIANTS}
    for (pipeline, variant), m in got.items():
        assert m["status"] == "ok", (pipeline, variant, m.get("error"))
        assert len(m["runs_s"]) == 2 and len(m["warmup_s"]) == 1
        assert m["median_s"] == pytest.approx(statistics.median(m["runs_s"])) and m["median_s"] > 0
        assert m["reference"] == "e" and m["matches_reference"] is True, m.get("mismatch")
        if variant not in ("c", "e"):  # every chained variant times each of the 3 steps
            assert len(m["steps_median_s"]) == 3
    engines = doc["engines"]["0.01"]
    session = engines["session"]
    assert session["backend"] == "cpu" and session["teardown"] == "complete"
    assert session["counts"]["produced"] == session["counts"]["consumed"] + session["counts"]["released_unconsumed"]
    # (b), (h) and the bare calls ran on the engine's owner thread, not the flow's.
    assert engines["threads"] == {"flow": "MainThread", "engine": engines["threads"]["engine"]}
    assert engines["threads"]["engine"].startswith("cudf-polars-engine-owner-")
    assert doc["data"]["0.01"]["rows"] == SF001_ROWS
    assert doc["machine"]["packages"]["polars"] == pl.__version__
    assert doc["finished_at"] is not None


def test_task_overhead_gives_medians_with_intervals_and_our_overhead(cpu_run):
    f = cpu_run.results["task_overhead"]["0.01"]
    assert f["status"] == "ok" and f["calls"] == CALLS
    for name in ("gpu-task", "plain-task", "bare", "noop-task"):
        timer = f["timers"][name]
        assert len(timer["values"]) == CALLS and all(v > 0 for v in timer["values"])
        low, high = timer["ci"]
        assert min(timer["values"]) <= low <= timer["median"] <= high <= max(timer["values"])
    ours, prefect = f["differences"]["ours"], f["differences"]["prefect"]
    assert ours["median_ms"] == pytest.approx(f["timers"]["gpu-task"]["median"] - f["timers"]["plain-task"]["median"])
    assert prefect["median_ms"] == pytest.approx(f["timers"]["plain-task"]["median"] - f["timers"]["bare"]["median"])
    assert ours["ci_ms"][0] <= ours["ci_ms"][1]
    profile = f["profile"]
    assert profile["busy_s"] > 0 and 0 < profile["with_our_code_s"] <= profile["busy_s"]
    assert all(name.startswith("prefect_cudf_polars.") and seconds > 0 for name, seconds in profile["top_ours"])


def test_task_overhead_is_measured_with_the_products_events_on(cpu_run):
    """Every (f) GPU task call sent its ``result.created`` event (3 warm-ups, the timed calls, the profiled ones)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter, EventResourceFilter

    flow_run_id = cpu_run.results["engines"]["0.01"]["flow_run_id"]
    flt = EventFilter(
        event=EventNameFilter(name=["prefect_cudf_polars.result.created"]),
        resource=EventResourceFilter(labels={"prefect.resource.name": "tiny-gpu-query"}),
        related=EventRelatedFilter(id=[f"prefect.flow-run.{flow_run_id}"]),
    )
    deadline = time.monotonic() + 30
    while True:  # events are persisted in the background
        with get_client(sync_client=True) as client:
            total = client.read_events(filter=flt, limit=1).total
        if total >= 3 + 2 * CALLS or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert total == 3 + 2 * CALLS


def test_cpu_run_interleaves_the_variants_round_by_round(cpu_run):
    """The task runs read back from the API: each round runs (a), (a) deferred, (h), (g), (g) NO_CACHE once, in turn."""
    flow_run_id = cpu_run.results["engines"]["0.01"]["flow_run_id"]
    # 3 pipelines x 3 rounds x 5 chains of 3 steps, then (f): 3 task timers x (3 warm-ups + CALLS), CALLS profiled.
    expected = 3 * 3 * 5 * 3 + 3 * (3 + CALLS) + CALLS
    runs = task_run_list(flow_run_id, expect=expected, final=True, timeout=60)
    runs.sort(key=lambda r: r.expected_start_time)
    assert len(runs) == expected
    order: dict[str, list[str]] = {p: [] for p in PIPELINES}
    for run in runs:
        prefix = next((k for k in TASK_PREFIXES if run.name.startswith(k)), "")
        variant, rest = TASK_PREFIXES.get(prefix, "a"), run.name[len(prefix):]
        pipeline, _, step = rest.partition(".")
        if pipeline in order and step.startswith(("shipped-lines", "segment-orders", "year-lines")):
            order[pipeline].append(variant)
    assert order == {p: ["a", "a-deferred", "h", "g", "g-nocache"] * 3 for p in PIPELINES}
    assert {r.state.name for r in runs} == {"Completed"}  # (g)'s default cache policy never answers from a cache


def test_goals_follow_from_the_measurements(cpu_run):
    """Each target's figure and verdict come from results.json (the SF 0.01 run relabelled as SF 10)."""
    from benchmarks.goals import goals

    doc = json.loads(json.dumps(cpu_run.results).replace('"0.01"', '"10"'))
    by = {(g["goal"], g["pipeline"], g["scale_factor"]): g for g in goals(doc)}
    med = {(m["pipeline"], m["variant"]): m["median_s"] for m in doc["measurements"]}
    for p in PIPELINES:
        a_minus_h = by[("(a) − (h) ≤ 1 ms per step", p, "10")]
        assert a_minus_h["value"] == pytest.approx((med[(p, "a")] - med[(p, "h")]) / 3 * 1000)
        assert a_minus_h["met"] is (a_minus_h["value"] <= 1.0) and "fewer than 10" in a_minus_h["note"]
        reached = by[("a/b as reached, with Prefect's share", p, "10")]
        assert reached["value"] == pytest.approx(med[(p, "a")] / med[(p, "b")]) and reached["met"] is None
        assert "Prefect's share (h) − (b)" in reached["note"]
        assert "scale factor 30 not in this run" in by[("a/b ≤ 1.05", p, "30")]["note"]
        deferred = by[("a/c ≤ 1.10, every step but the last deferred", p, "10")]
        assert deferred["value"] == pytest.approx(med[(p, "a-deferred")] / med[(p, "c")])
    ours = by[("our overhead over a plain Prefect task ≤ 1 ms per GPU task", "tiny query", "10")]
    assert ours["value"] == doc["task_overhead"]["10"]["differences"]["ours"]["median_ms"]
    assert ours["met"] is (ours["value"] <= 1.0) and "95 % interval" in ours["note"]
    many = by[("many small tasks ≤ 1.5 × plain tasks (cpu backend)", "200 tiny tasks", "—")]
    assert many["note"] == "not measured in this run" and many["met"] is None
    assert cpu_run.results["goals"] == goals(cpu_run.results)


def test_cpu_run_writes_markdown_and_chart_and_prints_the_summary(cpu_run, tmp_path):
    from benchmarks.cli import main
    from benchmarks.report import markdown

    md = (cpu_run.out / "results.md").read_text()
    sections = ("## Goals", "## Scale factor 0.01", "## The peer a user would pick", "## Per-task overhead", "## Data")
    assert all(section in md for section in sections)
    assert all(f"| {p} |" in md for p in PIPELINES)
    assert markdown(cpu_run.results, full=False) in cpu_run.output  # the summary is printed last
    assert (cpu_run.out / "chart.png").read_bytes()[:8] == PNG and cpu_run.results["reports"]["chart_problem"] is None
    (tmp_path / "results.json").write_text((cpu_run.out / "results.json").read_text())
    assert main(["--report-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text() == md
    assert main(["--report-only", "--out", str(tmp_path / "missing")]) == 2


def test_tpch_tables_are_tpchgen_output_with_float_money(cpu_run, tpch_dir, tmp_path):
    from benchmarks.tpch_data import find_tpchgen

    lineitem = pl.read_parquet(tpch_dir / "sf0.01" / "lineitem.parquet")
    assert lineitem.schema["l_extendedprice"] == pl.Float64 and lineitem.schema["l_shipdate"] == pl.Date
    subprocess.run([find_tpchgen(), "parquet", "-s", "0.01", "-T", "lineitem", "-o", str(tmp_path), "-q"], check=True)
    raw = pl.read_parquet(tmp_path / "lineitem.parquet")
    assert raw.schema["l_extendedprice"] == pl.Decimal(15, 2)
    assert_frame_equal(lineitem, raw.with_columns(cs.decimal().cast(pl.Float64)))


def test_pipeline_steps_compute_the_tpch_answers(cpu_run, tpch_dir):
    from benchmarks.pipelines import PIPELINES as DEFINED
    from benchmarks.pipelines import Q1_SHIP_CUTOFF, Q5_REGION
    from benchmarks.tpch_data import table_paths

    paths = table_paths(tpch_dir / "sf0.01")
    q1 = DEFINED["q1-pricing-summary"].fused(paths).collect()
    shipped = pl.scan_parquet(paths["lineitem"]).filter(pl.col("l_shipdate") <= Q1_SHIP_CUTOFF)
    assert q1["count_order"].sum() == shipped.select(pl.len()).collect().item()
    assert q1.select("l_returnflag", "l_linestatus").rows() == [("A", "F"), ("N", "F"), ("N", "O"), ("R", "F")]
    q3 = DEFINED["q3-shipping-priority"].fused(paths).collect()
    assert q3.height == 10 and q3["revenue"].is_sorted(descending=True)
    q5 = DEFINED["q5-local-supplier-volume"].fused(paths).collect()
    asia = (
        pl.scan_parquet(paths["nation"])
        .join(pl.scan_parquet(paths["region"]), left_on="n_regionkey", right_on="r_regionkey")
        .filter(pl.col("r_name") == Q5_REGION)
        .collect()["n_name"]
    )
    assert set(q5["n_name"]) <= set(asia) and q5.height > 0


@pytest.fixture(scope="module")
def many_tasks_run(run_bench):
    return run_bench("--many-tasks", "--tasks", "10", "--runs", "2", "--warmups", "0", "--profile", "--backend", "cpu")


def test_many_small_tasks_times_both_flows_and_releases_every_result(many_tasks_run):
    assert many_tasks_run.returncode == 0, many_tasks_run.output[-4000:]
    m = many_tasks_run.results["many_tasks"]
    assert m["status"] == "ok" and m["tasks"] == 10 and m["runs"] == 2
    for name in ("plain", "ours"):
        runs = m[name]["runs"]
        assert len(runs) == 2
        assert m[name]["wall"]["median"] == pytest.approx(statistics.median(r["wall_s"] for r in runs))
        for run in runs:
            assert 0 < run["tasks_s"] < run["wall_s"] and 0 <= run["end_s"] < run["wall_s"] and run["cpu_s"] > 0
    assert all(run["released_at_end"] == 10 and run["teardown"] == "complete" for run in m["ours"]["runs"])
    assert m["ratio"] == pytest.approx(m["ours"]["wall"]["median"] / m["plain"]["wall"]["median"])
    low, high = m["ratio_ci"]
    assert low <= high
    assert m["profile"]["plain"]["with_our_code_s"] == 0 < m["profile"]["ours"]["with_our_code_s"]
    goal = next(g for g in many_tasks_run.results["goals"] if g["goal"].startswith("many small tasks"))
    assert goal["value"] == m["ratio"] and goal["met"] is (m["ratio"] <= 1.5) and goal["pipeline"] == "10 tiny tasks"
    assert "## Many small tasks on the cpu backend" in (many_tasks_run.out / "results.md").read_text()


@pytest.fixture(scope="module")
def session_start_run(run_bench):
    return run_bench("--session-start", "--runs", "2", "--backend", "cpu")


def test_session_start_is_split_into_its_pieces(session_start_run):
    assert session_start_run.returncode == 0, session_start_run.output[-4000:]
    value = session_start_run.results["session_start"]
    assert value["status"] == "ok" and value["backend"] == "cpu" and value["repeats"] == 2
    for name in ("probe", "engine", "describe", "reading", "shutdown", "open"):
        runs = value["pieces"][name]["runs_ms"]
        assert len(runs) == 2 and all(v >= 0 for v in runs) and value["pieces"][name]["later_median_ms"] == runs[1]
    assert value["pieces"]["import"]["runs_ms"] == [None, None]  # the cpu backend imports no cudf-polars engine
    assert value["pieces"]["engine"]["whose"] == "ours (cpu backend)"
    md = (session_start_run.out / "results.md").read_text()
    assert "| engine creation (start_backend) (`engine`) | ours (cpu backend) |" in md


def test_merge_makes_one_report_of_the_parts(cpu_run, many_tasks_run, session_start_run, tmp_path):
    from benchmarks.cli import main

    parts = [cpu_run.out, many_tasks_run.out, session_start_run.out]
    assert main(["--merge", *map(str, parts), "--out", str(tmp_path / "all")]) == 0
    doc = json.loads((tmp_path / "all" / "results.json").read_text())
    assert len(doc["measurements"]) == len(cpu_run.results["measurements"])
    assert {m["part"] for m in doc["measurements"]} == {str(cpu_run.out)}
    assert doc["many_tasks"] == many_tasks_run.results["many_tasks"]
    assert doc["session_start"] == session_start_run.results["session_start"]
    assert [p["dropped"] for p in doc["merged_from"]] == [[], [], []]
    md = (tmp_path / "all" / "results.md").read_text()
    sections = ("## Scale factor 0.01", "## Per-task overhead", "## Many small tasks", "## The session's start")
    assert all(section in md for section in sections)
    # The same part twice: the second one's entries are dropped, and listed.
    assert main(["--merge", str(cpu_run.out), str(cpu_run.out), "--out", str(tmp_path / "twice")]) == 0
    twice = json.loads((tmp_path / "twice" / "results.json").read_text())
    assert len(twice["measurements"]) == len(cpu_run.results["measurements"])
    assert len(twice["merged_from"][1]["dropped"]) == len(cpu_run.results["measurements"]) + 1
    other = json.loads((cpu_run.out / "results.json").read_text())
    other["settings"]["backend"] = "spmd"
    (tmp_path / "spmd").mkdir()
    (tmp_path / "spmd" / "results.json").write_text(json.dumps(other))
    assert main(["--merge", str(cpu_run.out), str(tmp_path / "spmd"), "--out", str(tmp_path / "m")]) == 2


def test_interleave_drops_a_failing_variant_and_stops_when_the_budget_is_spent():
    from benchmarks.timing import Budget, BudgetSpentError, RunOutcome, Timing, interleave

    def broken() -> RunOutcome:
        raise ValueError("broken variant")

    outcomes = interleave({"ok": lambda: RunOutcome(0.5), "broken": broken}, runs=3, warmups=1, budget=Budget(60))
    assert isinstance(outcomes["ok"], Timing)
    assert outcomes["ok"].runs_s == [0.5] * 3 and outcomes["ok"].warmup_s == [0.5]
    with pytest.raises(ValueError, match="broken variant"):
        raise outcomes["broken"]
    spent = interleave({"ok": lambda: RunOutcome(0.5)}, runs=3, warmups=1, budget=Budget(0))
    with pytest.raises(BudgetSpentError, match="budget"):
        raise spent["ok"]
    budget = Budget(60)
    def spends_the_budget() -> RunOutcome:
        budget.deadline = 0
        return RunOutcome(0.5)

    cut = interleave({"ok": spends_the_budget}, runs=3, warmups=0, budget=budget)
    assert cut["ok"].runs_s == [0.5] and cut["ok"].cut_short


def test_intervals_cover_the_median_with_95_percent():
    import math

    from benchmarks.stats import bootstrap_ci, median_ci

    values = [float(v) for v in range(1, 301)]
    low, high = median_ci(values)
    rank = int(low)  # the interval is [x_(rank), x_(n - rank + 1)]
    assert high == 301 - rank

    def coverage(r: int) -> float:
        return 1 - 2 * sum(math.comb(300, k) for k in range(r)) / 2**300

    assert coverage(rank) >= 0.95 > coverage(rank + 1)
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # 5 values cannot give 95 %
    d_low, d_high = bootstrap_ci([v + 10 for v in values], values, lambda a, b: a - b)
    assert d_low <= 10 <= d_high


def test_bad_command_lines_are_refused_with_a_clear_message(run_bench):
    bad_sf = run_bench("--scale-factors", "ten")
    assert bad_sf.returncode == 2 and "'ten' is not a comma-separated list of numbers" in bad_sf.output
    # cudf-polars 26.10 refuses its default engine beside an explicit one: (g) runs on its own.
    peer = run_bench("--backend", "spmd", "--variants", "a,g")
    assert peer.returncode == 2 and "run g in a command of its own (--variants g)" in peer.output
    assert not any(peer.out.iterdir()), "nothing is written for a refused command"


@pytest.mark.skipif(gpu_probe.probe().problem is None, reason="this machine has a GPU")
def test_missing_gpu_is_recorded_and_the_cpu_variant_still_runs(run_bench):
    run = run_bench(*small("spmd", "--pipelines", "q1-pricing-summary", "--variants", "a,b,e,f,h", runs=1, warmups=0))
    assert run.returncode == 1
    status = {m["variant"]: m for m in run.results["measurements"]}
    assert status["e"]["status"] == "ok"
    assert all(status[v]["status"] == "failed" and "NoGPUError" in status[v]["error"] for v in ("a", "b", "h"))
    f = run.results["task_overhead"]["0.01"]
    assert f["status"] == "failed" and "NoGPUError" in f["error"]
    assert "## Failures and skips" in (run.out / "results.md").read_text()


@pytest.mark.gpu
def test_spmd_harness_small_run_matches_cpu(run_bench):
    """Every variant on SPMDEngine(raise_on_fail=True) at SF 0.01 equals polars on the CPU; (g) in its own command."""
    run = run_bench(*small("spmd", "--overhead-calls", str(CALLS)), timeout=420)
    peer = run_bench(*small("spmd", "--variants", "g"), timeout=300)
    for bench, variants in ((run, [v for v in PIPELINE_VARIANTS if not v.startswith("g")]), (peer, ["g", "g-nocache"])):
        assert bench.returncode == 0, bench.output[-6000:]
        got = bench.results["measurements"]
        assert {(m["pipeline"], m["variant"]) for m in got} == {(p, v) for p in PIPELINES for v in variants}
        assert all(m["status"] == "ok" and m["matches_reference"] is True for m in got), got
    doc = run.results
    assert doc["task_overhead"]["0.01"]["status"] == "ok"
    session = doc["engines"]["0.01"]["session"]
    assert session["backend"] == "spmd" and len(session["gpus"]) == 1, session
    assert doc["machine"]["gpus"], "nvidia-smi listed no GPU"
    assert (run.out / "chart.png").read_bytes()[:8] == PNG


@pytest.mark.gpu
def test_spmd_session_start(run_bench):
    start = run_bench("--session-start", "--runs", "2", "--backend", "spmd", timeout=420)
    assert start.returncode == 0, start.output[-6000:]
    pieces = start.results["session_start"]["pieces"]
    for name in ("probe", "import", "engine", "describe", "reading", "open"):
        assert all(v is not None and v >= 0 for v in pieces[name]["runs_ms"]), name
    assert pieces["engine"]["whose"] == "cudf-polars"
