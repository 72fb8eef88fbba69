"""
The ``ray`` backend: cudf-polars' ``RayEngine``, one rank (actor) per GPU.

Without ``ray_address`` the session starts a new local Ray head of its own
(:mod:`~prefect_cudf_polars.blocks.backends.ray.head`: outside the flow run's
process group, killed with the flow process), the engine connects to it, and
the session's end stops it; this holds even when ``RAY_ADDRESS`` is set or
another Ray runs on the machine. With ``ray_address`` it connects
(``ray.init(address=...)``); ``ray.shutdown()`` then only disconnects this
driver, and the cluster keeps running. In both cases Ray's failure signal
handler is kept out of the driver, so a SIGTERM leaves the teardown time to
finish. If this process already called ``ray.init`` itself, cudf-polars uses
that Ray and leaves it running. Ray is optional: ``pip install ray``.
"""

from __future__ import annotations

import importlib.util
from contextlib import ExitStack

from prefect_cudf_polars.blocks.backends.compat import disable_ray_failure_signal_handler, reload_ray_auth_token
from prefect_cudf_polars.blocks.backends.ray.connect import explain_connect_failure
from prefect_cudf_polars.blocks.backends.ray.head import LocalHead
from prefect_cudf_polars.blocks.backends.streaming import StreamingRunningEngine, limited_engine_kwargs
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import INSTALL, NoGPUError


def start(block: CudfPolarsEngine, stack: ExitStack, limit: int | None = None) -> StreamingRunningEngine:
    """
    Create a ``RayEngine`` (call on the owner thread); the engine and an owned head go on ``stack``.

    Raises
    ------
    NoGPUError
        When Ray is not installed, or the Ray cluster has no free GPU.
    RayClusterError
        When ``ray_address`` cannot be connected to, or the local head does not
        start: what went wrong and what to do.
    """
    if importlib.util.find_spec("ray") is None:
        raise NoGPUError(f"backend='ray' needs Ray, which is not installed: {INSTALL.format(extra='ray')}, "
                         "or choose backend='spmd' or 'dask'.")
    disable_ray_failure_signal_handler()
    import ray
    from cudf_polars.engine.ray import RayEngine

    running = StreamingRunningEngine("ray", stack, limit)
    if block.ray_address:
        init, cluster = {"address": block.ray_address}, f"external Ray {block.ray_address}"
        reload_ray_auth_token()  # not a token an earlier Ray session in this process loaded
    elif ray.is_initialized():
        # cudf-polars 26.10 then uses the Ray this process started, and leaves it running.
        init, cluster = {}, "the Ray this process started (left running)"
    else:
        head = LocalHead()
        stack.callback(head.stop)
        init, cluster = {"address": head.address}, "owned local Ray"
    try:
        running.enter(RayEngine(ray_init_options=init, **limited_engine_kwargs(block, limit)), stack)
    except ConnectionError as exc:
        if not block.ray_address:
            raise
        raise explain_connect_failure(block.ray_address, exc) from exc
    except RuntimeError as exc:
        if "GPU" not in str(exc):
            raise
        where = block.ray_address or "the local Ray started for this session"
        raise NoGPUError(f"The Ray cluster at {where} has no free GPU for cudf-polars ({exc}). Add GPU nodes "
                         "(`ray start --num-gpus N`), free the GPUs other jobs hold, or use backend='spmd' on a "
                         "single GPU.") from exc
    running.extra = {"cluster": cluster}
    return running
