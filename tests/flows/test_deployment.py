"""
The README's deploy end to end against a real `prefect server start` (cpu engine block), then the
finished main-job run's page in headless Chromium (Debian's chromium driven by Playwright).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest

from api_reads import artifacts_of, events_of, task_runs_of
from deployment_harness import ROOT, deploy_and_run_once, prefect_server

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    with prefect_server(tmp_path_factory.mktemp("prefect-home")) as running:
        yield running


@pytest.fixture()
def on_server(server):
    """Point this test process's Prefect client at the real server."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server["url"]}):
        yield server


@pytest.fixture(scope="module")
def deployed_run(server, nyc_paths, tmp_path_factory) -> dict:
    return deploy_and_run_once(
        server, backend="cpu", out_dir=tmp_path_factory.mktemp("report"),
        data_dir=str(Path(nyc_paths["flights"]).parent),
    )


def expected_rows(paths: dict[str, str], *, top: int) -> dict[str, int]:
    """Rows of the main job's four GPU results, computed with polars on the CPU from the same files."""
    from prefect_cudf_polars.flows import report_queries as q

    enriched = q.enrich_flights(*(pl.scan_parquet(paths[t]) for t in ("flights", "weather", "planes")))
    monthly = q.route_month_delays(enriched)
    worst = q.worst_routes(monthly, pl.scan_parquet(paths["airlines"]), pl.scan_parquet(paths["airports"]), top=top)
    return {
        "enrich-flights": enriched.collect().height,
        "route-month-delays": monthly.collect().height,
        "worst-routes": worst.collect().height,
        "carrier-month-delays": q.carrier_month_delays(pl.scan_parquet(paths["flights"])).collect().height,
    }


