"""``python -m benchmarks``: the benchmark command (see :mod:`benchmarks.cli`)."""

import os
import sys

# Before Prefect is imported: its local API's first start migrates a new SQLite
# database, which can take ~40 s on a 2-core machine (longer than Prefect's default timeout).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from benchmarks.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
