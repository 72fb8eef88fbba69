"""
Plans that read a result's frame: the optimizations the engines run them with, and the reads refused before they run.

A result's frame (``GPUResult.lazy()``) is a polars IO-plugin scan on every
backend (``register_io_source``: cudf-polars' ``PersistedSource``, the ``cpu``
backend's host source), shown as ``PYTHON SCAN`` by ``LazyFrame.explain``.
Two things polars does to such a scan cudf-polars 26.10 does not run, so the
session prepares every plan here (:func:`prepare`) before any engine sees it,
and the ``cpu`` backend runs what the GPU runs:

* **Row limits.** polars 1.44's slice pushdown moves the row count of
  ``head(n)``, ``limit(n)`` and ``slice(0, n)`` (also after ``with_columns``)
  into the scan; cudf-polars 26.10 refuses a row limit on a Python scan when it
  translates the plan ("A row limit (head/limit) on a PythonScan source is not
  supported": one global limit cannot be enforced rank by rank). A plan that
  reads a ``PYTHON SCAN`` and whose row limit polars would push into a scan
  therefore runs with ``slice_pushdown=False``: the limit stays a ``SLICE`` above the scan, which
  cudf-polars runs. Every other plan keeps every optimization: a limit that
  stops above the scan (``sort(...).head(n)`` after an aggregation runs as a
  top-k sort, as bare cudf-polars runs it), and plans without such a scan
  (``scan_parquet(p).head(n)`` still reads ``n`` rows).
* **Zero columns.** A query that needs none of a scan's columns
  (``with_row_index()`` keeping only the index, ``select(pl.lit(1))``, SQL
  ``count(*)``) gets a zero-column projection, which cudf-polars 26.10's
  ``PersistedSource`` refuses when it runs ("does not support a zero-column
  projection"), and from which no row count can be read. It is refused here,
  before any engine runs, naming the form that works. ``select(pl.len())``
  reads one column in polars 1.44 and runs everywhere.
* **Several reads of one frame.** A result's frame is a ``cache()`` over its
  scan (``GPUResult.lazy``), so every use of it in one plan shares one cache id
  (``CACHE[id: ...]`` in ``explain``) and the scan runs once: cudf-polars 26.10
  fans the cached partitions out to each consumer. polars 1.44's common-subplan
  elimination splits such a cache back into one scan per use when the branches
  differ (a ``concat`` of two filters), and a second scan of a result finds
  its partitions gone; a plan that uses one cache more than once therefore
  runs with ``comm_subplan_elim=False``. Plans that read each frame once keep
  the defaults (polars drops a cache with one consumer, so projections and
  row limits still reach the scan).
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import polars as pl

#: polars' ``explain()`` name of an IO-plugin scan (``register_io_source``), as of polars 1.44.
IN_PROCESS_SCAN = "PYTHON SCAN"
# polars 1.44's explain() prints a scan's projection on the line below it ("PROJECT 0/3 COLUMNS").
_ZERO_COLUMN_SCAN = re.compile(rf"{IN_PROCESS_SCAN}[^\n]*\n[ \t]*PROJECT 0/")
# ... and a row limit pushed into a scan as a line of the scan's own ("SLICE: Positive {...}");
# a limit that stays above the scans is a node ("SLICE[...]") or part of a top-k sort
# ("SORT BY [slice: ...]"). Any pushed limit in a plan that reads a PYTHON SCAN counts (a
# literal in a selection may span lines, so which scan it belongs to is not read): a wrong
# match costs an optimization, a miss would fail the query.
_PUSHED_SLICE = re.compile(r"(?m)^[ \t]*SLICE: ")
# ... and each use of a cached frame as "CACHE[id: <id>]" in the logical plan.
_CACHE = re.compile(r"CACHE\[id: ([^\]]+)\]")

ZERO_COLUMN_MESSAGE = ("This query reads a GPU result's frame (or another polars IO source) without any of its "
                       "columns, for example `with_row_index()` keeping only the index, `select(pl.lit(1))`, or SQL "
                       "`count(*)`. cudf-polars 26.10 does not support a zero-column projection of a persisted result, "
                       "so no engine runs it. Read at least one of the result's columns: "
                       "`result.lazy().select(pl.len())` counts rows (polars reads one column for it), and "
                       "`result.lazy().with_row_index().select('index', <a column>)` numbers them.")


def cache_uses(plan: str) -> Counter[str]:
    """How many times a logical plan (``explain(optimized=False)``) uses each cache, by cache id."""
    return Counter(_CACHE.findall(plan))


def cache_id(lf: pl.LazyFrame) -> str | None:
    """The id of the cache ``lf`` ends in (a result's frame), as ``explain`` prints it; reads no data."""
    found = _CACHE.match(lf.explain(optimized=False))
    return found[1] if found else None


def input_reads(claimed: Iterable[Any], plan: str) -> list[dict[str, Any]]:
    """Per claimed result a plan reads: its name, id, reads in the plan (a self-join reads it twice), bytes per read."""
    uses = cache_uses(plan)
    return [{"name": r.name, "id": r.id, "reads": uses.get(r.cache_id, 1), "bytes_per_read": r.bytes}
            for r in claimed if not r.deferred]


def reads_in_process_source(lf: pl.LazyFrame) -> bool:
    """Whether a plan holds an IO-plugin scan (``PYTHON SCAN``), such as a result's frame (its logical plan; reads no data)."""
    return IN_PROCESS_SCAN in lf.explain(optimized=False)


def prepare(lf: pl.LazyFrame) -> tuple[pl.QueryOptFlags, str]:
    """
    Check ``lf`` before an engine runs it; the optimizations to run it with, and its logical plan.

    Planning reads no data and claims no result. Only a plan that reads an
    IO-plugin scan is optimized here (what polars would push into that scan
    decides the flags); other plans cost one unoptimized ``explain``.

    Parameters
    ----------
    lf : polars.LazyFrame
        The query an engine is about to run.

    Returns
    -------
    (flags, plan) : tuple of polars.QueryOptFlags and str
        For a plan that reads a ``PYTHON SCAN``: ``comm_subplan_elim=False``
        when it uses one cached frame more than once, ``slice_pushdown=False``
        when polars would push a row limit into a scan; polars' defaults
        otherwise. And the query's logical plan (``LazyFrame.explain(optimized=False)``).

    Raises
    ------
    NotImplementedError
        When the plan reads an IO-plugin scan (a result's frame) with zero
        columns; the message names the form that works. Nothing has run.
    """
    flags, plan = pl.QueryOptFlags(), lf.explain(optimized=False)
    if IN_PROCESS_SCAN in plan:
        flags.comm_subplan_elim = max(cache_uses(plan).values(), default=1) == 1
        optimized = lf.explain(optimizations=flags)
        if _PUSHED_SLICE.search(optimized):
            flags.slice_pushdown = False
            optimized = lf.explain(optimizations=flags)
        if _ZERO_COLUMN_SCAN.search(optimized):
            raise NotImplementedError(ZERO_COLUMN_MESSAGE)
    return flags, plan


def plans_later(lf: pl.LazyFrame) -> tuple[Callable[[], str], None]:
    """The plans of a result that reads no frame and has no artifact: its logical plan, made when its event is
    sent (off the caller's path), and no optimized plan (:func:`prepare_result`'s form)."""
    return functools.partial(lf.explain, optimized=False), None


def prepare_result(lf: pl.LazyFrame, *, optimized: bool) -> tuple[pl.QueryOptFlags, tuple[str, str | None]]:
    """
    :func:`prepare`, and the plans a result's events and artifact show.

    Returns
    -------
    (flags, (plan, optimized_plan))
        As for :func:`prepare`; ``optimized_plan`` is the plan the engine runs
        (``LazyFrame.explain(optimizations=flags)``) when ``optimized``, else ``None``.
    """
    flags, plan = prepare(lf)
    return flags, (plan, lf.explain(optimizations=flags) if optimized else None)
