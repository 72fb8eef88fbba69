"""
Lineage: how a :class:`~prefect_cudf_polars.tasks.GPUResult` was produced, so it can be produced again.

Developer notes
---------------
A result is read once (cudf-polars moves its partitions out on read). Two
things need a consumed result again: a retried task whose first attempt read
its input and then failed, and a fan-out (:func:`~prefect_cudf_polars.tasks.tee`)
that needs N results from one. Both use the same root: each result records the
plan that produced it — the producing function and its arguments, where any
argument that is itself a result carries its own lineage, down to the scans —
and a replay runs that plan again on the same engine session.

* ``execute(lf)`` records ``lf``; ``execute(r)`` records ``r``;
  ``gpu_task(fn)(*args)`` records ``fn`` and ``args``.
* A replay never reads an existing result: every result argument is replayed
  from its own lineage first (recursively), so a replay steals no data from
  another consumer. Fresh inputs the function does not read are released.
  The replay itself is the engine-call protocol's
  (:func:`prefect_cudf_polars.tasks.calls.replay`): a lineage is only a record.
* A query is replayable when its plan reads only files, in-memory frames or
  other replayable results. A plan holding an in-process IO source (polars'
  ``PYTHON SCAN``, which is what ``GPUResult.lazy()`` builds) is not: that
  source was a result's ``.lazy()`` frame, built outside a GPU task, whose
  data was moved out when it was read. :meth:`Lineage.unreplayable_reason`
  says so, and callers raise :class:`~prefect_cudf_polars.tasks.CannotRecomputeError`.
* A replay reads the scans again: if the files changed since, the replayed
  result reflects the files as they are now.
* A deferred step's lineage is marked ``deferred``: its replay is deferred
  again (``session.defer``), so a retried reader of a deferred result runs the
  fused plan once more, and the fresh inputs that replayed plan reads are held
  by the replayed result instead of being freed.

A lineage holds Python references only (functions, arguments, LazyFrame plans),
never engine memory: a consumed or released result's partitions are gone
whatever its lineage keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from prefect.utilities.collections import visit_collection

from prefect_cudf_polars.blocks.backends.plans import reads_in_process_source
from prefect_cudf_polars.blocks.results import GPUResult

#: Deepest lineage :meth:`Lineage.unreplayable_reason` follows.
MAX_LINEAGE_DEPTH = 200


def _run_as_is(query: Any) -> pl.LazyFrame:
    """The lineage function of ``execute``: the query itself, or the result's frame."""
    return query.lazy() if isinstance(query, GPUResult) else query


class Lineage:
    """
    The recorded plan of one result: ``build(*args, **kwargs)`` returns its LazyFrame.

    Parameters
    ----------
    build
        Function returning the query (a ``polars.LazyFrame``); it may call
        ``.lazy()`` on result arguments.
    args, kwargs
        Its arguments as given; results among them (also inside lists, tuples
        and dicts) are replayed from their own lineage first.
    label
        Readable name of the step, e.g. ``"gpu_task 'summarise'"``.
    deferred
        The step is deferred: a replay defers it again.
    environment
        What the engine call had set (object-store credentials of an S3 read);
        a replay sets it again. Never shown.
    """

    __slots__ = ("args", "build", "deferred", "environment", "kwargs", "label")

    def __init__(self, build: Callable[..., pl.LazyFrame], args: tuple[Any, ...] = (),
                 kwargs: Mapping[str, Any] | None = None, *, label: str, deferred: bool = False,
                 environment: Mapping[str, str | None] | None = None) -> None:
        self.build, self.args, self.kwargs = build, tuple(args), dict(kwargs) if kwargs else {}
        self.label, self.deferred, self.environment = label, deferred, environment

    @classmethod
    def of_query(cls, query: Any, *, deferred: bool = False,
                 environment: Mapping[str, str | None] | None = None) -> Lineage:
        """The lineage of ``execute(query)`` (a LazyFrame or a GPUResult), deferred or not, with its call's environment."""
        label = "execute(LazyFrame)" if isinstance(query, pl.LazyFrame) else "execute(GPUResult)"
        return cls(_run_as_is, (query,), label=label, deferred=deferred, environment=environment)

    def unreplayable_reason(self, _depth: int = 0) -> str | None:
        """
        Why this lineage cannot be run again, or ``None`` when it can.

        Returns
        -------
        str or None
            One sentence naming the step and the input that stops the replay.
        """
        if _depth > MAX_LINEAGE_DEPTH:
            return f"its lineage is deeper than {MAX_LINEAGE_DEPTH} steps (at {self.label})"
        found: list[Any] = []
        visit_collection((self.args, self.kwargs), found.append, return_data=False)
        for value in found:
            if isinstance(value, pl.LazyFrame) and reads_in_process_source(value):
                return (f"the query given to {self.label} reads an in-process source (a GPUResult's .lazy() "
                        "frame built outside a GPU task) whose data was moved out when it was read, and "
                        "prefect-cudf-polars cannot tell which result it was. Pass the GPUResult itself to a "
                        "gpu_task (or to execute) so its lineage is recorded")
            if not isinstance(value, GPUResult):
                continue
            if (lineage := value.lineage) is None:  # read once: the session's end may drop it meanwhile
                return f"its input {value.name!r} (id {value.id}) has no recorded lineage (at {self.label})"
            if (reason := lineage.unreplayable_reason(_depth + 1)) is not None:
                return reason
        return None

    def __repr__(self) -> str:
        return f"Lineage({self.label})"
