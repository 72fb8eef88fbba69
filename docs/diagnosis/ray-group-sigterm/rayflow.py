import os, json, time, threading, logging
from pathlib import Path
from prefect import flow



@flow
def ray_hold(evidence: str, init_on_thread: bool = True):
    ev = Path(evidence)
    logging.getLogger("prefect.flow_runs").addHandler(logging.FileHandler(ev / "flow.log"))
    import ray
    box = {}

    def owner():
        ray.init(address="local", num_cpus=2, include_dashboard=False)

        @ray.remote
        class A:
            def pid(self):
                return os.getpid()

        box["a"] = A.remote()
        box["apid"] = ray.get(box["a"].pid.remote())

    if init_on_thread:
        t = threading.Thread(target=owner); t.start(); t.join()
    else:
        owner()
    (ev / "ready.json").write_text(json.dumps({"pid": os.getpid(), "actor": box["apid"], "pgid": os.getpgid(0)}))
    try:
        while True:
            time.sleep(0.2)
    except BaseException as exc:
        (ev / "caught.txt").write_text(repr(exc))
        def stop():
            try:
                ray.get(box["a"].pid.remote(), timeout=5)
                (ev / "ray_call.txt").write_text("answered")
            except BaseException as e:
                (ev / "ray_call.txt").write_text(repr(e))
            (ev / "shutdown_start.txt").write_text(str(time.monotonic()))
            ray.shutdown()
            (ev / "shutdown.txt").write_text("done")
        t2 = threading.Thread(target=stop); t2.start()
        t0 = time.monotonic()
        with open(ev / "heartbeat.txt", "w") as hb:
            while t2.is_alive() and time.monotonic() - t0 < 25:
                hb.write(f"{time.monotonic() - t0:.1f} "); hb.flush()
                t2.join(1)
        (ev / "end.txt").write_text("teardown done")
        raise
