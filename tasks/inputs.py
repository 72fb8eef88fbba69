"""Task arguments that carry queries: the query to run, and what claimed inputs leave behind."""

from __future__ import annotations

from typing import Any

import polars as pl

from prefect_cudf_polars.blocks import GPUResult
from prefect_cudf_polars.blocks.results.walker import gpu_results_in


def refuse_released(value: Any) -> None:
    """
    Raise for the first released :class:`GPUResult` in ``value``; claim nothing.

    Called before a task looks for its engine session, so that a result read
    after its flow run ended (or after :meth:`GPUResult.release`) is reported
    as released, not as a missing session.

    Parameters
    ----------
    value : Any
        A task's argument, or a container of them.

    Raises
    ------
    ResultReleasedError
        If a result in ``value`` was released; the message says why and what to do.
    """
    for result in gpu_results_in(value):
        if result.state == "released":
            result.check_readable()


def as_query(query: Any, *, task: str) -> pl.LazyFrame:
    """
    The LazyFrame to run for a task's ``query`` argument.

    Parameters
    ----------
    query : polars.LazyFrame or GPUResult
        A ``GPUResult`` is claimed here.
    task : str
        The task's name, for the error message.

    Returns
    -------
    polars.LazyFrame

    Raises
    ------
    TypeError
        If ``query`` is neither (for example an eager ``polars.DataFrame``).
    ResultReleasedError, ResultConsumedError, WrongEngineError
        From :meth:`GPUResult.lazy`.
    """
    if isinstance(query, GPUResult):
        return query.lazy()
    if isinstance(query, pl.LazyFrame):
        return query
    hint = " (call .lazy() on it)" if isinstance(query, pl.DataFrame) else ""
    raise TypeError(
        f"{task} takes a polars LazyFrame or a GPUResult, not {type(query).__name__}"
        f"{hint}."
    )


def unclaimed(results: list[GPUResult]) -> list[GPUResult]:
    """
    The inputs still live: the ones a call may claim, and so the only ones it may free.

    Taken before the call claims anything. An input another run already claimed
    (a deferred step holds it for its reader) is not this call's, even when the
    call fails on it.

    Parameters
    ----------
    results : list of GPUResult
        A task's inputs.

    Returns
    -------
    list of GPUResult
        Those whose state is ``"live"``.
    """
    return [result for result in results if result.state == "live"]


def drop_claimed(
    results: list[GPUResult], *, release_live: bool = False, held_by: GPUResult | None = None
) -> None:
    """
    Free whatever claimed inputs left in the engine's store.

    A claimed input is normally moved out when the query runs (and the
    session's engine call frees what it left, in the same hand-off to the
    owner thread); when the user's function failed after the claim, or the
    call never reached the engine, its partitions would stay in GPU memory
    until the session ends. Live (unclaimed) inputs are left alone, unless
    ``release_live`` (inputs a retry recomputed for itself, which no other task
    can hold). Inputs a deferred result holds for its reader are left to it.

    Parameters
    ----------
    results : list of GPUResult
        The inputs this call could claim (:func:`unclaimed`, taken before it did).
    release_live : bool
        Release live ones too.
    held_by : GPUResult, optional
        The deferred result the task returned: the inputs it holds stay.
    """
    held = held_by.held_inputs if held_by is not None else ()
    for result in results:
        if result in held:
            continue
        if result.state == "consumed" or (release_live and result.state == "live"):
            result.release()
