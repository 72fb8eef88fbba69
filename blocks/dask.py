"""
The ``dask`` backend: cudf-polars' ``DaskEngine`` on a cluster it starts itself.

``DaskEngine()`` with no client starts a local cluster with one worker per
visible GPU and closes it on ``shutdown()`` (seen on the H200: about 7 s on one
GPU, 9 s on two). Connecting to an external scheduler and dask-cuda's
``LocalCUDACluster`` are the multi-GPU issue's work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.streaming_engine import StreamingRunningEngine
from prefect_cudf_polars.blocks.streaming_options import engine_kwargs, silence_unstable_warning

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """Create a ``DaskEngine`` that owns its local cluster (call on the owner thread)."""
    from cudf_polars.engine.dask import DaskEngine

    silence_unstable_warning()
    return StreamingRunningEngine("dask", DaskEngine(**engine_kwargs(block)))
