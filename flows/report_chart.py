"""
The main job's report as a picture: mean arrival delay by carrier and month.

Drawn with matplotlib's Agg backend (no display needed) into a PNG written next
to the parquet report.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

CHART_FILE = "flight_delay_chart.png"


def carrier_month_chart(delays: pl.DataFrame, path: Path, *, title: str) -> Path:
    """
    Draw a heat map of mean arrival delay per carrier (rows) and month (columns).

    Parameters
    ----------
    delays
        Columns ``carrier``, ``month`` (1-12) and ``mean_arr_delay`` (minutes),
        one row per carrier and month (as
        :func:`~prefect_cudf_polars.flows.report_queries.carrier_month_delays`).
    path
        The PNG to write (its folder must exist).
    title
        The chart's title.

    Returns
    -------
    pathlib.Path
        ``path``, written.

    Raises
    ------
    ValueError
        If ``delays`` lacks one of the columns or has no rows.
    """
    missing = {"carrier", "month", "mean_arr_delay"} - set(delays.columns)
    if missing or delays.height == 0:
        raise ValueError(f"carrier_month_chart needs rows with carrier, month and mean_arr_delay; got {delays.height} "
                         f"rows, missing columns {sorted(missing)}.")
    from matplotlib.figure import Figure

    grid = delays.pivot("month", index="carrier", values="mean_arr_delay", sort_columns=True).sort("carrier")
    months = [c for c in grid.columns if c != "carrier"]
    fig = Figure(figsize=(10, 0.45 * grid.height + 2), layout="tight")  # laid out when saved
    ax = fig.add_subplot()
    # Colour limits from the 2nd and 98th percentiles: a carrier with a handful of
    # flights in a month (OO) would otherwise wash out every other cell.
    low, high = delays["mean_arr_delay"].quantile(0.02), delays["mean_arr_delay"].quantile(0.98)
    image = ax.imshow(grid.select(months).to_numpy(), aspect="auto", cmap="RdYlGn_r", vmin=low, vmax=high)
    ax.set_xticks(range(len(months)), labels=[str(m) for m in months])
    ax.set_yticks(range(grid.height), labels=grid["carrier"].to_list())
    ax.set(xlabel="month (2013); blank: no flights", ylabel="carrier", title=title)
    fig.colorbar(image, ax=ax, label="mean arrival delay (min)")
    fig.savefig(path, dpi=100)
    return path
