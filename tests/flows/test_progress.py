"""StepProgress: the progress artifact through the API, and the terminal lines."""

from __future__ import annotations

import io

import pytest
from prefect import flow
from rich.console import Console

from api_reads import artifacts_of
from prefect_cudf_polars.flows.progress import StepProgress


def test_progress_artifact_moves_step_by_step_and_lines_are_printed():
    seen = []
    buffer = io.StringIO()

    @flow
    def job():
        progress = StepProgress(["read", "join", "write"], key="progress-test",
                                console=Console(file=buffer, width=120))
        for step in ("read", "join"):
            progress.done(step)
            [artifact] = artifacts_of(key="progress-test", flow_run_id=progress_flow_run())
            seen.append(float(artifact.data))
        with pytest.raises(ValueError, match="Unknown step 'load'"):
            progress.done("load")
        progress.done("write", "3 files")
        return progress.percent

    def progress_flow_run():
        from prefect.context import FlowRunContext

        return FlowRunContext.get().flow_run.id

    assert job() == 100.0
    assert seen == pytest.approx([100 / 3, 200 / 3])
    lines = buffer.getvalue().splitlines()
    assert "1/3 read" in lines[0] and "2/3 join" in lines[1] and "3/3 write 3 files" in lines[2]


def test_outside_a_flow_run_progress_only_prints():
    buffer = io.StringIO()
    progress = StepProgress(["one"], key="progress-outside", console=Console(file=buffer))
    assert progress.artifact_id is None
    progress.done("one")
    assert "1/1 one" in buffer.getvalue()
