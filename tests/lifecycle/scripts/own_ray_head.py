"""
Start the local Ray head a ``ray`` session owns, connect to it, report its processes, wait (run as a file).

Prints one ``READY {json}`` line: this process's pid and process group, and the pid,
process group and session of each process the head started. With ``stop`` as argument it
then stops the head itself (as the session's end does) and prints ``STOPPED``.

Usage: ``python own_ray_head.py [stop]``
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil

from prefect_cudf_polars.blocks.backends.compat import disable_ray_failure_signal_handler
from prefect_cudf_polars.blocks.backends.ray.head import LocalHead

if __name__ == "__main__":
    disable_ray_failure_signal_handler()
    head = LocalHead()
    import ray

    ray.init(address=head.address)
    assert ray.get(ray.remote(lambda: 21 * 2).remote()) == 42
    started = [p.pid for p in psutil.Process().children(recursive=True)]
    print(
        "READY "
        + json.dumps(
            {
                "pid": os.getpid(),
                "pgid": os.getpgid(0),
                "started": started,
                "groups": sorted({os.getpgid(p) for p in started}),
            }
        ),
        flush=True,
    )
    if sys.argv[1:] == ["stop"]:
        ray.shutdown()
        head.stop()
        print("STOPPED", flush=True)
    else:
        time.sleep(600)
