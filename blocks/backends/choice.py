"""
Which backend a flow run's session runs, and starting it.

``backend="auto"`` picks ``"spmd"`` with one visible GPU and ``"dask"`` with
several. A GPU backend on a machine without a usable GPU or RAPIDS stack is an
error (:class:`~prefect_cudf_polars.blocks.NoGPUError`), unless the block's
``cpu_fallback`` is set: then the ``cpu`` backend runs, with a warning.
"""

from __future__ import annotations

import importlib
from contextlib import ExitStack

from prefect_cudf_polars.blocks.backends import probe
from prefect_cudf_polars.blocks.backends.base import RunningEngine
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import SAVE_ENGINE, USE_CPU, NoGPUError

#: The module of ``prefect_cudf_polars.blocks.backends`` that starts each backend (imported only when that
#: backend runs: the GPU ones import cudf-polars).
BACKEND_MODULES = {"cpu": "cpu", "spmd": "streaming", "dask": "dask.engine", "ray": "ray.engine"}


def resolve_backend(block: CudfPolarsEngine) -> tuple[str, str | None]:
    """
    Pick the backend to run, from the block and this machine.

    Parameters
    ----------
    block : CudfPolarsEngine
        Its ``backend`` and ``cpu_fallback`` fields.

    Returns
    -------
    (backend, warning) : tuple of str and (str or None)
        ``warning`` is the text to log when the CPU fallback was taken.

    Raises
    ------
    NoGPUError
        A GPU backend was asked for (explicitly or by ``"auto"``), no usable GPU
        or RAPIDS stack is here, and ``cpu_fallback`` is False.
    """
    if block.backend == "cpu":
        return "cpu", None
    found = probe.probe()
    if found.problem is None:
        if block.backend != "auto":
            return block.backend, None
        return ("spmd" if found.gpus == 1 else "dask"), None
    if block.cpu_fallback:
        return "cpu", (f"backend={block.backend!r} needs an NVIDIA GPU, but {found.problem}; cpu_fallback=True, so "
                       "this flow run uses the cpu backend (polars on the CPU, results in host memory).")
    raise NoGPUError(f"backend={block.backend!r} needs an NVIDIA GPU and the RAPIDS packages, but {found.problem}. "
                     f"Run on a GPU machine, or {USE_CPU}; for a saved block: "
                     f"{SAVE_ENGINE.format(name='NAME', backend='cpu')}.")


def gpus_used(backend: str, block: CudfPolarsEngine) -> int:
    """
    The GPUs of this machine an engine of ``backend`` uses: one for ``spmd`` (and ``cpu``, as one rank), every
    visible one for a ``dask`` or ``ray`` cluster the session starts (a rank per GPU), one for an external cluster
    (its GPUs are not this machine's).
    """
    if backend in ("spmd", "cpu") or block.dask_scheduler_address or block.ray_address:
        return 1
    return max(probe.count_gpus()[0], 1)


def start_backend(backend: str, block: CudfPolarsEngine, stack: ExitStack, limit: int | None = None) -> RunningEngine:
    """
    Start ``backend`` with the block's fields (call on the engine host's owner thread).

    Parameters
    ----------
    backend : {"cpu", "spmd", "dask", "ray"}
        A resolved backend (see :func:`resolve_backend`).
    block : CudfPolarsEngine
        The engine configuration.
    stack : contextlib.ExitStack
        Receives everything the backend creates (engine, cluster, lease, Ray
        head); closing it shuts them down, last created first.
    limit : int, optional
        ``device_memory_limit`` in bytes (``CudfPolarsEngine.memory_limit_bytes``).

    Returns
    -------
    RunningEngine

    Raises
    ------
    NoGPUError, DaskClusterError, RayClusterError
        What the backend raises when its engine cannot start (what it entered
        into ``stack`` is the caller's to close).
    """
    module = importlib.import_module(f"prefect_cudf_polars.blocks.backends.{BACKEND_MODULES[backend]}")
    return module.start(block, stack, limit)
