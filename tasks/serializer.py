"""
``GPUResultSerializer``: the result serializer that refuses host persistence.

GPU tasks carry it with ``persist_result=False`` (which beats flow-level
persistence and ``PREFECT_RESULTS_PERSIST_BY_DEFAULT``). It matters when a user
switches persistence on anyway: Prefect then calls :meth:`dumps`, which refuses,
so nothing is written. Prefect 3.9 does not fail the task for that; it logs a
generic warning without the reason, which is why the refusal logs its own
WARNING on the task run, once
(:mod:`~prefect_cudf_polars.blocks.persistence`, the refusal every
serializer meets), as the GPU tasks do when they are asked to persist
(:mod:`prefect_cudf_polars.tasks.task_defaults`).
"""

from __future__ import annotations

from typing import Any, Literal

from prefect.serializers import PickleSerializer, Serializer

from prefect_cudf_polars.blocks.errors import RUN_PRODUCER_AGAIN, HostPersistenceError
from prefect_cudf_polars.blocks.persistence import refuse_host_persistence
from prefect_cudf_polars.blocks.arguments import results_in

#: Prefix of host values this serializer writes (anything without it is refused on load).
HOST_HEADER = b"prefect-cudf-polars:host:"


class GPUResultSerializer(Serializer):
    """
    A Prefect serializer (type ``"cudf-polars-gpu"``) that never writes a GPU result.

    Methods
    -------
    dumps(obj)
        Raises :class:`HostPersistenceError` for a :class:`GPUResult` or anything
        containing one (with a WARNING on the task run that nothing was
        persisted); other (host) values are pickled behind a header.
    loads(blob)
        Loads only host values it wrote; refuses anything else with
        :class:`HostPersistenceError` (a GPU result is never on disk to load).
    """

    type: Literal["cudf-polars-gpu"] = "cudf-polars-gpu"

    def dumps(self, obj: Any) -> bytes:
        """
        Serialize a host value; refuse GPU results.

        Raises
        ------
        HostPersistenceError
            If ``obj`` is or contains a :class:`GPUResult`.
        """
        if results := results_in(obj):
            refuse_host_persistence(results[0])
        return HOST_HEADER + PickleSerializer().dumps(obj)

    def loads(self, blob: bytes) -> Any:
        """
        Load a host value this serializer wrote.

        Raises
        ------
        HostPersistenceError
            If ``blob`` was not written by :meth:`dumps` (GPU results never are).
        """
        if not blob.startswith(HOST_HEADER):
            raise HostPersistenceError(
                "The cudf-polars-gpu serializer never persists GPU results, so there is nothing to load here: "
                f"{RUN_PRODUCER_AGAIN}, and persist host values (collected DataFrames) with a host serializer.")
        return PickleSerializer().loads(blob[len(HOST_HEADER) :])
