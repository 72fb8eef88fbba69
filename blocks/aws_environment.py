"""
``AWS_*`` environment variables set for the length of one engine call.

cudf-polars reads ``s3://`` through KvikIO, which takes credentials, region and
endpoint from the process environment (see
:mod:`prefect_cudf_polars.blocks.s3_credentials`). :func:`run_with_aws_environment`
sets them on the session's owner thread around exactly one engine call and
puts the previous values back afterwards, whatever happens.

Developer notes
---------------
* The environment belongs to the whole process. A module lock makes the
  set-call-restore sequence exclusive, and engine calls are serialized on the
  owner thread anyway, so two calls never see each other's credentials.
* polars' own (client-side) object store, which resolves the scan's schema
  before cudf-polars runs, reads the same variables; it caches stores by the
  scan's ``storage_options``, which is why the GPU scans still carry the
  endpoint and region (no secrets) as ``storage_options``
  (:func:`prefect_cudf_polars.tasks.s3_read.scan_parquet`).
* Backends whose ranks are other processes (``dask``, ``ray``) get the
  variables on every rank through the engine's ``_run`` (cudf-polars runs a
  function on each rank and gathers JSON), and have them removed the same way.
* Values are never logged.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.session import EngineSession

T = TypeVar("T")

_LOCK = threading.RLock()

#: Backends whose ranks run in this process (the owner thread's environment is theirs).
_IN_PROCESS_BACKENDS = frozenset({"cpu", "spmd"})


def apply_environment(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """
    Set (or, for ``None``, unset) variables of this process.

    Parameters
    ----------
    env
        Variable names to values; ``None`` unsets.

    Returns
    -------
    dict of str to (str or None)
        The previous values (``None`` for unset), to pass back to restore them.
    """
    previous = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return previous


def _apply_on_rank(env: dict[str, str | None]) -> bool:
    """Rank-side :func:`apply_environment` (returns JSON for the engine's gather)."""
    apply_environment(env)
    return True


@contextmanager
def aws_environment(env: Mapping[str, str | None]) -> Iterator[None]:
    """
    Set ``env`` in this process for the ``with`` block, then restore what was there.

    Parameters
    ----------
    env
        From :meth:`S3Access.environment`.
    """
    with _LOCK:
        previous = apply_environment(env)
        try:
            yield
        finally:
            apply_environment(previous)


def run_with_aws_environment(
    session: EngineSession,
    env: Mapping[str, str | None],
    fn: Callable[..., T],
    *args: Any,
    **kwargs: Any,
) -> T:
    """
    Run ``fn(*args, **kwargs)`` on the session's owner thread with ``env`` set on every rank.

    The call runs in a copy of the caller's context (so results name the
    calling task run), as one item of the owner thread's queue: no other
    engine call runs while the variables are set.

    Parameters
    ----------
    session
        An open engine session.
    env
        From :meth:`S3Access.environment`; ``None`` values are unset for the call.
    fn
        Usually ``session.execute`` or ``session.collect`` (which run in place
        on the owner thread).

    Returns
    -------
    Whatever ``fn`` returns.

    Raises
    ------
    SessionError
        If the session is not open.
    Exception
        Whatever ``fn`` raises (the variables are restored first).
    """
    context = contextvars.copy_context()
    backend = session.backend

    def call() -> T:
        with aws_environment(env):
            ranks_set = False
            running = session._check_open()
            # RunningEngine.engine is cudf-polars' engine; _run calls a function on each rank.
            if backend not in _IN_PROCESS_BACKENDS:
                running.engine._run(_apply_on_rank, dict(env))
                ranks_set = True
            try:
                return context.run(fn, *args, **kwargs)
            finally:
                if ranks_set:
                    # Unset on the ranks: the workers are this session's own processes.
                    running.engine._run(_apply_on_rank, {name: None for name in env})

    return session.run(call)
