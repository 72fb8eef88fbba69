"""
Device memory along a long chain of small results, measured three ways (SPMD; not a test).

Runs ``STEPS`` chained ``execute(r.lazy().with_columns(amount + 1))`` steps on
1,000 rows three ways: cudf-polars' ``SPMDEngine`` alone, our ``EngineSession``
(no Prefect), and our ``gpu_task`` inside a Prefect flow. Every ``EVERY`` steps it
records rmm's current allocation (bytes) and how many cudf-polars ``DataFrame``
and ``Column`` objects are alive; for a growing count it prints what refers to
the oldest survivor. Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
from pathlib import Path

import polars as pl

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
EVERY = 100


def live_counts() -> dict[str, int]:
    from cudf_polars.containers import Column, DataFrame

    gc.collect()
    objs = gc.get_objects()
    return {
        "DataFrame": sum(isinstance(o, DataFrame) for o in objs),
        "Column": sum(isinstance(o, Column) for o in objs),
    }


def referrer_chain(kind: str) -> list[str]:
    """Types (and a short repr) of what holds the first live object of ``kind``, two levels up."""
    from cudf_polars.containers import Column, DataFrame

    cls = {"DataFrame": DataFrame, "Column": Column}[kind]
    found = [o for o in gc.get_objects() if isinstance(o, cls)]
    if not found:
        return []
    out = []
    frame = sys._getframe()
    for ref in gc.get_referrers(found[0]):
        if ref is found or ref is frame:
            continue
        line = f"{type(ref).__module__}.{type(ref).__qualname__}: {repr(ref)[:160]}"
        for ref2 in gc.get_referrers(ref)[:4]:
            if ref2 is found or ref2 is frame:
                continue
            line += f"\n    <- {type(ref2).__module__}.{type(ref2).__qualname__}: {repr(ref2)[:160]}"
        out.append(line)
    return out[:6]


def rmm_bytes() -> int | None:
    from prefect_cudf_polars.blocks.backends.compat import rank_reading
    
    def rank_allocated_bytes():
        return rank_reading()[0]

    return rank_allocated_bytes()


def raw(path: Path) -> dict:
    from cudf_polars.engine.spmd import SPMDEngine

    readings = []
    with SPMDEngine() as engine:
        start = rmm_bytes()
        r = engine.execute(pl.scan_parquet(path))
        for i in range(1, STEPS):
            r = engine.execute(r.lazy().with_columns(pl.col("amount") + 1.0))
            if (i + 1) % EVERY == 0:
                readings.append({"step": i + 1, "rmm": rmm_bytes(), **live_counts()})
        chain = referrer_chain("Column") if readings[-1]["Column"] > readings[0]["Column"] else []
        total = r.lazy().select(pl.col("amount").sum()).collect(engine=engine).item()
        end = rmm_bytes()
    return {"start": start, "readings": readings, "end": end, "total": total, "holders": chain}


def ours(path: Path) -> dict:
    from prefect_cudf_polars.blocks import CudfPolarsEngine

    readings = []
    with CudfPolarsEngine(backend="spmd", raise_on_fail=True).session() as session:
        start = session.memory_in_use()
        r = session.execute(pl.scan_parquet(path))
        for i in range(1, STEPS):
            nxt = session.execute(r.lazy().with_columns(pl.col("amount") + 1.0), lineage=None)
            r.release()  # as the tasks do once the engine call read the input
            r = nxt
            if (i + 1) % EVERY == 0:
                readings.append({"step": i + 1, "rmm": session.memory_in_use(), **live_counts()})
        chain = referrer_chain("Column") if readings[-1]["Column"] > readings[0]["Column"] else []
        total = session.collect(r.lazy().select(pl.col("amount").sum())).item()
        end = session.memory_in_use()
    return {"start": start, "readings": readings, "end": end, "total": total, "holders": chain}


def in_prefect(path: Path) -> dict:
    from prefect import flow

    from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner, get_engine_session
    from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task

    @gpu_task
    def bump(r: GPUResult) -> pl.LazyFrame:
        return r.lazy().with_columns(pl.col("amount") + 1.0)

    out: dict = {"readings": []}

    @flow(task_runner=CudfPolarsTaskRunner(CudfPolarsEngine(backend="spmd", raise_on_fail=True)))
    def chain():
        session = get_engine_session()
        out["start"] = session.memory_in_use()
        r = execute(pl.scan_parquet(path))
        for i in range(1, STEPS):
            r = bump(r)
            if (i + 1) % EVERY == 0:
                out["readings"].append({"step": i + 1, "rmm": session.memory_in_use(), **live_counts()})
        if out["readings"][-1]["Column"] > out["readings"][0]["Column"]:
            out["holders"] = referrer_chain("Column")
        out["total"] = collect(r.lazy().select(pl.col("amount").sum())).item()
        out["end"] = session.memory_in_use()

    chain()
    return out


def main() -> dict:
    path = Path(tempfile.mkdtemp()) / "orders.parquet"
    pl.DataFrame(
        {"id": list(range(1000)), "customer": [i % 7 for i in range(1000)],
         "amount": [float(i % 97) for i in range(1000)]}
    ).write_parquet(path)
    result = {}
    for name, fn in (("cudf_polars_alone", raw), ("our_session", ours), ("prefect_tasks", in_prefect)):
        result[name] = fn(path)
        print(name, json.dumps(result[name], indent=1), flush=True)
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
