"""
Admission by bytes: a session holds GiB of device memory in a Prefect global concurrency limit while its engine runs.

A :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` with ``admission_limit``
names a Prefect global concurrency limit whose slots are GiB of device memory
(``prefect gcl create gpu-memory --limit 140`` for one 140 GiB GPU). Before its
engine starts, a session occupies ``ceil(device_memory_limit / GiB)`` slots of
it for each GPU its engine uses, through Prefect's own
:func:`prefect.concurrency.sync.concurrency`, so flow runs whose limits add up
to more than the GPU wait for each other instead of running out of memory.
:func:`admitted` is the one place this happens: the engine host enters it first
into its exit stack on the owner thread, so the slots are given back last, once
the engine has shut down, however the start or the session ends.

Bounds (Prefect 3.9.1)
----------------------
* The slots are held under a lease of :data:`LEASE_DURATION_S` seconds that
  Prefect renews on a thread of its own every 75 % of it while they are held. A
  renewal that fails is logged by Prefect and does not stop the engine
  (``raise_on_lease_renewal_failure=False``): the engine keeps running, and the
  limit may then be exceeded until it ends.
* A process killed without unwinding (SIGKILL) gives nothing back; its lease
  expires :data:`LEASE_DURATION_S` seconds after its last renewal, and a
  ``prefect server`` frees the slots at its next repossessor pass (every 15 s).
  The temporary local API Prefect starts when none is configured runs no
  repossessor.
* A waiting session asks for its slots in requests of at most
  :data:`REQUEST_SLICE_S` seconds, each asking again after the ``Retry-After``
  the API answers (at most
  ``PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS``, 30 s by
  default), so admission follows a release by up to the shorter of the two.
  Between requests it asks whether the slots are still wanted, so a session whose
  caller stopped waiting stops asking within one request. In one process,
  Prefect serves one limit's requests one at a time, so a second session of the
  same process waits behind the first one's current request.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from uuid import UUID

import httpx
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import (
    ADMISSION_NEEDS_LIMIT, CHECK_PREFECT_API, NOTHING_STARTED, SET_ADMISSION_LIMIT, AdmissionError)


#: Bytes per admission slot: one slot is one GiB of device memory.
GIB = 2**30

#: Seconds of the lease on the occupied slots (Prefect's API accepts 60 s to one day). Prefect
#: renews it every 45 s while the slots are held; a killed process's slots are free 60 s after
#: its last renewal, at the server's next repossessor pass.
LEASE_DURATION_S = 60.0

#: Seconds of one request for the slots: a session waiting longer asks again, after checking that
#: the slots are still wanted, until its ``admission_timeout`` has passed.
REQUEST_SLICE_S = 10.0

#: ``log(level, msg, *args)``: one line in the flow run's log.
Log = Callable[..., None]


@dataclass
class Admission:
    """
    What a session occupies of its admission limit.

    Attributes
    ----------
    limit_name : str or None
        The global concurrency limit (``None``: no admission).
    slots : int
        Slots held (GiB of device memory); 0 without admission.
    seconds : float
        Seconds waited until the slots were held; 0.0 without admission.
    """

    limit_name: str | None = None
    slots: int = 0
    seconds: float = 0.0


def slots_for(limit_bytes: int) -> int:
    """The slots a device memory limit of ``limit_bytes`` bytes occupies: whole GiB, rounded up (at least 1)."""
    return max(1, math.ceil(limit_bytes / GIB))


@contextmanager
def admitted(block: CudfPolarsEngine, limit_bytes: int | None, log: Log, *, gpus: int = 1,
             flow_run_id: UUID | None = None, wanted: Callable[[], bool] | None = None) -> Iterator[Admission]:
    """
    Hold ``ceil(limit_bytes / GiB)`` slots of ``block.admission_limit`` for each of ``gpus`` while the ``with`` block runs.

    Enter and leave it on one thread (the engine's owner thread). Without
    ``block.admission_limit`` it does nothing and yields an empty
    :class:`Admission`. Otherwise it writes one line before it waits (the limit,
    the slots in GiB, the longest wait in seconds) and one once the slots are
    held (the seconds waited), then holds them under a lease of
    :data:`LEASE_DURATION_S` seconds that Prefect renews while they are held,
    and gives them back on leaving, however the block ends. A limit that
    Prefect has disabled is not enforced: a warning, and nothing is held.

    Parameters
    ----------
    block : CudfPolarsEngine
        Its ``admission_limit`` (a global concurrency limit's name) and
        ``admission_timeout`` (seconds to wait at most).
    limit_bytes : int or None
        The session's device memory limit in bytes on each GPU (``block.memory_limit_bytes``).
    gpus : int
        The GPUs the engine uses (a rank and its limit on each).
    log : callable
        ``log(level, msg, *args)``, writing one line to the flow run's log.
    flow_run_id : uuid.UUID, optional
        The flow run shown as the slots' holder in Prefect.
    wanted : callable, optional
        Asked between requests for the slots (every :data:`REQUEST_SLICE_S`
        seconds of waiting): ``False`` ends the wait with nothing held. Default:
        the slots are wanted until ``admission_timeout``.

    Yields
    ------
    Admission
        The limit, the slots held and the seconds waited for them.

    Raises
    ------
    AdmissionError
        The limit does not exist, has fewer slots than asked for, lets its slots
        decay, the Prefect API could not be reached, the slots were not free
        within ``block.admission_timeout`` seconds, or ``wanted`` answered
        ``False`` while the session waited. Nothing is held then.
    ValueError
        ``block.admission_limit`` is set and ``limit_bytes`` is ``None``.
    """
    name = block.admission_limit
    if name is None:
        yield Admission()
        return
    if limit_bytes is None:
        raise ValueError(ADMISSION_NEEDS_LIMIT.format(name=name))
    slots = slots_for(limit_bytes) * gpus
    if not _limit_is_active(name, slots):
        log(logging.WARNING, "Admission limit %r is disabled in Prefect, so it is not enforced: the engine starts "
            "without occupying %d slot(s); enable it with `prefect gcl enable %s`.", name, slots, name)
        yield Admission(name, 0, 0.0)
        return
    log(logging.INFO, "Waiting for admission: %d slot(s) (GiB of device memory) of global concurrency limit %r, "
        "for at most %g s (admission_timeout).", slots, name, block.admission_timeout)
    with ExitStack() as held:  # the slots, from the moment Prefect gives them: given back however the block ends
        seconds = _occupy(held, name, slots, block.admission_timeout, flow_run_id, wanted or (lambda: True))
        log(logging.INFO, "Admitted after %.2f s: holding %d slot(s) of global concurrency limit %r until the engine "
            "has shut down.", seconds, slots, name)
        yield Admission(name, slots, seconds)


def _limit_is_active(name: str, slots: int) -> bool:
    """
    Read the limit once: whether it is enforced, refusing one that is missing, too small or decaying.

    Raises
    ------
    AdmissionError
        No limit of that name, fewer slots in it than ``slots``, slots that
        decay (a rate limit), or the Prefect API could not be asked.
    """
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(name)
    except ObjectNotFound:
        raise _refused(name, slots, 0.0, f"The global concurrency limit {name!r} (admission_limit) does not exist at "
                       f"this Prefect API, so the engine cannot occupy its {slots} slot(s): {NOTHING_STARTED}. Create "
                       f"it, for an 80 GiB GPU with {SET_ADMISSION_LIMIT.format(name=name, slots=80)} or `prefect gcl "
                       f"create {name} --limit 80`, or clear admission_limit on the CudfPolarsEngine block.") from None
    except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
        raise _unreachable(name, slots, exc, 0.0) from exc
    if limit.active and limit.limit < slots:
        raise _refused(name, slots, 0.0, f"The global concurrency limit {name!r} (admission_limit) has {limit.limit} "
                       f"slot(s), fewer than the {slots} this session needs (device_memory_limit in GiB, rounded up), "
                       "so it would never be admitted. Raise the limit with "
                       f"{SET_ADMISSION_LIMIT.format(name=name, slots='N')}, or lower device_memory_limit on the "
                       "CudfPolarsEngine block.")
    if limit.active and (limit.slot_decay_per_second or 0) > 0:
        raise _refused(name, slots, 0.0, f"The global concurrency limit {name!r} (admission_limit) lets its slots decay "
                       f"(slot_decay_per_second={limit.slot_decay_per_second:g}): it is a rate limit, whose slots come "
                       "free while the engines that occupy them still run, so it cannot stand for device memory: "
                       f"{NOTHING_STARTED}. Set its decay to 0 with {SET_ADMISSION_LIMIT.format(name=name, slots='N')} "
                       f"(or `prefect gcl update {name} --slot-decay-per-second 0`), then run the flow again.")
    return bool(limit.active)


def _refused(name: str, slots: int, waited: float, message: str) -> AdmissionError:
    """The :class:`AdmissionError` saying ``message`` about ``slots`` slots of the limit ``name``, after ``waited`` s."""
    return AdmissionError(message, limit_name=name, slots=slots, waited_seconds=waited)


def _unreachable(name: str, slots: int, exc: BaseException, waited: float) -> AdmissionError:
    """The :class:`AdmissionError` for a Prefect API that could not be asked about the limit ``name``."""
    return _refused(name, slots, waited, f"Could not ask the Prefect API for {slots} slot(s) of the global concurrency "
                    f"limit {name!r} (admission_limit) ({type(exc).__name__}: {exc}), so {NOTHING_STARTED}: "
                    f"{CHECK_PREFECT_API}.")


def _occupy(held: ExitStack, name: str, slots: int, timeout: float, flow_run_id: UUID | None,
            wanted: Callable[[], bool]) -> float:
    """
    Enter Prefect's ``concurrency`` for ``slots`` slots of ``name`` into ``held``; returns the seconds waited.

    Each request lasts at most :data:`REQUEST_SLICE_S` seconds (a fresh
    ``concurrency`` each time, so Prefect's per-limit acquisition service is
    free between them); between requests ``wanted()`` is asked.

    Raises
    ------
    AdmissionError
        Prefect could not occupy the slots, not within ``timeout`` seconds, or
        ``wanted()`` answered ``False`` first.
    """
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
    from prefect.concurrency.sync import concurrency

    holder = ConcurrencyLeaseHolder(type="flow_run", id=flow_run_id) if flow_run_id is not None else None
    started = time.monotonic()
    while True:
        try:
            held.enter_context(concurrency(
                name, occupy=slots, timeout_seconds=min(REQUEST_SLICE_S, started + timeout - time.monotonic()),
                lease_duration=LEASE_DURATION_S, strict=True, holder=holder, raise_on_lease_renewal_failure=False))
            return time.monotonic() - started
        except TimeoutError:
            waited = time.monotonic() - started
            if waited >= timeout:
                raise _refused(name, slots, waited, f"Waited {waited:.1f} s (admission_timeout={timeout:g}) for {slots} "
                               f"slot(s) (GiB of device memory) of the global concurrency limit {name!r}, held by other "
                               f"flow runs, so {NOTHING_STARTED}. Raise admission_timeout on the CudfPolarsEngine block "
                               "to wait longer, lower its device_memory_limit, or see who holds the slots with "
                               f"`prefect gcl inspect {name}`.") from None
            if not wanted():
                raise _refused(name, slots, waited, f"The session ended while it waited {waited:.1f} s for {slots} "
                               f"slot(s) of the global concurrency limit {name!r}: its caller stopped waiting (a task "
                               f"timeout, a cancellation, an interrupt), so {NOTHING_STARTED}; run the flow again for a "
                               "new session.") from None
        except ConcurrencySlotAcquisitionError as exc:
            raise _refused(name, slots, time.monotonic() - started, f"Could not occupy {slots} slot(s) of the global "
                           f"concurrency limit {name!r} (admission_limit) ({exc}), so {NOTHING_STARTED}: see that the "
                           f"limit exists (`prefect gcl inspect {name}`), and {CHECK_PREFECT_API}.") from exc
        except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
            raise _unreachable(name, slots, exc, time.monotonic() - started) from exc
