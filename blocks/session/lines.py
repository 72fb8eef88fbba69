"""
The log lines of a session, written to its flow run's log: the start line, the end line, the teardown warning.

A task runner opens its session before the flow run's context exists and
closes it after that context is gone, so :class:`SessionLog` records the flow
run on the session's first use inside it and writes to that flow run's logger
from then on (Python's ``prefect_cudf_polars.session`` logger before that).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("prefect_cudf_polars.session")

TEARDOWN_WARNING = (
    "cudf-polars engine session teardown %s: the engine did not answer. A "
    "Prefect process worker cancels a flow run with SIGTERM to its whole "
    "process group, an owned Dask or Ray cluster included, so the engine's "
    "processes may be gone; the CUDA driver frees the device memory of "
    "processes that end. If a normal teardown needs longer, raise "
    "teardown_timeout on the engine block."
)

SERVED_WARNING = (
    "cudf-polars engine session %s ended with %d task run(s) it serves still "
    "running after %g s (teardown_timeout); they fail at their next engine call "
    "with an error naming this session. Wait on their futures inside the `with "
    "block.session():` block, or raise teardown_timeout on the engine block."
)

NOT_STARTED_LINE = (
    "cudf-polars engine not started: no GPU task ran in this flow run (the "
    "engine starts at the first GPU task)"
)


def start_line(backend: str | None, description: dict[str, Any], engine_start_s: float) -> tuple[Any, ...]:
    """
    The session's start line: backend, GPUs, ranks, versions, engine start (seconds).

    Returns
    -------
    tuple
        ``(format, *args)``, for ``logger.log(level, *line)``.
    """
    versions = ", ".join(f"{k} {v}" for k, v in description.get("versions", {}).items())
    gpus = description.get("gpus") or []
    return (
        "cudf-polars engine session started: backend=%s (%s); %s; %s; %s; engine start %.2f s",
        backend,
        description.get("note", ""),
        f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus else "no GPU in use",
        f"{description.get('ranks', 1)} rank(s)",
        versions,
        engine_start_s,
    )


def end_line(summary: dict[str, Any]) -> tuple[Any, ...]:
    """
    The session's end line: result counts, memory (bytes), engine start and shutdown (seconds).

    Parameters
    ----------
    summary : dict
        :meth:`EngineSession.summary`.

    Returns
    -------
    tuple
        ``(format, *args)``, for ``logger.log(level, *line)``.
    """
    counts, memory, timings = summary["counts"], summary["memory"], summary["timings"]
    return (
        "cudf-polars engine session ended: backend=%s, results produced %d, "
        "consumed %d, released unconsumed %d; %s at start %s, before shutdown %s, "
        "peak %s (bytes); engine start %.2f s, shutdown %.2f s on thread %s",
        summary["backend"],
        counts["produced"],
        counts["consumed"],
        counts["released_unconsumed"],
        "host store" if summary["backend"] == "cpu" else "device memory (rmm statistics)",
        memory.get("at_start"),
        memory.get("before_shutdown"),
        summary["peak_memory"],
        timings.get("engine_start_s", 0.0),
        timings.get("engine_shutdown_s", 0.0),
        summary["shutdown_thread"],
    )


class SessionLog:
    """
    Where a session's lines go: its flow run's log once known, else Python logging.

    Attributes
    ----------
    flow_run : prefect.client.schemas.objects.FlowRun or None
        The flow run the session serves (recorded on first use inside it).
    flow : prefect.Flow or None
        Its flow.
    """

    def __init__(self) -> None:
        self.flow_run: Any = None
        self.flow: Any = None

    def attach(self, flow_run: Any, flow: Any) -> None:
        """Write to ``flow_run``'s log from now on."""
        self.flow_run, self.flow = flow_run, flow

    def log(self, level: int, msg: str, *args: Any) -> None:
        """Log one line (``logging`` level, %-format and its arguments)."""
        if self.flow_run is not None:
            from prefect.logging.loggers import flow_run_logger

            flow_run_logger(flow_run=self.flow_run, flow=self.flow).log(level, msg, *args)
        else:
            logger.log(level, msg, *args)
