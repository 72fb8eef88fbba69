"""
prefect-cudf-polars: Prefect tasks whose cudf-polars results stay on the GPU.

The most used names are importable from the top level::

    from prefect_cudf_polars import (
        CudfPolarsEngine, CudfPolarsTaskRunner, GPUResult, collect, execute, gpu_task, tee,
    )

Everything public lives in three subpackages:

- :mod:`prefect_cudf_polars.blocks` (folder ``blocks/``): the engine block,
  the flow-scoped engine session and the task runner.
- :mod:`prefect_cudf_polars.tasks` (folder ``tasks/``): ``GPUResult``, the
  tasks that produce it, the serializers and the errors.
- :mod:`prefect_cudf_polars.flows` (folder ``flows/``): deployable jobs.
"""

__version__ = "0.1.0"

# Where Prefect would start its temporary local API, start it quietly (local_api.py).
from prefect_cudf_polars import local_api  # noqa: E402

local_api.apply_local_api_defaults()

# Importing the subpackages registers the block type and the serializer types with
# Prefect when it loads this collection (entry point `prefect.collections`).
from prefect_cudf_polars import blocks, tasks  # noqa: E402,F401
from prefect_cudf_polars.blocks import CudfPolarsEngine, CudfPolarsTaskRunner  # noqa: E402
from prefect_cudf_polars.tasks import GPUResult, collect, execute, gpu_task, tee  # noqa: E402

__all__ = ["CudfPolarsEngine", "CudfPolarsTaskRunner", "GPUResult", "collect", "execute", "gpu_task", "tee"]
