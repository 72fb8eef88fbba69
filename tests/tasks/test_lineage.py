"""Lineage: what a result records, when it can be replayed, and the replay itself (cpu backend)."""

from __future__ import annotations


import polars as pl
import pytest

from prefect_cudf_polars.blocks.backends.cpu import held_partitions
from prefect_cudf_polars.tasks import CannotRecomputeError, GPUResult
from prefect_cudf_polars.blocks.backends.plans import reads_in_process_source
from prefect_cudf_polars.blocks.lineage import Lineage
from prefect_cudf_polars.tasks.calls import replay


def test_in_process_sources_are_found_in_a_plan(cpu_block, orders):
    assert not reads_in_process_source(pl.scan_parquet(orders).filter(pl.col("id") > 3))
    assert not reads_in_process_source(pl.LazyFrame({"a": [1]}))
    with cpu_block.session() as session:
        r = session.execute(pl.scan_parquet(orders))
        lf = r.lazy().join(pl.scan_parquet(orders), on="id")
        assert reads_in_process_source(lf)


def test_results_record_their_lineage_and_replay_it(cpu_block, orders):
    before = held_partitions()

    def step(r: GPUResult, limit: float) -> pl.LazyFrame:
        return r.lazy().filter(pl.col("amount") > limit)

    with cpu_block.session() as session:
        base = session.execute(pl.scan_parquet(orders), name="base")
        assert base.lineage.label == "execute(LazyFrame)" and base.lineage.unreplayable_reason() is None
        lineage = Lineage(step, (base,), {"limit": 90.0}, label="gpu_task 'step'")
        first = session.execute(step(base, limit=90.0), lineage=lineage)
        again = replay(session, first)
        assert again.lineage is lineage and again.state == "live" and again.name == first.name
        assert session.collect(again.lazy()).equals(session.collect(first.lazy()))
        assert base.state == "consumed"  # the replay read a fresh base, never this one
    assert held_partitions() == before


def test_a_query_built_from_a_results_frame_is_not_replayable(cpu_block, orders):
    with cpu_block.session() as session:
        base = session.execute(pl.scan_parquet(orders))
        derived = session.execute(base.lazy().head(3))
        reason = derived.lineage.unreplayable_reason()
        assert "GPUResult's .lazy() frame built outside a GPU task" in reason
        with pytest.raises(CannotRecomputeError, match="Cannot recompute 'query'") as info:
            replay(session, derived)
        assert info.value.reason == reason
        assert derived.state == "live"
