"""
The ``dask`` backend: cudf-polars' ``DaskEngine`` on a cluster the session owns or borrows.

:mod:`~prefect_cudf_polars.blocks.backends.dask.engine` starts the engine,
:mod:`~prefect_cudf_polars.blocks.backends.dask.cluster` connects to (or starts)
the cluster, and :mod:`~prefect_cudf_polars.blocks.backends.dask.lease` makes an
external scheduler clean up after a session that was killed.
"""
