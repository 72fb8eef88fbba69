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


def summary_results(markdown: str) -> dict[str, dict[str, str]]:
    """The session summary's two results tables: each result's cells by column, by its name."""
    rows: dict[str, dict[str, str]] = {}
    for heading in ("#### Results", "#### Each result's task run and engine call"):
        lines = markdown[markdown.index(heading):].split("\n\n")[1].splitlines()
        head, *cells = ([c.strip() for c in line.strip("|").split("|")] for line in lines)
        for row in cells[1:]:  # past the |---| line
            rows.setdefault(row[0].strip("`"), {}).update(zip(head, row, strict=True))
    return rows


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
        row = listed[name]
        assert (row["produced by task run"], row["task run id"]) == (name, str(runs[name].id))
        assert (row["at the end"], row["rows"], row["partitions"]) == ("consumed", str(height), "1"), row
        assert int(row["bytes"].replace(",", "")) > 0
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
        assert payload["bytes"] == int(listed[name]["bytes"].replace(",", ""))
        assert payload["plan"].strip() and payload["schema"]
    assert "JOIN" in created["enrich-flights"]["plan"] and "AGGREGATE" in created["carrier-month-delays"]["plan"]
    assert list(created["worst-routes"]["schema"]) == report.columns
    # The future runs are still waiting for 06:00.
    with get_client(sync_client=True) as client:
        for run in d["scheduled"]:
            assert client.read_flow_run(run.id).state_type.value == "SCHEDULED"


#: Each table of the session summary whose cells run past its box, as ``[box width, table width]`` (Prefect's
#: V1 UI does not wrap table cells and scrolls a table inside its box; the V2 UI wraps them).
OVERFLOWING_TABLES = """() => [...document.querySelectorAll('table')].map(table => {
    const box = table.closest('.p-table') || table.parentElement;
    return [box.clientWidth, Math.round(table.getBoundingClientRect().width), box.getBoundingClientRect().right];
}).filter(([box, width, right]) => width > box + 1 || right > window.innerWidth)"""


@pytest.mark.timeout(900)
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it)")
def test_ui_shows_the_session_summary_and_each_gpu_task_runs_result_on_a_1280_px_page(deployed_run, on_server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    server, flow_run_id = on_server, deployed_run["flow_run_id"]
    runs = task_runs_of(flow_run_id, final=True)
    [summary] = artifacts_of(flow_run_id=flow_run_id, key="flight-delay-report-cudf-polars-session")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{server['ui']}/runs/flow-run/{flow_run_id}")
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
            # ... and its results tables: each GPU result, its state, the task run that produced it and its id.
            expect(page.get_by_text("Results (4)")).to_be_visible()
            for name in ("enrich-flights", "route-month-delays", "worst-routes", "carrier-month-delays"):
                made, call = page.get_by_role("row").filter(has=page.get_by_text(name, exact=True)).all()
                expect(made).to_contain_text("consumed")
                expect(call).to_contain_text(str(runs[name].id))
            page.get_by_text("Results (4)").scroll_into_view_if_needed()
            shot = tmp_path / "session-summary.png"
            page.screenshot(path=shot, full_page=True)
            # Every table fits a 1,280 px page, in the V1 UI and the V2 UI.
            expect(page.locator("table")).to_have_count(3)  # waits for the tables the markdown renders
            assert page.evaluate(OVERFLOWING_TABLES) == []
            page.goto(f"{server['ui']}/v2/artifacts/artifact/{summary.id}")
            expect(page.get_by_text("Results (4)")).to_be_visible(timeout=60_000)
            expect(page.locator("table")).to_have_count(3)  # the V2 UI renders the heading before the tables
            assert page.evaluate(OVERFLOWING_TABLES) == []
            # A GPU task run's page says what it made on the engine.
            page.goto(f"{server['ui']}/runs/task-run/{runs['worst-routes'].id}")
            expect(page.get_by_text("cudf-polars result 'worst-routes': 20 rows, ")).to_be_visible(timeout=60_000)
            page.screenshot(path=tmp_path / "task-run.png", full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    keep = os.environ.get("PREFECT_CUDF_POLARS_SCREENSHOTS")
    if keep:  # for looking at them after the run
        shutil.copy(shot, Path(keep) / shot.name)
        for name in ("flow-run-artifacts.png", "task-run.png"):
            shutil.copy(tmp_path / name, Path(keep) / name)
