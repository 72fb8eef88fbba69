"""
``results.json``: every measurement, written again after each one, so that a crash or a timeout keeps what was done.

Layout (``schema`` 3; seconds unless a name says ms)::

    {"schema": 3, "started_at", "finished_at", "command", "settings", "machine",
     "data": {"<sf>": {...}},             # tpch_data.ensure_tpch, without the paths
     "engines": {"<sf>": {...}},          # the variants' flow run: session summary, threads, wall
     "measurements": [                    # one per (sf, pipeline, variant)
        {"scale_factor", "pipeline", "variant", "status": "ok"|"failed"|"skipped", "error",
         "median_s", "ci_s", "min_s", "runs_s", "warmup_s", "steps_median_s", "cut_short",
         "matches_reference", "reference", "mismatch", "part"}],
     "task_overhead": {"<sf>": {...}},    # task_overhead.measure, with "status"
     "many_tasks": {...},                 # many_tasks.measure, with "status"
     "session_start": {...},              # session_start.measure
     "goals": [...],                      # goals.goals
     "errors": [...],                     # failures outside a measurement
     "commands", "merged_from": [...]}    # only in a merged file: its parts
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.timing import BudgetSpentError, Timing

SCHEMA = 3


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception (an ExceptionGroup's first member included)."""
    text = f"{type(exc).__name__}: {exc}"
    for inner in getattr(exc, "exceptions", ())[:1]:
        text += f" [{type(inner).__name__}: {inner}]"
    return text[:2000]


