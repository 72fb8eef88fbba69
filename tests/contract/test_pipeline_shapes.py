"""
The pipeline users build: each table loaded once as a result, then analytic queries over them.

Seven small decision-support tables are written as parquet; a flow loads each with one
``execute`` of its scan, splits each load with ``tee`` into one copy per query that reads it,
and runs a dozen queries as ``gpu_task``\\s, written as a user would: joins of up to six tables,
a correlated sub-query, a semi and an anti join over three reads of one table, a union of two
joins over one dimension, a self-join. Several of them read one table's result more than once
in one plan. Every query's rows equal polars' on the CPU over the same parquet files, and no
result is left live.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from prefect import flow

from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task, tee

Read = Callable[[], pl.LazyFrame]
col = pl.col


def tables() -> dict[str, pl.DataFrame]:
    """Small, deterministic decision-support tables (dates are day numbers)."""
    n_orders, n_lines = 1_500, 6_000
    li = pl.int_range(0, n_lines, eager=True)
    o = pl.int_range(0, n_orders, eager=True)
    return {
        "region": pl.DataFrame({"r_regionkey": range(5), "r_name": ["AFRICA", "AMERICA", "ASIA", "EUROPE", "EAST"]}),
        "nation": pl.DataFrame({"n_nationkey": range(25), "n_name": [f"NATION{i:02d}" for i in range(25)],
                                "n_regionkey": [i % 5 for i in range(25)]}),
        "supplier": pl.DataFrame({"s_suppkey": range(60), "s_nationkey": [(i * 7) % 25 for i in range(60)],
                                  "s_acctbal": [float((i * 37) % 1000) for i in range(60)]}),
        "part": pl.DataFrame({"p_partkey": range(200), "p_type": [("PROMO " if i % 4 == 0 else "STD ") + str(i % 6)
                                                                   for i in range(200)],
                              "p_size": [i % 50 for i in range(200)]}),
        "customer": pl.DataFrame({"c_custkey": range(300), "c_nationkey": [(i * 3) % 25 for i in range(300)],
                                  "c_acctbal": [float((i * 53) % 900) - 100.0 for i in range(300)],
                                  "c_mktsegment": [["AUTO", "BUILD", "FURN", "MACH"][i % 4] for i in range(300)]}),
        "orders": pl.DataFrame({"o_orderkey": o, "o_custkey": (o * 7) % 300, "o_orderdate": (o * 13) % 2_500,
                                "o_orderpriority": (o % 5).cast(pl.Int64), "o_status": (o % 3).cast(pl.Int64)}),
        "lineitem": pl.DataFrame({
            "l_orderkey": (li * 11) % n_orders, "l_partkey": (li * 17) % 200, "l_suppkey": (li * 7) % 60,
            "l_quantity": ((li * 7) % 50 + 1).cast(pl.Float64), "l_price": ((li * 131) % 10_000).cast(pl.Float64) / 10,
            "l_discount": ((li % 11) / 100).cast(pl.Float64), "l_shipdate": (li * 19) % 2_600,
            "l_receiptdate": (li * 19) % 2_600 + (li % 30), "l_commitdate": (li * 19) % 2_600 + (li % 20),
            "l_returnflag": (li % 3).cast(pl.Int64), "l_shipmode": (li % 7).cast(pl.Int64),
        }),
    }


def revenue() -> pl.Expr:
    return (col("l_price") * (1 - col("l_discount"))).sum().alias("revenue")


#: Query name -> (tables it reads, the query over one reader per table).
QUERIES: dict[str, tuple[tuple[str, ...], Callable[..., pl.LazyFrame]]] = {
    "pricing-summary": (("lineitem",), lambda lineitem: lineitem().filter(col("l_shipdate") <= 2_400)
                        .group_by("l_returnflag").agg(col("l_quantity").sum(), revenue(), pl.len())),
    "shipping-priority": (("customer", "orders", "lineitem"), lambda customer, orders, lineitem: customer()
                          .filter(col("c_mktsegment") == "BUILD").join(orders(), left_on="c_custkey", right_on="o_custkey")
                          .join(lineitem().filter(col("l_shipdate") > 1_000), left_on="o_orderkey", right_on="l_orderkey")
                          .group_by("o_orderkey", "o_orderdate").agg(revenue()).sort("revenue", "o_orderkey",
                                                                                    descending=[True, False]).head(10)),
    "local-supplier-volume": (("customer", "orders", "lineitem", "supplier", "nation", "region"),
                              lambda customer, orders, lineitem, supplier, nation, region: region()
                              .filter(col("r_name") == "ASIA").join(nation(), left_on="r_regionkey", right_on="n_regionkey")
                              .join(supplier(), left_on="n_nationkey", right_on="s_nationkey")
                              .join(lineitem(), left_on="s_suppkey", right_on="l_suppkey")
                              .join(orders(), left_on="l_orderkey", right_on="o_orderkey")
                              .join(customer().filter(col("c_acctbal") > 0), left_on="o_custkey", right_on="c_custkey")
                              .group_by("n_name").agg(revenue())),
    "forecast-revenue": (("lineitem",), lambda lineitem: lineitem()
                         .filter(col("l_discount").is_between(0.05, 0.07), col("l_quantity") < 24)
                         .select((col("l_price") * col("l_discount")).sum().alias("revenue"))),
    "returned-items": (("customer", "orders", "lineitem", "nation"), lambda customer, orders, lineitem, nation: customer()
                       .join(orders(), left_on="c_custkey", right_on="o_custkey")
                       .join(lineitem().filter(col("l_returnflag") == 1), left_on="o_orderkey", right_on="l_orderkey")
                       .join(nation(), left_on="c_nationkey", right_on="n_nationkey")
                       .group_by("c_custkey", "n_name").agg(revenue()).sort("revenue", "c_custkey",
                                                                             descending=[True, False]).head(20)),
    "shipping-modes": (("orders", "lineitem"), lambda orders, lineitem: lineitem()
                       .filter(col("l_commitdate") < col("l_receiptdate"), col("l_shipmode").is_in([1, 4]))
                       .join(orders(), left_on="l_orderkey", right_on="o_orderkey").group_by("l_shipmode")
                       .agg((col("o_orderpriority") <= 1).sum().alias("high"), (col("o_orderpriority") > 1).sum().alias("low"))),
    "customer-distribution": (("customer", "orders"), lambda customer, orders: customer()
                              .join(orders().filter(col("o_status") != 2), left_on="c_custkey", right_on="o_custkey",
                                    how="left").group_by("c_custkey").agg(col("o_orderkey").count().alias("c_count"))
                              .group_by("c_count").agg(pl.len().alias("custdist"))),
    "promotion-effect": (("lineitem", "part"), lambda lineitem, part: lineitem().filter(col("l_shipdate") < 600)
                         .join(part(), left_on="l_partkey", right_on="p_partkey")
                         .select((100 * (col("l_price") * (1 - col("l_discount"))).filter(col("p_type").str.starts_with("PROMO"))
                                  .sum() / (col("l_price") * (1 - col("l_discount"))).sum()).alias("promo_revenue"))),
    # A correlated sub-query: lines under a fifth of their part's mean quantity (lineitem read twice).
    "small-quantity-revenue": (("lineitem", "part"), lambda lineitem, part: lineitem()
                               .join(part().filter(col("p_size") < 25), left_on="l_partkey", right_on="p_partkey")
                               .join(lineitem().group_by("l_partkey").agg((0.2 * col("l_quantity").mean()).alias("limit")),
                                     on="l_partkey").filter(col("l_quantity") < col("limit"))
                               .select((col("l_price").sum() / 7).alias("avg_yearly"))),
    # Customers with a large order: a semi join of orders with an aggregate of lineitem.
    "large-volume-customers": (("customer", "orders", "lineitem"), lambda customer, orders, lineitem: customer()
                               .join(orders().join(lineitem().group_by("l_orderkey").agg(col("l_quantity").sum())
                                                   .filter(col("l_quantity") > 100), left_on="o_orderkey",
                                                   right_on="l_orderkey", how="semi"),
                                     left_on="c_custkey", right_on="o_custkey").select("c_custkey", "o_orderkey")),
    # Suppliers who kept orders waiting: three filtered reads of lineitem, a semi and an anti join.
    "suppliers-who-kept-orders-waiting": (("lineitem", "supplier"), lambda lineitem, supplier: lineitem()
                                          .filter(col("l_receiptdate") > col("l_commitdate"))
                                          .join(lineitem().filter(col("l_shipmode") == 3), on="l_orderkey", how="semi")
                                          .join(lineitem().filter(col("l_returnflag") == 2), on="l_orderkey", how="anti")
                                          .join(supplier(), left_on="l_suppkey", right_on="s_suppkey")
                                          .group_by("l_suppkey").agg(pl.len().alias("numwait"))),
    # A union of two joins over one dimension table (nation read twice), and a self-join of customer.
    "customers-and-suppliers-by-nation": (("customer", "supplier", "nation"), lambda customer, supplier, nation: pl.concat([
        customer().filter(col("c_acctbal") > 500).join(nation(), left_on="c_nationkey", right_on="n_nationkey")
        .select("n_name", kind=pl.lit("customer")),
        supplier().filter(col("s_acctbal") > 500).join(nation(), left_on="s_nationkey", right_on="n_nationkey")
        .select("n_name", kind=pl.lit("supplier")),
    ]).group_by("n_name", "kind").agg(pl.len())),
    "customers-sharing-a-nation": (("customer",), lambda customer: customer().select("c_custkey", "c_nationkey")
                                   .join(customer().select("c_custkey", "c_nationkey"), on="c_nationkey", suffix="_other")
                                   .filter(col("c_custkey") < col("c_custkey_other")).group_by("c_nationkey").agg(pl.len())),
}


@pytest.fixture()
def table_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name, frame in tables().items():
        files[name] = str(tmp_path / f"{name}.parquet")
        frame.write_parquet(files[name])
    return files


@gpu_task(name="query")
def run_query(query: str, inputs: dict[str, GPUResult]) -> pl.LazyFrame:
    needs, build = QUERIES[query]
    return build(**{table: inputs[table].lazy for table in needs})


def pipeline_results(engine: CudfPolarsEngine, files: dict[str, str]) -> dict[str, pl.DataFrame]:
    """One flow run: each table loaded once, tee'd into one copy per query that reads it, every query collected."""

    @flow(task_runner=CudfPolarsTaskRunner(engine))
    def pipeline() -> dict[str, pl.DataFrame]:
        readers = {t: [q for q, (needs, _) in QUERIES.items() if t in needs] for t in files}
        copies = {}
        for table, queries in readers.items():
            loaded = execute(pl.scan_parquet(files[table]), name=table)
            copies[table] = dict(zip(queries, tee(loaded, len(queries)) if len(queries) > 1 else [loaded]))
        out = {q: collect(run_query(q, {t: copies[t][q] for t in needs})) for q, (needs, _) in QUERIES.items()}
        assert get_engine_session().live_results == ()
        return out

    return pipeline()


