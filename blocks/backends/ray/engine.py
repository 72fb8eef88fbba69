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
from typing import TYPE_CHECKING

from prefect_cudf_polars.blocks.backends.ray.connect import explain_connect_failure, reload_auth_token
from prefect_cudf_polars.blocks.backends.ray.head import disable_failure_signal_handler, start_local_head
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
    disable_failure_signal_handler()
    import ray
    from cudf_polars.engine.ray import RayEngine

    silence_unstable_warning()
    head = None
    if block.ray_address:
        init = {"address": block.ray_address}
        reload_auth_token()  # not a token an earlier Ray session in this process loaded
    elif ray.is_initialized():
        init = {}  # cudf-polars 26.10 then uses the Ray this process started, and leaves it running
    else:
        head = start_local_head()
        init = {"address": head.address}
    try:
        engine = RayEngine(ray_init_options=init, **engine_kwargs(block))
    except ConnectionError as exc:
        if head is not None:
            head.stop()
        if not block.ray_address:
            raise
        raise explain_connect_failure(block.ray_address, exc) from exc
    except RuntimeError as exc:
        if head is not None:
            head.stop()
        if "GPU" in str(exc):
            where = block.ray_address or "the local Ray started for this session"
            raise NoGPUError(
                f"The Ray cluster at {where} has no free GPU for cudf-polars ({exc}). Add GPU "
                "nodes (`ray start --num-gpus N`), free the GPUs other jobs hold, or use "
                "backend='spmd' on a single GPU."
            ) from exc
        raise
    except BaseException:
        if head is not None:
            head.stop()
        raise
    running = StreamingRunningEngine("ray", engine, on_shutdown=head.stop if head is not None else None)
    if block.ray_address:
        cluster = f"external Ray {block.ray_address}"
    else:
        cluster = "owned local Ray" if head is not None else "the Ray this process started (left running)"
    running.extra_description = {"cluster": cluster}
    return running