def attempt(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()``'s dict with ``status: ok``; or ``status: skipped`` (budget spent) or ``failed`` with the ``error``."""
    try:
        return {"status": "ok", **fn()}
    except BudgetSpentError as exc:
        return {"status": "skipped", "error": str(exc)}
    except Exception as exc:  # recorded; the next measurement still runs
        traceback.print_exc()
        return {"status": "failed", "error": error_text(exc), "traceback": traceback.format_exc()[-4000:]}


def new_document(command: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` document with nothing measured yet, started now."""
    return {
        "schema": SCHEMA, "started_at": _now(), "finished_at": None, "command": command, "settings": settings,
        "machine": {}, "data": {}, "engines": {}, "measurements": [], "task_overhead": {}, "many_tasks": {},
        "session_start": {}, "goals": [], "errors": [],
    }


class ResultsFile:
    """
    The results of one benchmark command, saved to ``out/results.json`` on every change.

    Parameters
    ----------
    out
        Output folder (created if missing).
    command, settings
        The command line and its parsed settings, stored as they are.
    """

    def __init__(self, out: Path, *, command: list[str], settings: dict[str, Any]) -> None:
        self.path = Path(out) / "results.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.doc = new_document(command, settings)
        #: Final DataFrames per (sf, pipeline, variant), for the correctness check.
        self.frames: dict[tuple[str, str, str], Any] = {}
        self.save()

    def save(self) -> None:
        """Write ``results.json`` (a temporary file, then a rename)."""
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        os.replace(tmp, self.path)

    def set(self, key: str, value: Any, *, sf: str | None = None) -> None:
        """Set a top-level field (or ``field[sf]``) and save."""
        if sf is None:
            self.doc[key] = value
        else:
            self.doc[key][sf] = value
        self.save()

    def error(self, where: str, exc: BaseException) -> None:
        """Record a failure outside a measurement (data generation, an engine start)."""
        entry = {"where": where, "error": error_text(exc), "traceback": traceback.format_exc()[-4000:]}
        self.doc["errors"].append(entry)
        self.save()

    def record(self, sf: str, pipeline: str, variant: str, outcome: Timing | BaseException) -> None:
        """Record a variant's :class:`~benchmarks.timing.Timing`, or what stopped it (``skipped``: the budget)."""
        entry: dict[str, Any] = {"scale_factor": sf, "pipeline": pipeline, "variant": variant}
        if isinstance(outcome, Timing):
            entry |= {"status": "ok", **outcome.as_dict()}
            self.frames[(sf, pipeline, variant)] = outcome.result
        else:
            status = "skipped" if isinstance(outcome, BudgetSpentError) else "failed"
            entry |= {"status": status, "error": error_text(outcome)}
        self.doc["measurements"].append(entry)
        self.save()

    def check_results(self, sf: str, compare: Callable[[Any, Any], str | None], references: dict[str, Any]) -> None:
        """
        Compare every variant's final DataFrame with its pipeline's reference.

        The reference is variant ``e`` (polars on the CPU, timed) where it ran,
        else ``references[pipeline]`` (the fused query collected on the CPU,
        untimed: ``"cpu"``). Sets ``matches_reference``, ``reference`` and, when
        they differ, ``mismatch`` (``compare``'s text).
        """
        for entry in self.doc["measurements"]:
            pipeline, key = entry["pipeline"], (sf, entry["pipeline"], entry["variant"])
            if entry["scale_factor"] != sf or key not in self.frames:
                continue
            if (sf, pipeline, "e") in self.frames:
                ref_name, reference = "e", self.frames[(sf, pipeline, "e")]
            else:
                ref_name, reference = "cpu", references.get(pipeline)
            if reference is None:
                continue
            problem = compare(self.frames[key], reference)
            entry |= {"reference": ref_name, "matches_reference": problem is None}
            if problem is not None:
                entry["mismatch"] = problem[:1000]
        self.save()

    def finish(self) -> None:
        """Stamp ``finished_at`` and save."""
        self.set("finished_at", _now())


def merge_documents(docs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """
    Several ``results.json`` documents of one machine and backend as one.

    Measurements are keyed by (scale factor, pipeline, variant), (f) by scale
    factor; where two documents hold the same key the first one's entry is
    kept and the others are listed under ``merged_from[i]["dropped"]``.

    Parameters
    ----------
    docs
        The documents, in order of precedence.
    names
        Where each came from (each measurement names its ``part``).

    Raises
    ------
    ValueError
        When no document is given, or their backends differ.
    """
    if not docs:
        raise ValueError("give at least one results folder")
    if len({d["settings"].get("backend") for d in docs}) > 1:
        backends = sorted(str(d["settings"].get("backend")) for d in docs)
        raise ValueError(f"the parts ran on different backends ({backends})")
    settings: dict[str, Any] = {}
    for d in docs:
        for key, value in d["settings"].items():
            if isinstance(value, list):
                settings[key] = settings.get(key, []) + [v for v in value if v not in settings.get(key, [])]
            else:
                settings.setdefault(key, value)
    merged = new_document(docs[0]["command"], settings) | {
        "started_at": min(d["started_at"] for d in docs),
        "finished_at": max((d.get("finished_at") or "") for d in docs) or None,
        "commands": [" ".join(d["command"]) for d in docs],
        "machine": docs[0].get("machine", {}),
        "merged_from": [],
    }
    seen: set[tuple[str, ...]] = set()
    for doc, name in zip(docs, names, strict=True):
        dropped: list[str] = []

        def keep(*key: str) -> bool:
            if key in seen:
                dropped.append("/".join(key))
                return False
            seen.add(key)
            return True

        merged["measurements"] += [
            {**m, "part": name} for m in doc["measurements"] if keep(m["scale_factor"], m["pipeline"], m["variant"])
        ]
        for sf, value in doc["task_overhead"].items():
            if keep("task-overhead", sf):
                merged["task_overhead"][sf] = value
        for field in ("many_tasks", "session_start"):
            if doc[field] and keep(field):
                merged[field] = doc[field]
        for field in ("data", "engines"):
            for sf, value in doc[field].items():
                merged[field].setdefault(sf, value)
        merged["errors"] += [{**e, "where": f"{name}: {e['where']}"} for e in doc["errors"]]
        merged["merged_from"].append({"part": name, "command": " ".join(doc["command"]), "dropped": dropped})
    return merged
