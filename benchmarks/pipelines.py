"""
Multi-step pipelines derived from PDS-H (TPC-H) queries, split the way a Prefect user would.

Each pipeline is a sequence of steps. A step is a function
``build(previous, paths) -> polars.LazyFrame``: ``previous`` is the LazyFrame of
the step before (``None`` for the first step), ``paths`` maps TPC-H table names to
parquet files. The same step functions build every variant of the benchmark:
chained (each step run on its own, its result passed on), fused (all steps
folded into one query) and host round trips (each step collected and re-read).

Queries follow the PDS-H definitions of polars' benchmark (TPC-H Q1, Q3, Q5
with their standard substitution parameters); the split into steps is ours.
Money columns are floats (see :mod:`benchmarks.tpch_data`). Every final sort
orders rows fully, so results of different engines compare row by row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date

import polars as pl

Paths = dict[str, str]
StepFn = Callable[[pl.LazyFrame | None, Paths], pl.LazyFrame]


def scan(paths: Paths, table: str) -> pl.LazyFrame:
    """A fresh ``scan_parquet`` of one TPC-H table."""
    return pl.scan_parquet(paths[table])


@dataclass(frozen=True)
class Step:
    """One step of a pipeline: a name and the function that builds its query."""

    name: str
    build: StepFn


@dataclass(frozen=True)
class Pipeline:
    """
    A named multi-step pipeline.

    Attributes
    ----------
    name : str
        Short id used in results (``"q1-pricing-summary"``).
    source : str
        The PDS-H / TPC-H query it is derived from.
    description : str
        What it computes, in one line.
    steps : tuple of Step
        Three or more steps; the last one's result is the pipeline's output.
    """

    name: str
    source: str
    description: str
    steps: tuple[Step, ...]

    def fused(self, paths: Paths) -> pl.LazyFrame:
        """All steps folded into one query."""
        lf: pl.LazyFrame | None = None
        for step in self.steps:
            lf = step.build(lf, paths)
        assert lf is not None
        return lf


# ---- Q1: pricing summary report ------------------------------------------------
Q1_SHIP_CUTOFF = date(1998, 9, 2)  # 1998-12-01 minus DELTA=90 days


def q1_shipped_lines(_: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 1: line items shipped by the cut-off (about 98 % of lineitem)."""
    return (
        scan(paths, "lineitem")
        .filter(pl.col("l_shipdate") <= Q1_SHIP_CUTOFF)
        .select(
            "l_returnflag",
            "l_linestatus",
            "l_quantity",
            "l_extendedprice",
            "l_discount",
            "l_tax",
        )
    )


def q1_line_charges(previous: pl.LazyFrame | None, _: Paths) -> pl.LazyFrame:
    """Step 2: discounted price and charge per line."""
    assert previous is not None
    disc_price = pl.col("l_extendedprice") * (1 - pl.col("l_discount"))
    return previous.with_columns(disc_price=disc_price, charge=disc_price * (1 + pl.col("l_tax")))


def q1_pricing_summary(previous: pl.LazyFrame | None, _: Paths) -> pl.LazyFrame:
    """Step 3: totals and means per return flag and line status."""
    assert previous is not None
    return (
        previous.group_by("l_returnflag", "l_linestatus")
        .agg(
            sum_qty=pl.col("l_quantity").sum(),
            sum_base_price=pl.col("l_extendedprice").sum(),
            sum_disc_price=pl.col("disc_price").sum(),
            sum_charge=pl.col("charge").sum(),
            avg_qty=pl.col("l_quantity").mean(),
            avg_price=pl.col("l_extendedprice").mean(),
            avg_disc=pl.col("l_discount").mean(),
            count_order=pl.len(),
        )
        .sort("l_returnflag", "l_linestatus")
    )


# ---- Q3: shipping priority ----------------------------------------------------
Q3_SEGMENT = "BUILDING"
Q3_DATE = date(1995, 3, 15)


