"""
``results.json``: every measurement, written again after each one, so a crash or a timeout keeps what was done.

Layout (``schema`` 2)::

    {"schema": 2, "started_at", "finished_at", "command", "settings", "machine",
     "data": {"<sf>": {...}},                      # tpch_data.ensure_tpch, minus paths
     "engines": {"<sf>": {...}},                   # session summary, threads, flow run seconds
     "measurements": [                            # one per (sf, pipeline, variant)
        {"scale_factor", "pipeline", "variant", "status": "ok"|"failed"|"skipped",
         "error", "median_s", "min_s", "runs_s", "warmup_s", "steps_median_s",
         "cut_short", "matches_reference", "reference"}],
     "task_overhead": [                           # (f), one per (sf, name)
        {"scale_factor", "name", "status", "error", "median_ms", "p10_ms", "p90_ms",
         "calls", "runs_ms"}],
     "task_path_profile": {"<sf>": {piece: ms per call}},
     "breakdown": {"<sf>": {...}},                # benchmarks.breakdown.run_breakdown
     "session_start": {...},                      # benchmarks.session_start.measure
     "goals": [...],                              # benchmarks.report.goals
     "errors": [...],                             # failures outside a measurement
     "commands", "merged_from": [...]}            # only in a merged file: its parts

A merged file (:func:`merge_documents`) holds the measurements of several
commands: ``commands`` lists each one, ``command`` is the first, and each
measurement names its ``part``.
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

SCHEMA = 2


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception (an ExceptionGroup's first member included)."""
    text = f"{type(exc).__name__}: {exc}"
    for inner in getattr(exc, "exceptions", ())[:1]:
        text += f" [{type(inner).__name__}: {inner}]"
    return text[:2000]


