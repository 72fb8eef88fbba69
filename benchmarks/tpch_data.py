"""
TPC-H tables as parquet, generated with ``tpchgen-cli`` (PyPI, pure Rust, multi-threaded).

``tpchgen-cli parquet -s SF -T TABLES -o DIR`` writes one ``<table>.parquet`` per
table. Its money columns are ``Decimal(15, 2)``; this module rewrites them as
``Float64`` (polars on the CPU, streaming), as the PDS-H benchmark of polars and
cudf-polars reads them, so that every engine compares float arithmetic and no
variant depends on decimal support. Dates stay ``Date``.

Generated data is kept per scale factor under ``DATA_DIR/sf<SF>`` with a
``.complete`` marker; a second run reuses it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import polars as pl
import polars.selectors as cs

#: The tables the pipelines read (``benchmarks.pipelines``).
TABLES = ("lineitem", "orders", "customer", "supplier", "nation", "region")

#: The environment variable that names the data folder (default below).
DATA_ENV = "PREFECT_CUDF_POLARS_TPCH"

MARKER = ".complete"


class TpchGenNotFoundError(RuntimeError):
    """``tpchgen-cli`` is not installed where this process can find it."""


def default_data_dir() -> Path:
    """``$PREFECT_CUDF_POLARS_TPCH``, else ``~/.cache/prefect-cudf-polars/tpch``."""
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else Path.home() / ".cache" / "prefect-cudf-polars" / "tpch"


def find_tpchgen(explicit: str | None = None) -> str:
    """
    Path of the ``tpchgen-cli`` binary.

    Looked for, in order: ``explicit``; ``PATH``; the ``bin`` folder of this
    interpreter's scripts (a venv not on ``PATH``); ``bin`` next to any
    ``sys.path`` entry (a site folder installed with ``pip --target`` and used
    through ``PYTHONPATH``).

    Raises
    ------
    TpchGenNotFoundError
        When none of these holds it.
    """
    candidates = [explicit] if explicit else []
    if (on_path := shutil.which("tpchgen-cli")) is not None:
        candidates.append(on_path)
    candidates.append(os.path.join(sysconfig.get_path("scripts"), "tpchgen-cli"))
    candidates.append(os.path.join(os.path.dirname(sys.executable), "tpchgen-cli"))
    candidates += [os.path.join(entry, "bin", "tpchgen-cli") for entry in sys.path if entry]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise TpchGenNotFoundError(
        "tpchgen-cli was not found (looked on PATH, next to this Python and under "
        "<sys.path entry>/bin). Install it with `pip install tpchgen-cli==4.0.0` "
        "or pass --tpchgen /path/to/tpchgen-cli."
    )


def tpchgen_version(binary: str) -> str:
    """The version line ``tpchgen-cli -V`` prints (``"tpchgen-cli 4.0.0"``)."""
    done = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False)
    return (done.stdout or done.stderr).strip()


def sf_label(scale_factor: float) -> str:
    """Folder-safe text of a scale factor: ``1``, ``10``, ``0.01``."""
    return f"{scale_factor:g}"


def table_paths(folder: Path) -> dict[str, str]:
    """``{table: path}`` of the parquet files in one scale factor's folder."""
    return {table: str(folder / f"{table}.parquet") for table in TABLES}


def ensure_tpch(
    scale_factor: float,
    data_dir: Path,
    *,
    tpchgen: str | None = None,
    threads: int | None = None,
) -> dict[str, object]:
    """
    Generate (or reuse) the TPC-H tables of one scale factor as float parquet.

    Parameters
    ----------
    scale_factor
        TPC-H scale factor (1 is about 1 GB of text; lineitem has about
        6,000,000 x SF rows).
    data_dir
        Parent folder; the tables go to ``data_dir/sf<SF>/<table>.parquet``.
    tpchgen
        Path of ``tpchgen-cli`` (default: :func:`find_tpchgen`).
    threads
        Threads for ``tpchgen-cli`` (default: all CPUs).

    Returns
    -------
    dict
        ``paths`` ({table: path}), ``folder``, ``reused`` (bool),
        ``generate_s`` and ``convert_s`` (seconds; 0 when reused), ``rows``
        ({table: rows}), ``bytes`` (parquet bytes on disk), ``generator``.

    Raises
    ------
    TpchGenNotFoundError
        If ``tpchgen-cli`` cannot be found.
    subprocess.CalledProcessError
        If ``tpchgen-cli`` fails (its stderr is in the exception).
    """
    folder = Path(data_dir) / f"sf{sf_label(scale_factor)}"
    marker = folder / MARKER
    if marker.exists():
        info = json.loads(marker.read_text())
        return {**info, "paths": table_paths(folder), "folder": str(folder), "reused": True}
    binary = find_tpchgen(tpchgen)
    raw = folder / "raw"
    if folder.exists():
        shutil.rmtree(folder)
    raw.mkdir(parents=True)
    cmd = [binary, "parquet", "-s", sf_label(scale_factor), "-T", ",".join(TABLES)]
    cmd += ["-o", str(raw), "-q", "--no-progress"]
    if threads:
        cmd += ["-n", str(threads)]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    generate_s = time.perf_counter() - started
    started = time.perf_counter()
    rows = {}
    for table in TABLES:
        source = pl.scan_parquet(raw / f"{table}.parquet")
        source.with_columns(cs.decimal().cast(pl.Float64)).sink_parquet(folder / f"{table}.parquet")
        rows[table] = pl.scan_parquet(folder / f"{table}.parquet").select(pl.len()).collect().item()
        (raw / f"{table}.parquet").unlink()  # the raw copy goes before the next table is converted
    convert_s = time.perf_counter() - started
    shutil.rmtree(raw)
    info = {
        "scale_factor": scale_factor,
        "generator": tpchgen_version(binary),
        "command": " ".join(cmd),
        "generate_s": generate_s,
        "convert_s": convert_s,
        "rows": rows,
        "bytes": sum((folder / f"{t}.parquet").stat().st_size for t in TABLES),
    }
    marker.write_text(json.dumps(info))
    return {**info, "paths": table_paths(folder), "folder": str(folder), "reused": False}
