"""
Flow runs share one GPU by bytes: four flow runs of one deployment, each limited to about 28 % of the GPU.

A process worker (``--limit 4``) runs four flow runs of one deployment at once; each opens
a ``spmd`` session with ``device_memory_limit`` of 28.5 % of the card in whole GiB (40 GiB on a
141 GB H200, 22 GiB on an 80 GB H100) and ``admission_limit`` naming a global concurrency limit of
three such limits and a quarter, so three run together and the fourth waits until one of them
has closed its session. Each holds 2 GB results, about 70 % of its limit. All four complete with
the right sums; the limit's active slots (sampled every 0.2 s) reach three limits and never more,
and the runs' own times show three holding slots at once and the fourth, started with the
others, admitted after one of them had closed its session. The CUDA driver's used device memory
(``nvidia-smi``, sampled every 0.2 s) stays under its figure before the runs plus three limits
plus three times the device memory a process holds outside rmm (its CUDA context, measured in
each flow run before its engine starts); each flow process holds within 256 MiB of that context
figure once its session has closed, and the limit's slots are back to 0.
"""

from __future__ import annotations

import json
import os
import threading
import uuid

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.settings import PREFECT_API_URL, temporary_settings

from nvidia_smi import device_memory_used_mib, gpus
from process_worker import process_worker_deployment, worker_env
from processes import wait_until

pytestmark = pytest.mark.gpu

SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")
RUNS = 4
AFTER_SLACK_MIB = 256


def sized_from_the_card() -> tuple[int, int, int]:
    """
    The runs' ``device_memory_limit`` in GiB, the limit's slots and each run's 2 GB tables, from GPU 0's memory.

    Each run may use 28.5 % of the card (40 GiB of a 141 GB H200, 22 GiB of an 80 GB H100) and holds
    tables of about 70 % of that; the limit has room for three runs and a quarter of a fourth.
    """
    limit_gib = int(gpus()[0][1] / 1024 * 0.285)
    return limit_gib, 3 * limit_gib + limit_gib // 4, 2 * int(limit_gib * 2**30 * 0.7 / 4e9)


class Sampler(threading.Thread):
    """Reads ``nvidia-smi``'s memory.used (MiB) and the limit's active slots every 0.2 s until stopped."""

    def __init__(self, limit: str) -> None:
        super().__init__(name="gpu-admission-sampler", daemon=True)
        self.limit, self.api, self.done = limit, PREFECT_API_URL.value(), threading.Event()
        self.peak_mib, self.max_slots, self.error = 0, 0, None

    def run(self) -> None:
        try:
            with temporary_settings(updates={PREFECT_API_URL: self.api}), get_client(sync_client=True) as client:
                while not self.done.is_set():
                    self.peak_mib = max(self.peak_mib, device_memory_used_mib()[0])
                    self.max_slots = max(self.max_slots,
                                         client.read_global_concurrency_limit_by_name(self.limit).active_slots)
                    self.done.wait(0.2)
        except BaseException as exc:  # re-raised by stop()
            self.error = exc

    def stop(self) -> None:
        """Stop sampling; raise what the sampling raised."""
        self.done.set()
        self.join()
        if self.error is not None:
            raise self.error


@pytest.mark.timeout(590)
def test_four_flow_runs_of_a_quarter_of_the_gpu_share_it_three_at_a_time_under_the_admission_limit(
        tmp_path, record_property):
    from prefect.deployments import run_deployment

    limit_gib, slots, tables = sized_from_the_card()
    limit = f"gpu-memory-{uuid.uuid4().hex[:12]}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=limit, limit=slots))
    before_mib = device_memory_used_mib()[0]
    env = worker_env()
    pool = f"gpu-admission-{uuid.uuid4().hex[:8]}"
    sampler = Sampler(limit)
    with process_worker_deployment(
        pool, flow_name="hold-gpu-memory", entrypoint="held_gpu_memory.py:hold_gpu_memory", folder=SCRIPTS,
        parameters={"evidence": str(tmp_path), "limit": limit, "limit_gib": limit_gib, "tables": tables}, env=env, log=tmp_path / "worker.log",
        worker_limit=RUNS,
    ) as worker:
        sampler.start()
        runs = [run_deployment(f"hold-gpu-memory/{pool}", timeout=0) for _ in range(RUNS)]
        with get_client(sync_client=True) as client:

            def ended() -> bool:
                """All four ended, or one failed, or the worker exited."""
                done = [s for r in runs if (s := client.read_flow_run(r.id).state).is_final()]
                return len(done) == RUNS or any(not s.is_completed() for s in done) or worker.poll() is not None

            try:
                wait_until(ended, 420, "four flow runs to end")
            finally:
                sampler.stop()
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-6000:]
            states = [client.read_flow_run(r.id).state for r in runs]
            slots_after = client.read_global_concurrency_limit_by_name(limit).active_slots
    assert all(s.is_completed() for s in states), [(s.type, s.message) for s in states]
    facts = sorted((json.loads(p.read_text()) for p in tmp_path.glob("*.json")), key=lambda f: f["admitted"])
    for f in facts:
        assert f["sums"] == [[(2 * i + 1) * 125_000_000.0, 250_000_000] for i in range(0, tables, 2)]
    waits = [f["timings"]["admission_wait_s"] for f in facts]
    last = facts[-1]
    first_end = min(f["ended"] for f in facts[:-1])
    at_once = max(sum(f["admitted"] <= t < f["ended"] for f in facts) for t in (f["admitted"] for f in facts))
    context_mib = max(f["own_mib_with_context"] or 0 for f in facts)
    bound_mib = before_mib + 3 * (limit_gib * 1024 + context_mib)
    for key, value in {
        "admission_wait_s": waits, "driver_peak_mib": sampler.peak_mib, "driver_before_mib": before_mib,
        "bound_mib": bound_mib, "max_active_slots": sampler.max_slots, "context_mib": [f["own_mib_with_context"] for f in facts],
        "own_mib_holding": [f["own_mib_holding"] for f in facts], "own_mib_after": [f["own_mib_after"] for f in facts],
        "peak_held": [f["held"]["peak_held"] for f in facts], "rmm_peak": [f["rmm_peak_bytes"] for f in facts],
        "spills": [f["held"]["spills"] for f in facts], "seconds": [round(f["ended"] - f["started"], 1) for f in facts],
    }.items():
        record_property(key, json.dumps(value))
    assert at_once == 3 and sampler.max_slots == 3 * limit_gib, (at_once, sampler.max_slots)
    # The fourth began before any other ended, and was admitted only after one had given its slots back.
    assert last["started"] < first_end <= last["admitted"], (last, first_end)
    assert sampler.peak_mib <= bound_mib, f"driver peak {sampler.peak_mib} MiB, bound {bound_mib} MiB"
    for f in facts:  # None where nvidia-smi lists processes by PIDs of another namespace
        if f["own_mib_with_context"] is not None:
            assert f["own_mib_after"] - f["own_mib_with_context"] <= AFTER_SLACK_MIB, f
    assert slots_after == 0
