"""
The engines a session can run, one module (or subpackage) per backend.

``cpu`` (polars on the CPU, host memory), ``spmd`` (cudf-polars' ``SPMDEngine``,
one GPU in this process), ``dask`` and ``ray`` (cudf-polars' ``DaskEngine`` and
``RayEngine``, one rank per GPU). Each backend is the one adapter between the
session and its engine: cudf-polars internals are used there and nowhere else.
:mod:`~prefect_cudf_polars.blocks.backends.choice` picks and starts one;
:mod:`~prefect_cudf_polars.blocks.backends.base` is what they hand the session.
"""