def q3_segment_orders(_: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 1: open orders (before the date) of customers in the segment."""
    customers = scan(paths, "customer").filter(pl.col("c_mktsegment") == Q3_SEGMENT)
    orders = scan(paths, "orders").filter(pl.col("o_orderdate") < Q3_DATE)
    return customers.join(orders, left_on="c_custkey", right_on="o_custkey").select(
        "o_orderkey", "o_orderdate", "o_shippriority"
    )


def q3_unshipped_revenue(previous: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 2: their line items shipped after the date, with revenue."""
    assert previous is not None
    lines = scan(paths, "lineitem").filter(pl.col("l_shipdate") > Q3_DATE)
    return lines.join(previous, left_on="l_orderkey", right_on="o_orderkey").select(
        "l_orderkey",
        "o_orderdate",
        "o_shippriority",
        revenue=pl.col("l_extendedprice") * (1 - pl.col("l_discount")),
    )


def q3_top_orders(previous: pl.LazyFrame | None, _: Paths) -> pl.LazyFrame:
    """Step 3: revenue per order, the 10 largest."""
    assert previous is not None
    return (
        previous.group_by("l_orderkey", "o_orderdate", "o_shippriority")
        .agg(revenue=pl.col("revenue").sum())
        .sort(["revenue", "o_orderdate", "l_orderkey"], descending=[True, False, False])
        .head(10)
        .select("l_orderkey", "revenue", "o_orderdate", "o_shippriority")
    )


# ---- Q5: local supplier volume ------------------------------------------------
Q5_REGION = "ASIA"
Q5_FROM, Q5_TO = date(1994, 1, 1), date(1995, 1, 1)


def q5_year_lines(_: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 1: line items of the year's orders, with the ordering customer."""
    orders = scan(paths, "orders").filter(
        (pl.col("o_orderdate") >= Q5_FROM) & (pl.col("o_orderdate") < Q5_TO)
    )
    return (
        scan(paths, "lineitem")
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .select("o_custkey", "l_suppkey", "l_extendedprice", "l_discount")
    )


def q5_local_supplier_lines(previous: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 2: keep lines whose supplier is in the customer's nation."""
    assert previous is not None
    customers = scan(paths, "customer").select("c_custkey", "c_nationkey")
    suppliers = scan(paths, "supplier").select("s_suppkey", "s_nationkey")
    return (
        previous.join(customers, left_on="o_custkey", right_on="c_custkey")
        .join(
            suppliers,
            left_on=["l_suppkey", "c_nationkey"],
            right_on=["s_suppkey", "s_nationkey"],
        )
        .select(
            "c_nationkey",
            revenue=pl.col("l_extendedprice") * (1 - pl.col("l_discount")),
        )
    )


def q5_region_revenue(previous: pl.LazyFrame | None, paths: Paths) -> pl.LazyFrame:
    """Step 3: revenue per nation of the region, largest first."""
    assert previous is not None
    nations = scan(paths, "nation").join(
        scan(paths, "region").filter(pl.col("r_name") == Q5_REGION),
        left_on="n_regionkey",
        right_on="r_regionkey",
    )
    return (
        previous.join(nations, left_on="c_nationkey", right_on="n_nationkey")
        .group_by("n_name")
        .agg(revenue=pl.col("revenue").sum())
        .sort(["revenue", "n_name"], descending=[True, False])
    )


PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in (
        Pipeline(
            "q1-pricing-summary",
            "PDS-H / TPC-H Q1",
            "filter and project lineitem; derive charges; aggregate per flag and status",
            (
                Step("shipped-lines", q1_shipped_lines),
                Step("line-charges", q1_line_charges),
                Step("pricing-summary", q1_pricing_summary),
            ),
        ),
        Pipeline(
            "q3-shipping-priority",
            "PDS-H / TPC-H Q3",
            "join customers and orders; join line items; top 10 orders by revenue",
            (
                Step("segment-orders", q3_segment_orders),
                Step("unshipped-revenue", q3_unshipped_revenue),
                Step("top-orders", q3_top_orders),
            ),
        ),
        Pipeline(
            "q5-local-supplier-volume",
            "PDS-H / TPC-H Q5",
            "join a year of orders and line items; keep local suppliers; revenue per nation",
            (
                Step("year-lines", q5_year_lines),
                Step("local-supplier-lines", q5_local_supplier_lines),
                Step("region-revenue", q5_region_revenue),
            ),
        ),
    )
}
