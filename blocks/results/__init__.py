"""
Results: the ``GPUResult`` handle, its lineage, and the one walker over task arguments.

:mod:`~prefect_cudf_polars.blocks.results.result` (the handle and the interface
it asks of its session), :mod:`~prefect_cudf_polars.blocks.results.lineage`
(how a result is produced again), :mod:`~prefect_cudf_polars.blocks.results.split`
(one result into N), :mod:`~prefect_cudf_polars.blocks.results.walker` (where
results are in task arguments), :mod:`~prefect_cudf_polars.blocks.results.run_identity`
(which task run or flow run is running).
"""