def new_document(command: list[str], settings: dict[str, Any]) -> dict[str, Any]:
    """A ``results.json`` document with nothing measured yet, started now."""
    return {
        "schema": SCHEMA,
        "started_at": _now(),
        "finished_at": None,
        "command": command,
        "settings": settings,
        "machine": {},
        "data": {},
        "engines": {},
        "measurements": [],
        "task_overhead": [],
        "task_path_profile": {},
        "breakdown": {},
        "session_start": {},
        "goals": [],
        "errors": [],
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
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / "results.json"
        self.doc: dict[str, Any] = new_document(command, settings)
        #: Final DataFrames per (sf, pipeline, variant), for the correctness check.
        self.frames: dict[tuple[str, str, str], Any] = {}
        self.save()

    def save(self) -> None:
        """Write ``results.json`` (via a temporary file and a rename)."""
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
        self.doc["errors"].append(
            {"where": where, "error": error_text(exc), "traceback": traceback.format_exc()[-4000:]}
        )
        self.save()

    def guard_for(self, sf: str) -> Callable[[tuple[str, str], Callable[[], Any]], Any]:
        """
        A guard for one scale factor: ``guard((pipeline, variant), fn)``.

        Runs ``fn``; a :class:`~benchmarks.timing.Timing` (pipelines) or a dict
        (task overhead, profile) is recorded with status ``ok``; an exception is
        recorded with status ``failed`` (``skipped`` when the budget was spent)
        and swallowed, so the next measurement still runs.
        """

        def guard(key: tuple[str, str], fn: Callable[[], Any]) -> Any:
            started = time.perf_counter()
            try:
                value = fn()
            except BudgetSpentError as exc:
                self._record(sf, key, status="skipped", error=str(exc))
                return None
            except Exception as exc:  # recorded; the next measurement still runs
                traceback.print_exc()
                self._record(
                    sf,
                    key,
                    status="failed",
                    error=error_text(exc),
                    traceback=traceback.format_exc()[-4000:],
                )
                return None
            self._record(sf, key, status="ok", value=value, wall_s=time.perf_counter() - started)
            return value

        return guard

    def has(self, sf: str, key: tuple[str, str]) -> bool:
        """Whether a measurement (or task-overhead entry) is recorded for ``key``."""
        group, name = key
        if group == "task-overhead" and name == "profile":
            return sf in self.doc["task_path_profile"]
        if group == "task-overhead":
            return all(
                any((m["scale_factor"], m["name"]) == (sf, one) for m in self.doc["task_overhead"])
                for one in name.split(",")
            )
        return any(
            (m["scale_factor"], m["pipeline"], m["variant"]) == (sf, group, name)
            for m in self.doc["measurements"]
        )

    def skip(self, sf: str, key: tuple[str, str], reason: str) -> None:
        """Record a measurement that did not run (its engine did not start, ...)."""
        self._record(sf, key, status="skipped", error=reason)

    def fail(self, sf: str, key: tuple[str, str], exc: BaseException) -> None:
        """Record a measurement that could not run because of ``exc`` (unless recorded)."""
        if not self.has(sf, key):
            self._record(sf, key, status="failed", error=error_text(exc))

    def _record(
        self, sf: str, key: tuple[str, str], *, status: str, value: Any = None, **extra: Any
    ) -> None:
        group, name = key
        if group == "task-overhead" and name == "profile":
            self.doc["task_path_profile"][sf] = (
                value if status == "ok" else {"status": status, **extra}
            )
            self.save()
            return
        if group == "task-overhead":
            # ``name`` may join several interleaved measurements: "bare,plain-task,noop-task".
            for one in name.split(","):
                entry = {"scale_factor": sf, "name": one, "status": status, **extra}
                if isinstance(value, dict) and isinstance(value.get(one), dict):
                    entry.update(value[one])
                self.doc["task_overhead"].append(entry)
            self.save()
            return
        entry = {"scale_factor": sf, "pipeline": group, "variant": name, "status": status, **extra}
        if isinstance(value, Timing):
            entry.update(value.as_dict())
            self.frames[(sf, group, name)] = value.result
        self.doc["measurements"].append(entry)
        self.save()

    def check_results(
        self,
        sf: str,
        compare: Callable[[Any, Any], str | None],
        references: dict[str, Any] | None = None,
    ) -> None:
        """
        Compare every variant's final DataFrame with the reference of its pipeline.

        The reference is variant ``e`` (polars on the CPU, timed) where it ran,
        else ``references[pipeline]`` (the same query collected on the CPU,
        untimed; named ``"cpu"``). Sets ``matches_reference`` (bool) and
        ``reference`` on each measurement, and ``mismatch`` with ``compare``'s
        text when they differ.
        """
        references = references or {}
        for entry in self.doc["measurements"]:
            if entry["scale_factor"] != sf or entry["status"] != "ok":
                continue
            pipeline = entry["pipeline"]
            if (sf, pipeline, "e") in self.frames:
                ref_name, reference = "e", self.frames[(sf, pipeline, "e")]
            elif pipeline in references:
                ref_name, reference = "cpu", references[pipeline]
            else:
                continue
            problem = compare(self.frames[(sf, pipeline, entry["variant"])], reference)
            entry["reference"] = ref_name
            entry["matches_reference"] = problem is None
            if problem is not None:
                entry["mismatch"] = problem[:1000]
        self.save()

    def finish(self) -> None:
        """Stamp ``finished_at`` and save."""
        self.doc["finished_at"] = _now()
        self.save()


def merge_documents(docs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """
    Several ``results.json`` documents of one machine and backend as one.

    Measurements are keyed by (scale factor, pipeline, variant), task-overhead
    entries by (scale factor, name), profiles and breakdowns by scale factor;
    where two documents hold the same key, the first one's entry is kept and
    the others are listed under ``merged_from[i]["dropped"]``.

    Parameters
    ----------
    docs
        The documents, in order of precedence.
    names
        Where each came from (shown in the merged file).

    Returns
    -------
    dict
        The merged document (goals and reports not yet computed).

    Raises
    ------
    ValueError
        When no document is given, or their backends differ.
    """
    if not docs:
        raise ValueError("give at least one results folder")
    backends = {d["settings"].get("backend") for d in docs}
    if len(backends) > 1:
        raise ValueError(f"the parts ran on different backends ({sorted(map(str, backends))})")
    first = docs[0]
    merged = new_document(first["command"], _merged_settings([d["settings"] for d in docs]))
    merged |= {
        "started_at": min(d["started_at"] for d in docs),
        "finished_at": max((d.get("finished_at") or "") for d in docs) or None,
        "commands": [" ".join(d["command"]) for d in docs],
        "machine": first.get("machine", {}),
        "merged_from": [],
    }
    seen: set[tuple[str, ...]] = set()
    for doc, name in zip(docs, names, strict=True):
        dropped: list[str] = []

        def keep(key: tuple[str, ...]) -> bool:
            if key in seen:
                dropped.append("/".join(key))
                return False
            seen.add(key)
            return True

        for m in doc.get("measurements", []):
            if keep(("m", m["scale_factor"], m["pipeline"], m["variant"])):
                merged["measurements"].append({**m, "part": name})
        for m in doc.get("task_overhead", []):
            if keep(("f", m["scale_factor"], m["name"])):
                merged["task_overhead"].append(m)
        for field in ("task_path_profile", "breakdown"):
            for sf, value in doc.get(field, {}).items():
                if keep((field, sf)):
                    merged[field][sf] = value
        for sf, value in doc.get("data", {}).items():
            merged["data"].setdefault(sf, value)  # the same tables, generated or reused
        for sf, value in doc.get("engines", {}).items():
            merged["engines"].setdefault(sf, {})
            for k, v in value.items():
                merged["engines"][sf].setdefault(k, v)
        if doc.get("session_start") and keep(("session_start",)):
            merged["session_start"] = doc["session_start"]
        merged["errors"] += [{**e, "where": f"{name}: {e['where']}"} for e in doc.get("errors", [])]
        merged["merged_from"].append(
            {"part": name, "command": " ".join(doc["command"]), "dropped": dropped}
        )
    return merged


def _merged_settings(all_settings: list[dict[str, Any]]) -> dict[str, Any]:
    """Settings of merged parts: lists united in first-seen order; other values as one or a list."""
    merged: dict[str, Any] = {}
    for settings in all_settings:
        for key, value in settings.items():
            if isinstance(value, list):
                known = merged.setdefault(key, [])
                known += [v for v in value if v not in known]
            elif key not in merged:
                merged[key] = value
            elif merged[key] != value:
                known = merged[key] if isinstance(merged[key], set) else {merged[key]}
                merged[key] = known | {value}
    return {k: sorted(v, key=str) if isinstance(v, set) else v for k, v in merged.items()}
