"""
Environment variables set in this process, and on every rank, for the length of one engine call.

Some engine inputs only travel through the process environment: cudf-polars
reads ``s3://`` through KvikIO, which takes credentials, region and endpoint
from ``AWS_*`` variables (see :mod:`prefect_cudf_polars.tasks.storage`). An
engine call given an ``environment`` (:meth:`~prefect_cudf_polars.blocks.EngineSession.execute`)
has them set around exactly that call, on the engine's owner thread, and the
previous values put back afterwards, whatever happens.

* The environment belongs to the whole process: :func:`environment` holds a
  module lock for the set-call-restore sequence, and engine calls are
  serialized on the session's owner thread anyway, so two calls never see each
  other's variables.
* Ranks in other processes (``dask``, ``ray``) get the variables through
  :meth:`~prefect_cudf_polars.blocks.backends.base.RunningEngine.set_rank_environment`,
  which runs :func:`apply_environment_on_rank` on each of them.
* Values are never logged.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

_LOCK = threading.RLock()
#: On a rank: what each environment set there replaced, last first (engine calls are serialized).
_RANK_PREVIOUS: list[dict[str, str | None]] = []


def apply_environment(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """
    Set (or, for ``None``, unset) variables of this process.

    Parameters
    ----------
    env : mapping of str to (str or None)
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


def apply_environment_on_rank(env: dict[str, str | None]) -> bool:
    """Rank-side :func:`apply_environment` (module-level, so workers import it by name; returns JSON)."""
    _RANK_PREVIOUS.append(apply_environment(env))
    return True


def restore_environment_on_rank() -> bool:
    """Rank-side: put back what the last :func:`apply_environment_on_rank` replaced (nothing if none is kept)."""
    if _RANK_PREVIOUS:
        apply_environment(_RANK_PREVIOUS.pop())
    return True


@contextmanager
def environment(env: Mapping[str, str | None]) -> Iterator[None]:
    """
    Set ``env`` in this process for the ``with`` block, then restore what was there.

    Parameters
    ----------
    env : mapping of str to (str or None)
        Variable names to values; ``None`` unsets for the block.
    """
    with _LOCK:
        previous = apply_environment(env)
        try:
            yield
        finally:
            apply_environment(previous)
