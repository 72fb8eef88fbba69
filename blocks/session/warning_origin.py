"""
Where a warning of the engine side points: the first frame of the user's code.

Python's ``warnings.warn`` names the frame ``stacklevel`` levels up. Between a
user's flow and the session that warns stand frames of this package, of Prefect
(its flow engine enters the task runner) and of ``contextlib`` (Prefect enters
the task runner through an ``ExitStack``); how many depends on how the session
was opened, so the level is counted when the warning is made.
"""

from __future__ import annotations

import inspect

#: Modules whose frames stand between a user's code and the engine side.
INTERNAL_MODULES = ("prefect_cudf_polars.blocks", "prefect_cudf_polars.tasks", "prefect", "contextlib")


def _internal(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in INTERNAL_MODULES)


def user_stacklevel() -> int:
    """
    The ``stacklevel`` that makes ``warnings.warn`` name the user's code.

    Call it in the function that warns, as ``warnings.warn(..., stacklevel=user_stacklevel())``.

    Returns
    -------
    int
        1 for the warning function itself, plus one for each frame above it in
        :data:`INTERNAL_MODULES`.
    """
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None  # the function that warns
    level = 1
    while frame is not None and _internal(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
        level += 1
    return level
