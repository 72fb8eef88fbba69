"""
Sessions inside sessions: which nest, which share an engine, which are refused.

The innermost session wins (:mod:`~prefect_cudf_polars.blocks.active`). When a
session opens while another session of an enclosing flow run is open (a
subflow with its own ``CudfPolarsTaskRunner``, or a ``with block.session():``
in a subflow), :func:`engine_host` decides where its engine comes from:

* the blocks are equal (same fields): the new session runs on the enclosing
  session's engine, with its own id, results, counts, log lines, events,
  summary artifact and teardown (it releases only its own results and never
  stops the engine). cudf-polars' ``SPMDEngine`` replaces rmm's process-wide
  current device resource when it starts and restores, when it shuts down,
  whatever was current when it started (cudf-polars 26.10,
  ``engine/spmd.py``: ``set_memory_resource`` in its exit stack), and each
  engine's spill limit counts only its own memory, so two engines on one GPU
  do not mix well, while one engine serves any number of sessions;
* the enclosing session or the new one runs on the ``cpu`` backend: the new
  session starts its own engine (polars on the CPU touches no GPU);
* both need a GPU and the blocks differ: :class:`SessionError` naming both
  runs, raised at the first GPU call of the inner run, so that run fails.

Within one flow run sessions do not nest: a ``with block.session():`` inside a
flow run that already has one (its runner's, or another with block) is refused
(:func:`refuse_nesting`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_cudf_polars.blocks.backends.choice import resolve_backend
from prefect_cudf_polars.blocks.errors import SessionError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
    from prefect_cudf_polars.blocks.session.session import EngineSession


def same_configuration(a: CudfPolarsEngine, b: CudfPolarsEngine) -> bool:
    """Whether two engine blocks hold the same fields (saved or not, loaded or built)."""
    return type(a) is type(b) and a.model_dump() == b.model_dump()


def differences(child: CudfPolarsEngine, parent: CudfPolarsEngine) -> str:
    """``field=value`` of ``child`` for each field that differs from ``parent``."""
    mine, theirs = child.model_dump(), parent.model_dump()
    changed = [f"{k}={v!r}" for k, v in mine.items() if theirs.get(k) != v]
    return ", ".join(changed) or "the same fields"


def engine_host(block: CudfPolarsEngine, parent: EngineSession | None, *, run: str) -> EngineSession | None:
    """
    The session whose engine a new session runs on, or ``None`` to start its own engine.

    Parameters
    ----------
    block : CudfPolarsEngine
        The new session's block.
    parent : EngineSession or None
        The open session of the enclosing flow run, if any.
    run : str
        The new session's run, for messages (``"subflow run 'name'"``).

    Returns
    -------
    EngineSession or None
        The session that owns the engine to share (the enclosing one, or the
        one it shares in turn).

    Raises
    ------
    SessionError
        Both need a GPU engine and the blocks differ.
    NoGPUError
        The block asks for a GPU backend and none is usable here.
    """
    if parent is None or parent.closed:
        return None
    host = parent.engine_owner
    if same_configuration(block, host.block):
        return host
    if host.backend == "cpu" or resolve_backend(block)[0] == "cpu":
        return None
    raise SessionError(
        f"{run} asks for a second cudf-polars engine ({differences(block, host.block)}) "
        f"while {host.served_run or 'its parent'} holds one ({host.backend}, session "
        f"{host.id}) on the same GPU(s) of this process. Two cudf-polars engines in one "
        "process do not share a GPU: each sets rmm's process-wide device memory resource, "
        "and each spill limit counts only its own memory. Give the subflow's "
        "CudfPolarsTaskRunner the parent's engine block to run on the parent's engine "
        "(with its own results and teardown), or give the subflow no task runner to use "
        "the parent's session."
    )


def refuse_nesting(outer: Any, *, runner_here: bool) -> None:
    """
    Raise for a ``with block.session():`` inside a flow run that already has a session.

    Parameters
    ----------
    outer
        The innermost provider: the flow run's ``CudfPolarsTaskRunner``
        (``runner_here``) or its open ``EngineSession``.
    runner_here : bool
        Whether ``outer`` is this flow run's task runner.

    Raises
    ------
    SessionError
        Always.
    """
    if runner_here:
        raise SessionError(
            "This flow run already has an engine session: its CudfPolarsTaskRunner "
            "provides one, and sessions do not nest within one flow run. Use that one "
            "(prefect_cudf_polars.blocks.get_engine_session()), or do not combine "
            "CudfPolarsTaskRunner with `with block.session():` in one flow. A subflow "
            "with its own CudfPolarsTaskRunner gets a session of its own: with the same "
            "engine block it shares this engine; another block works there only where "
            "at most one of the two needs a GPU (a `cpu` block beside a GPU one)."
        )
    raise SessionError(
        f"An engine session ({outer.backend}, id {outer.id}) is already open here "
        "(`with block.session():`), and sessions do not nest within one flow run. Use "
        "the open one (prefect_cudf_polars.blocks.get_engine_session()), or close it "
        "before opening another. A subflow with its own CudfPolarsTaskRunner gets a "
        "session of its own: with the same engine block it shares this engine; another "
        "block works there only where at most one of the two needs a GPU (a `cpu` "
        "block beside a GPU one)."
    )
