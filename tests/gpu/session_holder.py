"""
Start ``tests/blocks/scripts/gpu_session_holder.py`` and read its ``READY`` line.

The SIGKILL tests of the multi-GPU backends (Dask and Ray) run a session on an
external cluster in that process, then kill it. Test modules import
:func:`start_holder`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from processes import spawn, stop, wait_until
from spread_data import SMALL_PARTITIONS

#: The process the SIGKILL tests kill: a session on an external cluster, holding a result.
HOLDER = Path(__file__).parents[1] / "blocks" / "scripts" / "gpu_session_holder.py"


def start_holder(backend: str, address: str, data: str, out: Path) -> tuple[subprocess.Popen, dict]:
    """
    Start the holder on ``backend`` at ``address`` over ``data``; wait for it to hold its result.

    Returns the process (stop it when done) and its ``READY`` dict. Stdout and
    stderr go to ``out``.

    Raises
    ------
    AssertionError
        When the holder ends, or prints no ``READY`` line within 300 s; it is
        stopped first.
    """
    child = spawn([sys.executable, str(HOLDER), backend, address, data, str(SMALL_PARTITIONS)], out)
    try:
        wait_until(lambda: "READY " in out.read_text() or child.poll() is not None, 300, "READY")
        assert child.poll() is None, out.read_text()[-3000:]
        ready = json.loads(out.read_text().split("READY ", 1)[1].splitlines()[0])
    except BaseException:
        stop([child], timeout=0)
        raise
    print(json.dumps(ready))
    return child, ready
