"""
``PolarsDataFrameSerializer``: persist host ``polars.DataFrame`` results as parquet or Arrow IPC.

GPU results are never persisted (:class:`~prefect_cudf_polars.tasks.GPUResultSerializer`
refuses them); the host DataFrames that ``collect`` returns can be. Give a task
this serializer with result persistence and any Prefect result storage block
(``LocalFileSystem``, prefect-aws ``S3Bucket``, ``RemoteFileSystem``)::

    persisted_collect = collect.with_options(
        persist_result=True,
        result_storage=S3Bucket.load("results"),
        result_serializer=PolarsDataFrameSerializer(format="parquet"),
    )

Prefect stores a result record as JSON with the serialized value inside it, so
:meth:`PolarsDataFrameSerializer.dumps` returns the parquet (or IPC) bytes
base64-encoded, as Prefect's own pickle serializer does.

``format="ipc"`` (Arrow IPC) keeps every polars dtype exactly (Enum,
Categorical, nested types); ``"parquet"`` is smaller and readable by any
parquet tool, and round-trips the common dtypes (numbers, strings, booleans,
dates, datetimes with time zones, durations, lists, structs; checked in
``tests/storage/test_dataframe_serializer.py``).
"""

from __future__ import annotations

import base64
import io
from typing import Literal

import polars as pl
from prefect.serializers import Serializer

from prefect_cudf_polars.blocks.errors import READ_WITH_ITS_SERIALIZER, wrong_type


class PolarsDataFrameSerializer(Serializer):
    """
    A Prefect serializer (type ``"polars-dataframe"``) for ``polars.DataFrame`` results.

    Parameters
    ----------
    format : {"parquet", "ipc"}
        ``"parquet"`` (default) or Arrow IPC (``"ipc"``, exact for every dtype).
    compression : {"zstd", "lz4", "uncompressed"}
        Codec for either format (default ``"zstd"``; parquet also takes ``"snappy"``).

    Methods
    -------
    dumps(df)
        The DataFrame as base64-encoded parquet or IPC bytes.
    loads(blob)
        The DataFrame back.
    """

    type: Literal["polars-dataframe"] = "polars-dataframe"
    format: Literal["parquet", "ipc"] = "parquet"
    compression: Literal["zstd", "lz4", "snappy", "uncompressed"] = "zstd"

    def dumps(self, obj: pl.DataFrame) -> bytes:
        """
        Serialize a DataFrame.

        Raises
        ------
        TypeError
            If ``obj`` is not a ``polars.DataFrame`` (a LazyFrame must be collected
            first; other values need another serializer, e.g. ``"pickle"``).
        ValueError
            ``compression="snappy"`` with ``format="ipc"`` (IPC has no snappy).
        """
        if not isinstance(obj, pl.DataFrame):
            then = ("collect it first (the `collect` task)" if isinstance(obj, pl.LazyFrame) else
                    "use another result serializer (e.g. 'pickle') for this task")
            raise TypeError(wrong_type("PolarsDataFrameSerializer", "polars DataFrames only", obj, then))
        if self.format != "parquet" and self.compression == "snappy":
            raise ValueError("Arrow IPC has no snappy compression; use 'zstd', 'lz4' or 'uncompressed'.")
        buffer = io.BytesIO()
        (obj.write_parquet if self.format == "parquet" else obj.write_ipc)(buffer, compression=self.compression)
        return base64.b64encode(buffer.getvalue())

    def loads(self, blob: bytes) -> pl.DataFrame:
        """
        Deserialize a DataFrame written by :meth:`dumps`.

        Raises
        ------
        ValueError
            If ``blob`` is not base64 of a parquet or IPC file in this serializer's
            format (for example a record written by another serializer).
        """
        try:
            buffer = io.BytesIO(base64.b64decode(blob, validate=True))
        except ValueError as exc:  # binascii.Error is one
            raise ValueError("This result was not written by PolarsDataFrameSerializer (it is not base64): "
                             f"{READ_WITH_ITS_SERIALIZER}.") from exc
        try:
            return pl.read_parquet(buffer) if self.format == "parquet" else pl.read_ipc(buffer, memory_map=False)
        except Exception as exc:
            raise ValueError(f"This result is not a {self.format} file (another serializer or format wrote it): "
                             f"{READ_WITH_ITS_SERIALIZER}.") from exc
