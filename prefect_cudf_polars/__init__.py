"""
prefect-cudf-polars: Prefect tasks whose cudf-polars results stay on the GPU.

The code lives in three rooms, each its own subpackage:

- :mod:`prefect_cudf_polars.blocks` (folder ``blocks/``): the engine block,
  the flow-scoped engine session and the task runner.
- :mod:`prefect_cudf_polars.tasks` (folder ``tasks/``): ``GPUResult``, the
  tasks that produce it and the serializer that refuses host persistence.
- :mod:`prefect_cudf_polars.flows` (folder ``flows/``): deployable jobs.
"""

__version__ = "0.1.0"

# Importing the rooms registers the block type and the serializer type with
# Prefect when it loads this collection (entry point `prefect.collections`).
from prefect_cudf_polars import blocks, tasks  # noqa: E402,F401
