"""
The ``ray`` backend: cudf-polars' ``RayEngine``, one rank (actor) per GPU.

Without ``ray_address`` the engine calls ``ray.init(address="local")`` and its
shutdown calls ``ray.shutdown()``: a new local Ray the session started and
stops, even when ``RAY_ADDRESS`` is set or another Ray runs on the machine
(plain ``ray.init()`` would attach to those; Ray's ``ray.init`` docs). With
``ray_address`` it connects (``ray.init(address=...)``); ``ray.shutdown()`` then
only disconnects this driver, and the cluster keeps running. Ray is optional:
``pip install ray``.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.backends.ray.connect import explain_connect_failure, reload_auth_token
from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine
from prefect_cudf_polars.blocks.backends.streaming_options import engine_kwargs, silence_unstable_warning
from prefect_cudf_polars.blocks.errors import NoGPUError

if TYPE_CHECKING:
    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def start(block: CudfPolarsEngine) -> StreamingRunningEngine:
    """
    Create a ``RayEngine`` (call on the owner thread).

    Raises
    ------
    NoGPUError
        When Ray is not installed, or the Ray cluster has no free GPU.
    RayClusterError
        When ``ray_address`` cannot be connected to: what went wrong and what to
        do (see :mod:`prefect_cudf_polars.blocks.backends.ray.connect`).
    """
    if importlib.util.find_spec("ray") is None:
        raise NoGPUError(
            "backend='ray' needs Ray, which is not installed: `pip install ray`, "
            "or choose backend='spmd' or 'dask'."
        )
    from cudf_polars.engine.ray import RayEngine

    silence_unstable_warning()
    init = {"address": block.ray_address or "local"}
    reload_auth_token()  # not a token an earlier Ray session in this process loaded
    try:
        engine = RayEngine(ray_init_options=init, **engine_kwargs(block))
    except ConnectionError as exc:
        if not block.ray_address:
            raise
        raise explain_connect_failure(block.ray_address, exc) from exc
    except RuntimeError as exc:
        if "GPU" in str(exc):
            where = block.ray_address or "the local Ray started for this session"
            raise NoGPUError(
                f"The Ray cluster at {where} has no free GPU for cudf-polars ({exc}). Add GPU "
                "nodes (`ray start --num-gpus N`), free the GPUs other jobs hold, or use "
                "backend='spmd' on a single GPU."
            ) from exc
        raise
    running = StreamingRunningEngine("ray", engine)
    running.extra_description = {
        "cluster": f"external Ray {block.ray_address}" if block.ray_address else "owned local Ray"
    }
    return running