def summary_results(markdown: str) -> dict[str, list[str]]:
    """The session summary's "Results" table: each result's cells after its name, by name."""
    table = markdown[markdown.index("#### Results"):]
    lines = [line for line in table.splitlines()[4:] if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    return {row[0].strip("`"): row[1:] for row in cells}


@pytest.mark.timeout(900)
def test_readme_deploy_schedule_and_worker_run_end_to_end(deployed_run, on_server, nyc_paths):
    from prefect.client.orchestration import get_client

    d = deployed_run
    # The deploy printed the README's commands, in order.
    shown = [line[2:] for line in d["deploy_log"].splitlines() if line.startswith("$ ")]
    assert shown == [
        "prefect block register -m prefect_cudf_polars.blocks",
        "prefect-cudf-polars save-engine cpu --backend cpu",
        "prefect work-pool create gpu-pool --type process --overwrite",
        "prefect work-pool set-concurrency-limit gpu-pool 1",
        "prefect --no-prompt deploy --all",
    ]
    with get_client(sync_client=True) as client:
        assert client.read_block_type_by_slug("cudf-polars-engine").name == "cudf-polars Engine"
        block = client.read_block_document_by_name("cpu", block_type_slug="cudf-polars-engine")
        assert block.data["backend"] == "cpu"
        pool = client.read_work_pool("gpu-pool")
        assert pool.type == "process" and pool.concurrency_limit == 1
        dep = client.read_deployment(d["deployment"].id)
        flow_run = client.read_flow_run(d["flow_run_id"])
    # prefect.yaml: schedule, parameters, tags, pool, pull step.
    assert dep.work_pool_name == "gpu-pool"
    assert set(dep.tags) == {"gpu", "cudf-polars", "report"}
    assert dep.parameters == {"engine_block": "gpu", "output_dir": "output", "top": 20}
    [schedule] = dep.schedules
    assert schedule.schedule.cron == "0 6 * * *" and schedule.active
    assert dep.pull_steps == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
    ]
    # The schedule made future runs at 06:00 UTC.
    assert d["scheduled"], "the scheduler made no future runs"
    now = datetime.now(timezone.utc)
    for run in d["scheduled"]:
        start = run.expected_start_time.astimezone(timezone.utc)
        assert start > now and (start.hour, start.minute) == (6, 0)

    # The worker ran the triggered run: Completed, report and chart written.
    assert flow_run.state.is_completed(), (flow_run.state, d["worker_log"][-4000:])
    assert flow_run.work_pool_name == "gpu-pool"
    report = pl.read_parquet(d["out_dir"] / "flight_delay_report.parquet")
    assert report.height == 20 and report["mean_arr_delay"].is_sorted(descending=True)
    png = (d["out_dir"] / "flight_delay_chart.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000

    # Its artifacts: report table, progress at 100 %, the session summary listing every GPU result.
    by_key = {a.key: a for a in artifacts_of(flow_run_id=flow_run.id) if a.key}
    table = by_key["flight-delay-report"]
    assert table.type == "table"
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert len(rows) == 20 and [r["carrier"] for r in rows] == report["carrier"].to_list()
    progress = by_key["flight-delay-report-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0
    summary = by_key["flight-delay-report-cudf-polars-session"].data
    assert "| backend | cpu |" in summary and "| results produced | 4 |" in summary
    assert "| results released unconsumed | 0 |" in summary
    rows = expected_rows(nyc_paths, top=20)
    assert rows["worst-routes"] == report.height
    listed = summary_results(summary)
    runs = task_runs_of(flow_run.id, final=True)
    assert set(listed) == set(rows)
    for name, height in rows.items():
        produced_by, state, listed_rows, listed_bytes, partitions = listed[name][:5]
        assert produced_by == f"task run '{name}' (id {runs[name].id})"
        assert (state, listed_rows, partitions) == ("consumed", str(height), "1"), listed[name]
        assert int(listed_bytes.split(" bytes")[0].replace(",", "")) > 0
        # The main job's block writes no per-result artifact on the task runs.
        assert artifacts_of(task_run_id=runs[name].id) == []
    found = events_of(flow_run.id, expect={"prefect_cudf_polars.engine.stopped": 1,
                                           "prefect_cudf_polars.result.created": 4})
    names = {e.event for e in found}
    assert {"prefect_cudf_polars.engine.started", "prefect_cudf_polars.engine.stopped",
            "prefect_cudf_polars.result.created", "prefect_cudf_polars.result.consumed"} <= names
    # Each result.created event carries the result's facts: rows, bytes, the plan it ran.
    created = {e.payload["name"]: e.payload for e in found if e.event == "prefect_cudf_polars.result.created"}
    assert set(created) == set(rows)
    for name, height in rows.items():
        payload = created[name]
        assert payload["backend"] == "cpu" and payload["rows"] == height
        assert payload["bytes"] == int(listed[name][3].split(" bytes")[0].replace(",", ""))
        assert payload["plan"].strip() and payload["schema"]
    assert "JOIN" in created["enrich-flights"]["plan"] and "AGGREGATE" in created["carrier-month-delays"]["plan"]
    assert list(created["worst-routes"]["schema"]) == report.columns
    # The future runs are still waiting for 06:00.
    with get_client(sync_client=True) as client:
        for run in d["scheduled"]:
            assert client.read_flow_run(run.id).state_type.value == "SCHEDULED"


@pytest.mark.timeout(900)
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it)")
def test_ui_shows_the_session_summary_of_the_main_job_run(deployed_run, server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    url = f"{server['ui']}/runs/flow-run/{deployed_run['flow_run_id']}"
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_text("Artifacts", exact=True).first.click(timeout=60_000)
            # The flow run's Artifacts tab lists the summary with its key figures ...
            card = page.get_by_text("flight-delay-report-cudf-polars-session").first
            expect(card).to_be_visible(timeout=60_000)
            expect(page.get_by_text("results produced 4, consumed 4, released unconsumed 0").first).to_be_visible()
            page.screenshot(path=tmp_path / "flow-run-artifacts.png", full_page=True)
            # ... and its page shows the summary table.
            card.click()
            expect(page.get_by_text("cudf-polars engine session summary")).to_be_visible(timeout=60_000)
            for label, value in [("results produced", "4"), ("results released unconsumed", "0"),
                                 ("backend", "cpu"), ("Dask dashboard", "none (no Dask cluster)")]:
                row = page.get_by_role("row").filter(has=page.get_by_text(label, exact=True))
                expect(row.first).to_contain_text(value)
            # ... and its Results table: each GPU result, the task run that produced it, its state.
            expect(page.get_by_text("Results (4)")).to_be_visible()
            for name in ("enrich-flights", "route-month-delays", "worst-routes", "carrier-month-delays"):
                row = page.get_by_role("row").filter(has=page.get_by_text(name, exact=True))
                expect(row.first).to_contain_text(f"task run '{name}'")
                expect(row.first).to_contain_text("consumed")
            shot = tmp_path / "session-summary.png"
            page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("PREFECT_CUDF_POLARS_SCREENSHOTS")
    if keep:  # for looking at them after the run
        shutil.copy(shot, Path(keep) / shot.name)
        shutil.copy(tmp_path / "flow-run-artifacts.png", Path(keep) / "flow-run-artifacts.png")
