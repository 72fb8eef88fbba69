"""
The ``spmd`` backend: cudf-polars' ``SPMDEngine`` in this process.

Started without ``rrun`` (cudf-polars 26.10), it runs one rank on one GPU with
no UCX setup. The session creates and shuts it down on its owner thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine
from prefect_cudf_polars.blocks.backends.streaming_options import engine_kwargs, silence_unstable_warning

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """Create an ``SPMDEngine`` from the block's options (call on the owner thread)."""
    from cudf_polars.engine.spmd import SPMDEngine

    silence_unstable_warning()
    return StreamingRunningEngine("spmd", SPMDEngine(**engine_kwargs(block)))
