"""
The ``ray`` backend: cudf-polars' ``RayEngine`` on a local Ray the session owns or an external cluster.

:mod:`~prefect_cudf_polars.blocks.backends.ray.engine` starts the engine;
:mod:`~prefect_cudf_polars.blocks.backends.ray.connect` explains a failed
connection to ``ray_address`` and reloads Ray's authentication token.
"""
