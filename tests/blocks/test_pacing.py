"""How the monitor's writer paces itself on the Prefect API's answers (``Pacer``), on a clock the test moves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from prefect_cudf_polars.blocks.monitoring import pacing
from prefect_cudf_polars.blocks.monitoring.pacing import Pacer


@pytest.fixture()
def clock(monkeypatch):
    """The pacing module's clock, moved by hand: ``clock.now`` seconds."""
    state = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(pacing, "time", SimpleNamespace(monotonic=lambda: state.now))
    return state


def test_two_slow_writes_make_the_api_busy_and_one_quick_write_makes_it_quick(clock):
    pacer = Pacer()
    pacer.took(0.7)
    assert not pacer.busy and pacer.concurrency == pacing.CONCURRENCY
    pacer.took(0.8)
    assert pacer.busy and pacer.concurrency == 1
    assert pacer.wait_s(artifact=True) == pytest.approx(pacing.BUSY_WAIT_FACTOR * 0.8)
    assert pacer.wait_s(artifact=False) == pytest.approx(0.8)
    pacer.took(0.05)
    assert not pacer.busy and pacer.wait_s(artifact=True) == 0.0


def test_fast_failed_writes_count_as_slow(clock):
    """An API that refuses at once (a 503 in 20 ms) gets one write at a time, not four."""
    pacer = Pacer()
    pacer.took(0.02, failed=True)
    pacer.took(0.02, failed=True)
    assert pacer.busy and pacer.concurrency == 1
    assert pacer.wait_s(artifact=True) == pytest.approx(pacing.BUSY_WAIT_FACTOR * pacing.BUSY_S)


def test_the_writers_longest_wait_does_not_end_a_busy_spell(clock):
    """Writes of 2 s make the writer wait MAX_WAIT_S; the API is still busy when that wait ends."""
    pacer = Pacer()
    pacer.took(2.0)
    pacer.took(2.0)
    wait = pacer.wait_s(artifact=True)
    assert wait == pacing.MAX_WAIT_S
    clock.now += wait
    assert pacer.busy and pacer.concurrency == 1
    clock.now += pacing.QUICK_AGAIN_S - wait
    assert not pacer.busy, "an API with no write for QUICK_AGAIN_S seconds still counted as busy"
