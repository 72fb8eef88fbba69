import os, subprocess, sys, time, tempfile
from pathlib import Path
from prefect.testing.utilities import prefect_test_harness

HERE = str(Path(__file__).resolve().parent)

init_on_thread = sys.argv[1] == "thread"
with prefect_test_harness(server_startup_timeout=120):
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling
    from prefect.settings import PREFECT_API_URL
    ev = Path(tempfile.mkdtemp())
    pool = "raycancel"
    with get_client(sync_client=True) as c:
        c.create_work_pool(WorkPoolCreate(name=pool, type="process"), overwrite=True)
        fid = c.create_flow_from_name("ray-hold")
        c.create_deployment(flow_id=fid, name=pool, work_pool_name=pool, entrypoint="rayflow.py:ray_hold", path=HERE,
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": HERE}}],
            parameters={"evidence": str(ev), "init_on_thread": init_on_thread})
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    w = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process", "--limit", "1"], env=env, stdout=open(ev / "worker.log", "w"), stderr=subprocess.STDOUT)
    try:
        fr = run_deployment(f"ray-hold/{pool}", timeout=0)
        t0 = time.monotonic()
        while not (ev / "ready.json").exists():
            assert time.monotonic() - t0 < 180 and w.poll() is None
            time.sleep(0.2)
        time.sleep(1)
        print("ready", (ev / "ready.json").read_text())
        with get_client(sync_client=True) as c:
            c.set_flow_run_state(fr.id, Cancelling())
            t1 = time.monotonic()
            while not (st := c.read_flow_run(fr.id).state).is_final():
                assert time.monotonic() - t1 < 120
                time.sleep(0.5)
        print("final", st.type, f"{time.monotonic() - t1:.1f} s")
        time.sleep(2)
        for f in sorted(ev.iterdir()):
            if f.suffix == ".txt":
                print(f.name, "=>", f.read_text()[:300])
        print("--- worker.log tail"); print((ev / "worker.log").read_text()[-2500:])
    finally:
        w.terminate(); w.wait(30)
