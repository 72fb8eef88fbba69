"""
Dask ``--preload`` for the lease tests: ``prefect_cudf_polars`` cannot be imported here.

Stands for a scheduler and workers that do not have our package installed, so
the lease must reach them by value.
"""

import sys

sys.modules["prefect_cudf_polars"] = None  # import raises ModuleNotFoundError
