"""
Sessions of subflows: which share their parent's engine, which start their own, which are refused.

A session that opens while a session of an enclosing flow run is open (a
subflow with its own ``CudfPolarsTaskRunner``, or a ``with block.session():``
in a subflow) runs on the enclosing session's engine host when the two blocks
hold the same fields: one engine serves both, each session with its own
results, counts and end (the subflow's releases only its own results and never
stops the engine). cudf-polars' ``SPMDEngine`` replaces rmm's process-wide
current device resource when it starts (``set_memory_resource`` in its exit
stack, cudf-polars 26.10) and each engine's spill limit counts only its own
memory, so two GPU engines in one process are refused; a ``cpu`` session
beside a GPU one starts its own engine (polars on the CPU touches no GPU).
Within one flow run, sessions do not nest.
"""

from __future__ import annotations

from typing import Any, Protocol

from prefect_cudf_polars.blocks.backends.choice import resolve_backend
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import SHARE_PARENT_SESSION, SessionError

_SUBFLOWS = (" A subflow with its own CudfPolarsTaskRunner gets a session of its own: with the same engine block it "
             "shares this engine; another block works there only where at most one of the two needs a GPU (a `cpu` "
             "block beside a GPU one).")
RUNNER_HERE = ("This flow run already has an engine session: its CudfPolarsTaskRunner provides one, and sessions "
               "do not nest within one flow run. Use that one (prefect_cudf_polars.blocks.get_engine_session()), "
               "or do not combine CudfPolarsTaskRunner with `with block.session():` in one flow." + _SUBFLOWS)
SESSION_HERE = ("An engine session ({backend}, id {id}) is already open here (`with block.session():`), and sessions "
                "do not nest within one flow run. Use the open one (prefect_cudf_polars.blocks.get_engine_session()), "
                "or close it before opening another." + _SUBFLOWS)


class NestedSession(Protocol):
    """What the decision needs of a session (:class:`~prefect_cudf_polars.blocks.EngineSession`)."""

    id: str
    block: CudfPolarsEngine
    backend: str | None
    closed: bool
    served_run: str | None
    flow_run_id: Any


def shared_host(session: NestedSession, outer: Any, parent: NestedSession | None, *, flow_run: Any) -> Any:
    """
    The enclosing session whose engine host ``session`` runs on, or ``None`` to start its own.

    Parameters
    ----------
    session : EngineSession
        The session opening.
    outer : session provider or None
        For ``with block.session():``, the innermost provider here; its open
        session is the enclosing one (``None`` for a task runner's session).
    parent : EngineSession or None
        For a subflow's task runner, the enclosing flow run's session.
    flow_run : FlowRunContext or None
        Prefect's flow run context here.

    Raises
    ------
    SessionError
        This flow run already has a session (``outer`` is its task runner, or
        an open session of the same flow run), or the enclosing session's
        block differs from ``session``'s and both need a GPU engine.
    NoGPUError
        ``session``'s block asks for a GPU backend and none is usable here.

    Notes
    -----
    ``session`` runs on the enclosing session's engine when the two blocks
    hold the same fields, and starts its own where one of the two runs on
    ``cpu``.
    """
    if outer is not None:
        if flow_run is not None and flow_run.task_runner is outer:
            raise SessionError(RUNNER_HERE)
        parent = outer.provided_session
        if parent is outer and parent.flow_run_id == session.flow_run_id:
            raise SessionError(SESSION_HERE.format(backend=parent.backend, id=parent.id))
    if parent is None or parent.closed:
        return None
    mine, theirs = session.block.model_dump(), parent.block.model_dump()
    if type(session.block) is type(parent.block) and mine == theirs:
        return parent
    if parent.backend == "cpu" or resolve_backend(session.block)[0] == "cpu":
        return None
    changed = ", ".join(f"{k}={v!r}" for k, v in mine.items() if theirs.get(k) != v)
    raise SessionError(
        f"{session.served_run or 'this session'} asks for a second cudf-polars engine ({changed}) while "
        f"{parent.served_run or 'its parent'} ({parent.backend}, session {parent.id}) holds one on the same "
        "GPU(s) of this process. Two cudf-polars engines in one process do not share a GPU: each sets rmm's "
        "process-wide device memory resource, and each spill limit counts only its own memory. Give the "
        "subflow's CudfPolarsTaskRunner the parent's engine block to run on the parent's engine (with its "
        f"own results and teardown), or {SHARE_PARENT_SESSION}.")
