"""
Step-by-step progress of a flow: a Prefect progress artifact and terminal lines.

A long flow run should not go quiet. :class:`StepProgress` is told when each
named step is done; it updates one progress artifact on the flow run (the
percentage the UI shows) and prints a step line with a progress bar on the
terminal (rich), so ``make run`` shows where the job is.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext
from rich.console import Console
from rich.progress_bar import ProgressBar
from rich.table import Table

logger = logging.getLogger("prefect_cudf_polars.progress")


class StepProgress:
    """
    Progress through a fixed list of steps.

    Parameters
    ----------
    steps
        The step names, in order.
    key
        Artifact key of the progress artifact (lowercase letters, digits, dashes).
    console
        Where step lines go; default: the terminal (140 columns when not a tty).

    Attributes
    ----------
    done_steps : list of str
        Steps reported done, in order.
    artifact_id : uuid.UUID or None
        The progress artifact (``None`` outside a flow run or when the API refused it).
    """

    def __init__(self, steps: Sequence[str], *, key: str, console: Console | None = None) -> None:
        self.steps = list(steps)
        self.key = key
        self.done_steps: list[str] = []
        self.console = console or (Console() if sys.stdout.isatty() else Console(width=140))
        self._started = time.perf_counter()
        self.artifact_id: Any = None if FlowRunContext.get() is None else self._publish(
            "create", create_progress_artifact, progress=0.0, key=key,
            description=f"Steps done of {len(self.steps)}: " + ", ".join(self.steps))

    @property
    def percent(self) -> float:
        """Share of steps done, in percent (0-100)."""
        return 100.0 * len(self.done_steps) / max(len(self.steps), 1)

    def _publish(self, doing: str, call: Callable[..., Any], **fields: Any) -> Any:
        """``call(**fields)`` (a Prefect artifact call); ``None`` and a WARNING if it fails."""
        try:
            return call(**fields)
        except Exception as exc:  # the UI's view must not fail the run
            logger.warning("Could not %s the progress artifact %r: %s", doing, self.key, exc)
            return None

    def done(self, step: str, detail: str = "") -> None:
        """
        Mark ``step`` done: update the artifact and print a step line.

        Raises
        ------
        ValueError
            If ``step`` is not one of the steps given at construction.
        """
        if step not in self.steps:
            raise ValueError(f"Unknown step {step!r}; the steps are {self.steps}.")
        self.done_steps.append(step)
        if self.artifact_id is not None:
            self._publish("update", update_progress_artifact, artifact_id=self.artifact_id, progress=self.percent,
                          description=f"{len(self.done_steps)}/{len(self.steps)} steps done; last: {step}")
        line = Table.grid(padding=(0, 1))
        line.add_row(ProgressBar(total=len(self.steps), completed=len(self.done_steps), width=24),
                     f"{len(self.done_steps)}/{len(self.steps)}", f"[bold]{step}[/bold]",
                     f"{detail}  (+{time.perf_counter() - self._started:.1f} s)".strip())
        self.console.print(line)
