"""
Turn a :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine` block into the three
option sets every cudf-polars streaming engine takes (rapidsmpf, executor, engine).

Imported only by the GPU backends, after the GPU probe passed: it imports cudf-polars.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rapidsmpf.config import Options

    from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine


def engine_kwargs(block: CudfPolarsEngine) -> dict[str, Any]:
    """
    Build ``rapidsmpf_options``, ``executor_options`` and ``engine_options``.

    Unset block fields stay unset, so cudf-polars' environment variables
    (``CUDF_POLARS__*``, ``RAPIDSMPF_*``) and defaults apply to them.

    Returns
    -------
    dict
        Keyword arguments for ``SPMDEngine``, ``DaskEngine`` or ``RayEngine``.
    """
    # cudf-polars 26.10: the streaming engines' options (engine/options.py) and the rmm
    # resource description they take (utils/config.py), both constructed by keyword.
    from cudf_polars.engine.options import StreamingOptions
    from cudf_polars.utils.config import MemoryResourceConfig

    named: dict[str, Any] = {"raise_on_fail": block.raise_on_fail}
    if block.target_partition_size is not None:
        named["target_partition_size"] = block.target_partition_size
    if block.max_rows_per_partition is not None:
        named["max_rows_per_partition"] = block.max_rows_per_partition
    if block.spill_device_limit is not None:
        # cudf-polars 26.10's StreamingOptions.spill_device_limit is a str ("80%" or bytes).
        named["spill_device_limit"] = str(block.spill_device_limit)
    if (mr := block.memory_resource_config()) is not None:
        named["memory_resource_config"] = MemoryResourceConfig(**mr)
    options = StreamingOptions(**named)
    rapidsmpf_options: Options = options.to_rapidsmpf_options()
    return {
        "rapidsmpf_options": rapidsmpf_options,
        "executor_options": {**options.to_executor_options(), **block.executor_options},
        "engine_options": options.to_engine_options(),
    }


def silence_unstable_warning() -> None:
    """
    Ignore cudf-polars' ``UnstableWarning`` for ``engine.execute()`` in this process.

    This package is built on ``execute()``; the warning says nothing a flow's
    user can act on, and its stack level points into Prefect.
    """
    from cudf_polars.unstable import UnstableWarning

    warnings.filterwarnings("ignore", category=UnstableWarning)
