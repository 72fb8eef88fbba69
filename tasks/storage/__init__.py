"""
Storage: reading and writing parquet on local disks and ``s3://``, and host results in result storage.

:mod:`~prefect_cudf_polars.tasks.storage.credentials` (S3 access from a
prefect-aws ``AwsCredentials`` block), :mod:`~prefect_cudf_polars.tasks.storage.location`
(``s3://`` URLs and the checks made before an engine call),
:mod:`~prefect_cudf_polars.tasks.storage.errors` (``S3AccessError``),
:mod:`~prefect_cudf_polars.tasks.storage.read` (the ``read_parquet`` task),
:mod:`~prefect_cudf_polars.tasks.storage.sink` (the ``sink_parquet`` task),
:mod:`~prefect_cudf_polars.tasks.storage.dataframe_serializer` (host DataFrames
in result storage) and :mod:`~prefect_cudf_polars.tasks.storage.persisted_collect`
(``collect`` with its DataFrame persisted).
"""
