"""
The ``ray`` backend: cudf-polars' ``RayEngine`` on a local Ray it starts itself.

Ray is optional (``pip install ray``); connecting to an existing Ray cluster is
the multi-GPU issue's work.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.streaming_engine import StreamingRunningEngine
from prefect_cudf_polars.blocks.streaming_options import engine_kwargs, silence_unstable_warning
from prefect_cudf_polars.tasks.errors import NoGPUError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """
    Create a ``RayEngine`` (call on the owner thread).

    Raises
    ------
    NoGPUError
        When Ray is not installed.
    """
    if importlib.util.find_spec("ray") is None:
        raise NoGPUError(
            "backend='ray' needs Ray, which is not installed: `pip install ray`, "
            "or choose backend='spmd' or 'dask'."
        )
    from cudf_polars.engine.ray import RayEngine

    silence_unstable_warning()
    return StreamingRunningEngine("ray", RayEngine(**engine_kwargs(block)))
