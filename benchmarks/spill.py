"""
Moving held results out of device memory and back, by both routes, and ``tee``'s copies, on ``spmd``.

``python -m benchmarks.spill --sizes 1,2,4,8 --runs 5 --out DIR [--lineitem PATH]`` opens one
engine session (``spmd``, no limit) and, for each size (GB of device memory a result holds: a
table of ``k`` int64 and ``v`` float64, 16 bytes a row, made on the host once and executed into
the engine), times on the engine's owner thread, interleaved, ``R`` rounds (after one warm-up
round) of the session's own moves of one result:

==========================  ==========================================================================
route                       out, then back
==========================  ==========================================================================
``pinned``                  the backend's ``move_out`` (each partition packed straight into the
                            engine's pinned pool) and ``move_back`` (one DMA copy into device memory,
                            unpacked into the same store slot)
``pinned, packed via        the same, the pack writing into device memory first, then one DMA copy
device``                    into the pinned pool
``host frame``              the engine collects the result to a host ``polars.DataFrame``; a query that
                            reads it back (``execute`` of the frame) copies the rows into the engine
==========================  ==========================================================================

GB/s is the result's bytes (rmm's count of its device buffers) over the move's wall time
(``time.perf_counter``), medians over the rounds. Every round checks the rows that come back
(row count and the sum of ``k``). With ``--lineitem``, it also times ``tee``'s second copy of
that table loaded into the engine: the backend's device copy against producing it again from its
scan (what ``tee`` does where it cannot copy), in ms per GB of the table. Each size's warm-up round
by the pinned route is reported apart (``first_pinned``: the engine's first move makes its pinned pool,
a larger result grows it), with the pool's size at the end (``pinned_pool_bytes``).
Writes ``DIR/spill.json`` and ``DIR/spill.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from benchmarks.stats import summary
from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.backends import streaming

ROUTES = ("pinned", "pinned, packed via device", "host frame")
GB = 1e9


def rows_of(size_gb: float) -> int:
    """Rows of the 16-byte-a-row table that holds ``size_gb`` GB."""
    return int(size_gb * GB // 16)


def table(rows: int) -> pl.DataFrame:
    """``k`` 0..rows-1 (int64) and ``v`` (float64), made on the host."""
    k = np.arange(rows, dtype=np.int64)
    return pl.DataFrame({"k": k, "v": k.astype(np.float64) * 0.5})


def rows_and_sum(running: Any, persisted: Any) -> tuple[int, int]:
    """Read ``persisted`` (consuming it): its row count and the sum of ``k``."""
    out = running.collect(persisted.lazy().select(pl.len(), pl.col("k").sum()), pl.QueryOptFlags())
    return int(out[0, 0]), int(out[0, 1])


def one_round(running: Any, source: pl.DataFrame, route: str, pool_bytes: int) -> dict[str, float]:
    """On the owner thread: make the result, move it out and back by ``route``; seconds each way and its bytes."""
    flags = pl.QueryOptFlags()
    persisted = running.execute(source.lazy(), flags)
    size = running.read(persisted).bytes
    if route == "host frame":
        started = time.perf_counter()
        frame = running.collect(persisted.lazy(), flags)
        persisted.release()
        out = time.perf_counter() - started
        started = time.perf_counter()
        persisted = running.execute(frame.lazy(), flags)
        back = time.perf_counter() - started
        del frame
    else:
        streaming.PACK_VIA_DEVICE = route == "pinned, packed via device"
        started = time.perf_counter()
        assert running.move_out(persisted, pool_bytes), "the backend cannot move a result into pinned memory"
        out = time.perf_counter() - started
        started = time.perf_counter()
        running.move_back(persisted)
        back = time.perf_counter() - started
        streaming.PACK_VIA_DEVICE = False
    rows, total = rows_and_sum(running, persisted)
    persisted.release()
    expected = source.height
    if rows != expected or total != expected * (expected - 1) // 2:
        raise AssertionError(f"{route}: {rows} rows and sum {total} came back, not {expected} rows")
    return {"out_s": out, "back_s": back, "bytes": size}


def tee_round(running: Any, lineitem: str) -> dict[str, float]:
    """On the owner thread: the loaded table, one device copy and one load again; seconds of each and its bytes."""
    flags = pl.QueryOptFlags()
    loaded = running.execute(pl.scan_parquet(lineitem), flags)
    size = running.read(loaded).bytes
    started = time.perf_counter()
    copied = running.copy(loaded)
    copy_s = time.perf_counter() - started
    started = time.perf_counter()
    again = running.execute(pl.scan_parquet(lineitem), flags)
    replay_s = time.perf_counter() - started
    rows = [rows_and_sum_any(running, p) for p in (loaded, copied, again)]
    if len(set(rows)) != 1:
        raise AssertionError(f"tee copies differ: {rows}")
    return {"copy_s": copy_s, "replay_s": replay_s, "bytes": size}


def rows_and_sum_any(running: Any, persisted: Any) -> tuple[int, float]:
    """Read ``persisted``: its rows and the sum of its first numeric column."""
    lf = persisted.lazy()
    column = next(name for name, dtype in lf.collect_schema().items() if dtype.is_numeric())
    out = running.collect(lf.select(pl.len(), pl.col(column).sum()), pl.QueryOptFlags())
    persisted.release()
    return int(out[0, 0]), float(out[0, 1])


def measure(sizes: list[float], runs: int, lineitem: str | None) -> dict[str, Any]:
    """Every size's rounds (module docstring), then ``tee``'s; GB/s and ms per GB as medians."""
    out: dict[str, Any] = {"sizes": {}, "runs": runs}
    with CudfPolarsEngine(backend="spmd", raise_on_fail=True).session() as session:
        running, pool_bytes = session.running_engine, session.summary()["held"]["host_limit"]
        for size in sizes:
            source = table(rows_of(size))
            rounds: dict[str, list[dict[str, float]]] = {route: [] for route in ROUTES}
            for index in range(runs + 1):
                for route in ROUTES:
                    measured = session.run(one_round, running, source, route, pool_bytes)
                    if index:  # after the warm-up round, which makes or grows the pinned pool (a timed one may too)
                        rounds[route].append(measured)
                    elif route == "pinned":  # the engine's first move makes the pool, then each size grows it
                        out.setdefault("first_pinned", {})[f"{size:g}"] = {
                            "out_gbps": measured["bytes"] / measured["out_s"] / GB,
                            "back_gbps": measured["bytes"] / measured["back_s"] / GB}
            del source
            out["sizes"][f"{size:g}"] = {
                route: {
                    "bytes": values[0]["bytes"],
                    "out_gbps": summary([v["bytes"] / v["out_s"] / GB for v in values]),
                    "back_gbps": summary([v["bytes"] / v["back_s"] / GB for v in values]),
                }
                for route, values in rounds.items()
            }
            print(f"{size:g} GB:", {r: (round(v["out_gbps"]["median"], 1), round(v["back_gbps"]["median"], 1))
                                   for r, v in out["sizes"][f"{size:g}"].items()}, flush=True)
        if lineitem:
            tees = [session.run(tee_round, running, lineitem) for _ in range(runs + 1)][1:]
            per_gb = lambda key: [t[key] * 1000 / (t["bytes"] / GB) for t in tees]  # noqa: E731
            out["tee"] = {"bytes": tees[0]["bytes"], "copy_ms_per_gb": summary(per_gb("copy_s")),
                          "replay_ms_per_gb": summary(per_gb("replay_s"))}
            print("tee:", {k: v["median"] if isinstance(v, dict) else v for k, v in out["tee"].items()}, flush=True)
        out["pinned_pool_bytes"] = running.pinned_pool(pool_bytes).pool_size()
        out["memory_at_end"] = session.memory_in_use()
    return out


def markdown(results: dict[str, Any]) -> str:
    """The results as two tables (GB/s by size and route; tee in ms per GB)."""
    lines = ["# Held results out of device memory and back (spmd)", "",
             f"Medians of {results['runs']} rounds after one warm-up round, GB/s = the result's bytes over the "
             "move's wall time; every round's rows checked.", "",
             "| GB | route | out GB/s [95 %] | back GB/s [95 %] |", "|---:|---|---:|---:|"]
    for size, routes in results["sizes"].items():
        for route, v in routes.items():
            fmt = lambda s: f"{s['median']:.1f}" + (f" [{s['ci'][0]:.1f}, {s['ci'][1]:.1f}]" if s["ci"] else "")  # noqa: E731
            lines.append(f"| {size} | {route} | {fmt(v['out_gbps'])} | {fmt(v['back_gbps'])} |")
    if first := results.get("first_pinned"):
        lines += ["", "Each size's warm-up round by the pinned route (the engine's first move makes its pinned pool; a "
                  "larger result grows it), GB/s out and back: " + "; ".join(
                      f"{size} GB: {v['out_gbps']:.1f} and {v['back_gbps']:.1f}" for size, v in first.items())
                  + f". The pinned pool holds {results['pinned_pool_bytes']:,} bytes at the end."]
    if tee := results.get("tee"):
        lines += ["", f"`tee` of a loaded table of {tee['bytes'] / GB:.2f} GB: its second copy",
                  "", "| how | ms per GB [95 %] |", "|---|---:|",
                  *(f"| {name} | {tee[key]['median']:.2f}" + (f" [{tee[key]['ci'][0]:.2f}, {tee[key]['ci'][1]:.2f}]"
                                                                 if tee[key]["ci"] else "") + " |"
                    for name, key in (("device copy", "copy_ms_per_gb"), ("load again from its scan",
                                                                           "replay_ms_per_gb")))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--sizes", default="1,2,4,8", help="GB of each result, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="timed rounds per size and route (default 5)")
    parser.add_argument("--lineitem", help="a TPC-H lineitem parquet file: also time tee's device copy of it")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    results = measure([float(s) for s in args.sizes.split(",")], args.runs, args.lineitem)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "spill.json").write_text(json.dumps(results, indent=2, default=str))
    (args.out / "spill.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