def assert_same_rows(got: pl.DataFrame, want: pl.DataFrame) -> None:
    """Equal as sets of rows, floats within 1e-6 relative (row order across partitions is not defined)."""
    assert_frame_equal(got.sort(got.columns), want.sort(want.columns), check_dtypes=False, rtol=1e-6)


def expected(files: dict[str, str], query: str) -> pl.DataFrame:
    needs, build = QUERIES[query]
    return build(**{t: (lambda path=files[t]: pl.scan_parquet(path)) for t in needs}).collect()


def test_a_dozen_analytic_queries_over_tables_loaded_once_equal_polars_on_the_cpu_backend(cpu_block, table_files):
    got = pipeline_results(cpu_block, table_files)
    assert len(got) == len(QUERIES) >= 12
    for query, frame in got.items():
        want = expected(table_files, query)
        assert want.height > 0, f"{query} selects nothing: the test data does not exercise it"
        assert_same_rows(frame, want)


@pytest.mark.gpu
def test_a_dozen_analytic_queries_over_tables_loaded_once_equal_polars_on_the_gpu(table_files):
    got = pipeline_results(CudfPolarsEngine(backend="spmd", raise_on_fail=True), table_files)
    for query, frame in got.items():
        assert_same_rows(frame, expected(table_files, query))
