"""
The ``cudf-polars-engine`` block: how a flow run's engine is configured.

The block holds configuration only (it is saved, loaded and edited in the
Prefect UI). Live state (the engine, its cluster, its results) lives in the
:class:`~prefect_cudf_polars.blocks.EngineSession` that :meth:`CudfPolarsEngine.session`
opens for one flow run.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any, ClassVar, Literal

from prefect.blocks.core import Block
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from prefect_cudf_polars.blocks.active import SessionProvider
from prefect_cudf_polars.blocks.engine_options import (
    NAMED_EXECUTOR_KEYS, RESERVED_EXECUTOR_KEYS, EngineOptions, streaming_executor_fields)
from prefect_cudf_polars.blocks.errors import (
    ADMISSION_NEEDS_LIMIT, LIMIT_NAME_RULE, MEMORY_AMOUNT_RULE, SAVE_ENGINE, BlockNotFoundError, invalid_fields)


Backend = Literal["auto", "spmd", "dask", "ray", "cpu"]

# Each rule below is checked once, by the field's validator; the UI form's JSON Schema is derived from it
# (the validator's json_schema_input_type), so the form and the block refuse the same values, but for a
# number of bytes below MIN_LIMIT_BYTES, which the block refuses when it is built or loaded.
#: A device memory amount as text: a percentage above 0 and at most 100 ("80%", "0.5%"), or a positive number of bytes.
MEMORY_AMOUNT_PATTERN = r"^(?:(?:100(?:\.0+)?|0*[1-9]\d?(?:\.\d+)?|0+\.\d*[1-9]\d*)%|0*[1-9]\d*)$"
#: The smallest memory limit in bytes a block takes (a smaller number is most likely a percentage without its "%").
MIN_LIMIT_BYTES = 2**20
#: A Prefect global concurrency limit's name (Prefect 3.9: no / % & > <), without spaces around it.
LIMIT_NAME_PATTERN = r"^[^/%&><\s]([^/%&><]*[^/%&><\s])?$"
_MemoryAmount = Annotated[int, Field(gt=0)] | Annotated[str, Field(pattern=MEMORY_AMOUNT_PATTERN)] | None
_Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# Keys Prefect 3.9's Block serializer adds to a block's data (Block.ser_model,
# Block.validate_block_type_slug); a saved block's document carries them.
_PREFECT_BLOCK_KEYS = frozenset({"block_type_slug", "_block_document_id", "_block_document_name", "_is_anonymous"})


def _did_you_mean(name: str, choices: Any) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(name, sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class CudfPolarsEngine(Block, EngineOptions):
    """
    Configuration of the cudf-polars engine a flow run uses.

    Save it once (``CudfPolarsEngine(backend="spmd").save("gpu")``), load it by
    name in flows (``CudfPolarsEngine.load("gpu")``), and edit it in the UI.
    Open an engine for a flow run with :meth:`session` or
    :class:`~prefect_cudf_polars.blocks.CudfPolarsTaskRunner`.

    Attributes
    ----------
    backend : {"auto", "spmd", "dask", "ray", "cpu"}
        ``"auto"`` picks ``"spmd"`` with one visible GPU and ``"dask"`` with
        several; ``"spmd"`` is cudf-polars' ``SPMDEngine`` (one rank, one GPU,
        no ``rrun``); ``"dask"`` and ``"ray"`` are cudf-polars' ``DaskEngine``
        and ``RayEngine``; ``"cpu"`` runs the same queries on polars' CPU engine
        with the same result rules, for machines without a GPU.
    cpu_fallback : bool
        With no usable GPU (or no RAPIDS packages), warn and use ``"cpu"``
        instead of raising :class:`~prefect_cudf_polars.blocks.NoGPUError`.
        Default False.
    raise_on_fail : bool
        A query cudf-polars cannot run on the GPU raises instead of silently
        running on the CPU (polars' ``GPUEngine(raise_on_fail=...)``). Default True.
    target_partition_size : int or None
        Target size of one IO partition, in bytes (cudf-polars' executor
        option; its default is min(1.5 GB, 2.5 % of the smallest GPU's memory)).
    max_rows_per_partition : int or None
        Most rows in one partition (cudf-polars' default 1,000,000).
    spill_device_limit : int, str or None
        Device memory use above which rapidsmpf spills to host: a percentage of
        GPU memory above 0 and at most 100 (``"80%"``, rapidsmpf's default;
        rapidsmpf 26.10 rounds a fraction of a percent to a whole one) or a
        number of bytes of at least 1 MiB (``60_000_000_000`` or ``"60000000000"``). A
        float is refused: rapidsmpf would read ``0.8`` as 0.8 bytes, not 80 %.
        With ``device_memory_limit`` set, a percentage is of that limit and
        bytes are at most it. cudf-polars 26.10 takes the limit as a string
        (``StreamingOptions``); the engine adapters pass an int as its digits.
    device_memory_resource : {"async", "pool", "managed", "cuda"}
        The rmm memory resource: ``"async"`` (cudf-polars' default,
        ``CudaAsyncMemoryResource``), ``"pool"`` (``PoolMemoryResource`` over
        ``CudaMemoryResource``), ``"managed"`` (unified memory, can exceed GPU
        memory) or ``"cuda"`` (no pool).
    device_memory_pool_size : int or None
        Initial pool size in bytes for ``"async"`` and ``"pool"`` (rmm rounds to
        256 bytes); ``None`` leaves rmm's default.
    dask_scheduler_address : str or None
        ``backend="dask"``: scheduler of an existing GPU cluster (workers started
        with ``--preload-nanny cudf_polars.engine.dask``); the session connects,
        never shuts it down, and still releases every result it produced.
        ``None`` starts a ``dask_cuda.LocalCUDACluster`` (one worker per visible
        GPU) that the session owns and closes.
    dask_connect_timeout : float
        Seconds to wait for ``dask_scheduler_address`` to answer (default 30).
    ray_address : str or None
        ``backend="ray"``: address of an existing Ray cluster, never stopped;
        ``None`` starts a new local Ray that the session stops
        (``ray.init(address="local")``, even when ``RAY_ADDRESS`` is set).
    teardown_timeout : float
        Seconds the session's end waits for the engine to release every result
        and shut down (default 20). Past it the results are marked released
        without the engine and a warning is logged. The default is below the 30 s
        a Prefect runner or process worker waits between SIGTERM and SIGKILL when
        it cancels a flow run (``grace_seconds = 30.0`` in Prefect 3.9's
        ``prefect/runner/_cancellation_manager.py``), so the session's end line
        and events still go out. A normal teardown of an owned cluster takes
        seconds, not tens of seconds (its end line gives the figure).
    executor_options : dict
        Further cudf-polars streaming executor options, passed as they are: the
        fields of cudf-polars' ``StreamingExecutor`` (read from cudf-polars where
        it can be imported, else those of 26.10), except the ones cudf-polars
        sets for the backend and the ones named fields above own.
    device_memory_limit : int, str or None
        Device memory the engine may use: bytes (``40_000_000_000``) or a
        percentage of the GPU's memory (``"40%"``); ``None`` (default) is the
        whole device. The engine's memory resource is capped there (an
        allocation past it fails as out-of-memory), rapidsmpf spills query data
        at ``spill_device_limit`` read as a share of this limit (default 80 %),
        and the engine pins at most the same share of 80 % of host memory that
        the limit is of the device, so several engines in separate processes
        share one GPU. The session keeps held results within a budget below it
        (``docs/memory.md``). On ``cpu`` it is host bytes the held results and a
        new result may take (a percentage: of the machine's memory).
    spill_results : {"off", "host"}
        When held results would leave a query too little room below
        ``device_memory_limit``: ``"off"`` (default) fails the engine call with
        :class:`~prefect_cudf_polars.blocks.DeviceMemoryError` naming them;
        ``"host"`` moves the least recently produced unread ones to host memory
        until it fits (each comes back to the GPU when read).
    admission_limit : str or None
        The name of a Prefect global concurrency limit whose slots are GiB of
        device memory: the session occupies ``ceil(device_memory_limit / GiB)``
        slots for each GPU its engine uses before the engine starts, and gives
        them back after it has shut down (needs ``device_memory_limit``). ``None`` (default): no admission.
    admission_timeout : float
        Seconds a session waits for its slots (default 3600); then its first
        GPU task run fails with :class:`~prefect_cudf_polars.blocks.AdmissionError`.
    result_artifacts : bool
        One markdown artifact per result on the task run that produced it (its
        plan, schema, rows, bytes, where it lives). Default False: each is a
        synchronous Prefect API call on the task's thread (Prefect 3.9.1), and
        the same facts are in the ``result.created`` event and in the flow
        run's summary artifact.

    Raises
    ------
    pydantic.ValidationError
        On a field with a bad value, naming the field and what it allows: for
        example ``spill_device_limit="120%"`` or ``0.8``, ``admission_limit`` without
        ``device_memory_limit``, an ``executor_options`` key that
        is not a streaming executor option (or one a named field or cudf-polars
        owns), or a field the block does not have (``target_partiton_size=5``,
        with the field it resembles).
    BlockNotFoundError
        From :meth:`load` and :meth:`aload`, for a name that was never saved.
    """

    _block_type_name: ClassVar[str] = "cudf-polars Engine"
    _block_type_slug: ClassVar[str] = "cudf-polars-engine"
    _logo_url: ClassVar[str] = "https://avatars.githubusercontent.com/u/43887749"
    _documentation_url: ClassVar[str] = "https://docs.rapids.ai/api/cudf/stable/cudf_polars/"
    _description: ClassVar[str] = ("Configures the cudf-polars engine that keeps Prefect task results on the GPU. "
                                   "Configuration only: each flow run opens its own engine session.")

    backend: Backend = Field(
        default="auto", description="auto: spmd with one GPU, dask with several; cpu: polars CPU engine.")
    cpu_fallback: bool = Field(
        default=False, description="With no usable GPU, warn and use the cpu backend instead of failing.")
    raise_on_fail: bool = Field(default=True, description="Fail a query cudf-polars cannot run on the GPU "
                                "instead of running it on the CPU.")
    target_partition_size: int | None = Field(default=None, gt=0, description="Target IO partition size in bytes.")
    max_rows_per_partition: int | None = Field(default=None, gt=0, description="Most rows in one partition.")
    spill_device_limit: int | str | None = Field(
        default=None, description="Spill to host above this device memory use: a percentage of GPU memory "
        '("80%"; of device_memory_limit when one is set) or a number of bytes.')
    device_memory_resource: Literal["async", "pool", "managed", "cuda"] = Field(
        default="async", description="rmm memory resource.")
    device_memory_pool_size: int | None = Field(
        default=None, gt=0, description="Initial pool size in bytes (async and pool).")
    dask_scheduler_address: str | None = Field(
        default=None, description="backend dask: scheduler of an existing GPU cluster (never shut down); "
        "empty starts a LocalCUDACluster the session owns.")
    dask_connect_timeout: _Seconds = Field(
        default=30.0, description="Seconds to wait for dask_scheduler_address to answer.")
    ray_address: str | None = Field(
        default=None, description="backend ray: address of an existing Ray cluster (never stopped); "
        "empty starts a new local Ray the session stops (even when RAY_ADDRESS is set).")
    teardown_timeout: _Seconds = Field(
        default=20.0, description="Seconds the session's end waits for the engine to release results "
        "and shut down; then results are marked released without it and a warning is logged.")
    executor_options: dict[str, Any] = Field(
        default_factory=dict, description="More cudf-polars streaming executor options, passed as they are.")
    device_memory_limit: int | str | None = Field(
        default=None, description="Device memory the engine may use: bytes, or a percentage of the GPU's memory "
        '("40%"); empty is the whole GPU. Lets several flow runs share one GPU.')
    spill_results: Literal["off", "host"] = Field(
        default="off", description="off: an engine call that held results leave no room for fails, naming them; "
        "host: the least recently produced unread results move to host memory until it fits.")
    host_spill_limit: int | str = Field(
        default="50%", description="Host memory the results moved out of device memory may hold (spill_results="
        '"host"): bytes, or a percentage of the host memory per GPU ("50%"). On spmd they move into one pool of '
        "pinned memory per engine, which grows to this.")
    admission_limit: str | None = Field(
        default=None, description="Prefect global concurrency limit whose slots are GiB of device memory: a flow "
        "run occupies ceil(device_memory_limit / GiB) slots per GPU while its engine runs. Needs device_memory_limit.")
    admission_timeout: _Seconds = Field(
        default=3600.0, description="Seconds a flow run waits for its admission slots before it fails.")
    result_artifacts: bool = Field(
        default=False, description="One artifact per result on the task run that produced it (an API call "
        "each); the result.created event and the flow run's summary artifact carry the same facts.")

    #: What :meth:`session` builds. The block is configuration, below the session in the
    #: import order, so :mod:`prefect_cudf_polars.blocks.session` sets this when it is
    #: imported (``import prefect_cudf_polars.blocks`` does).
    session_type: ClassVar[Callable[[CudfPolarsEngine], SessionProvider]]

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_fields(cls, values: Any) -> Any:
        # Prefect's Block keeps unknown keyword arguments (extra="allow"), so a
        # misspelled field would be dropped silently; refuse it instead.
        for key in values if isinstance(values, dict) else ():
            if key not in cls.model_fields and key not in _PREFECT_BLOCK_KEYS:
                raise ValueError(f"unknown field {key!r}{_did_you_mean(key, cls.model_fields)}; "
                                 f"CudfPolarsEngine's fields are: {', '.join(cls.model_fields)}")
        return values

    @field_validator("spill_device_limit", "device_memory_limit", "host_spill_limit", mode="plain",
                     json_schema_input_type=_MemoryAmount)
    @classmethod
    def _check_limit(cls, value: Any, info: ValidationInfo) -> int | str | None:
        if value is None and cls.model_fields[info.field_name].default is None:  # an optional limit, unset
            return value
        of = {"spill_device_limit": "GPU memory", "host_spill_limit": "the host memory per GPU"}.get(
            info.field_name, "the GPU's memory (on the cpu backend, the machine's)")
        allowed = MEMORY_AMOUNT_RULE.format(of=of)
        if isinstance(value, str) and re.match(MEMORY_AMOUNT_PATTERN, value.strip()):
            value = value.strip()
            amount = None if value.endswith("%") else int(value)  # a number of bytes, or a percentage
        elif isinstance(value, int) and not isinstance(value, bool) and value > 0:
            amount = value
        elif isinstance(value, float):
            hint = f' (for a fraction of {of} write a percentage: "{value * 100:g}%")' if 0 < value <= 1 else ""
            raise ValueError(f"{info.field_name}={value!r} is a float, not {allowed}{hint}")
        else:
            raise ValueError(f"{info.field_name}={value!r} is not {allowed}")
        if amount is None or amount >= MIN_LIMIT_BYTES:
            return value
        share = f'for {amount} % of {of} write "{amount}%"' if amount <= 100 else 'or write a percentage ("80%")'
        raise ValueError(f"{info.field_name}={value!r} is {amount} bytes, too few for a memory limit: give at least "
                         f"1 MiB ({MIN_LIMIT_BYTES:_} bytes), {share}")

    @field_validator("admission_limit", mode="plain",
                     json_schema_input_type=Annotated[str, Field(pattern=LIMIT_NAME_PATTERN)] | None)
    @classmethod
    def _check_limit_name(cls, value: Any) -> str | None:
        if value is None or (isinstance(value, str) and re.match(LIMIT_NAME_PATTERN, value)):
            return value
        raise ValueError(f"admission_limit={value!r} is not {LIMIT_NAME_RULE}")

    @field_validator("executor_options")
    @classmethod
    def _check_executor_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        if bad := sorted(RESERVED_EXECUTOR_KEYS & value.keys()):
            raise ValueError(f"executor_options may not set {bad}: cudf-polars sets them for the backend; remove "
                             "them from executor_options")
        if bad := sorted(NAMED_EXECUTOR_KEYS & value.keys()):
            raise ValueError(f"executor_options may not set {bad}: use the block field of that name")
        fields, source = streaming_executor_fields()
        allowed = sorted(fields - RESERVED_EXECUTOR_KEYS - NAMED_EXECUTOR_KEYS)
        if unknown := sorted(value.keys() - set(allowed)):
            raise ValueError(f"executor_options key {unknown[0]!r} is not a {source} streaming executor option"
                             f"{_did_you_mean(unknown[0], allowed)}; the options allowed here: {', '.join(allowed)}")
        return value

    @model_validator(mode="after")
    def _check_pool_size(self) -> CudfPolarsEngine:
        if self.device_memory_pool_size is not None and self.device_memory_resource not in ("async", "pool"):
            raise ValueError("device_memory_pool_size applies to device_memory_resource 'async' or 'pool', not "
                             f"{self.device_memory_resource!r}: unset the pool size, or pick 'async' or 'pool'")
        limit, pool = self.device_memory_limit, self.device_memory_pool_size
        if isinstance(limit, int) and pool is not None and pool > limit:
            raise ValueError(f"device_memory_pool_size={pool} is over device_memory_limit={limit}: the pool would "
                             "reserve memory the limit does not count; make it at most the limit")
        if self.admission_limit is not None and self.device_memory_limit is None:
            raise ValueError(ADMISSION_NEEDS_LIMIT.format(name=self.admission_limit))
        return self

    @classmethod
    async def aload(cls, name: str, validate: bool = True, client: Any = None) -> CudfPolarsEngine:
        """The async form of :meth:`load` (Prefect's ``Block.aload``): the same parameters, result and errors."""
        with _plain_load_errors(name):
            return await super().aload(name, validate=validate, client=client)

    @classmethod
    def load(cls, name: str, validate: bool = True, client: Any = None) -> Any:
        """
        Load a saved block by its document name (Prefect's ``Block.load``).

        As with any Prefect block, in async code this returns a coroutine (of
        :meth:`aload`) to await.

        Parameters
        ----------
        name : str
            The block document's name (``prefect-cudf-polars save-engine NAME``
            or ``CudfPolarsEngine(...).save(NAME)`` saved it).
        validate, client
            As for Prefect's ``Block.load``.

        Returns
        -------
        CudfPolarsEngine

        Raises
        ------
        BlockNotFoundError
            When the Prefect API has no ``cudf-polars-engine`` block of that
            name (a ``LookupError`` and a ``ValueError``); the message says how
            to save one and how to list those saved.
        ValueError
            When the saved block holds a value its fields refuse (edited in the
            UI or through the API); the message names each field and what it
            allows. Nothing was started.
        """
        with _plain_load_errors(name):
            loaded = super().load(name, validate=validate, client=client)
        if inspect.iscoroutine(loaded):  # Prefect 3.9 in async code: Block.aload's coroutine
            loaded.close()
            return cls.aload(name, validate=validate, client=client)
        return loaded

    def session(self) -> Any:
        """
        Open an engine session for this flow run (use it as a context manager).

        Returns
        -------
        EngineSession
            Not started yet: entering it (``with engine.session() as session:``)
            resolves the backend, starts the engine on the session's owner
            thread and makes the session active for tasks in this flow run.

        Raises
        ------
        NoGPUError
            On entry, when a GPU backend is asked for and no usable GPU or RAPIDS
            stack is present (and ``cpu_fallback`` is False).
        SessionError
            On entry, when a session is already active in this flow run.
        """
        return self.session_type(self)


@contextlib.contextmanager
def _plain_load_errors(name: str) -> Iterator[None]:
    """
    Prefect's load errors made plain: "Unable to find block document" as a :class:`BlockNotFoundError`, a saved
    value the fields refuse (Prefect's "failed validation", caused by pydantic's error) as a ``ValueError``
    naming each field and what it allows; other errors as they are.
    """
    try:
        yield
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc.__cause__, ValidationError):
            raise ValueError(f"The saved cudf-polars engine block {name!r} holds a value its fields do not allow: "
                             f"{invalid_fields(exc.__cause__)}. Fix it in the Prefect UI (Blocks, {name!r}) or save "
                             f"it again: `CudfPolarsEngine(...).save({name!r}, overwrite=True)`.") from None
        if isinstance(exc, ValueError) and "Unable to find block document" in str(exc):
            raise BlockNotFoundError(
                f"No saved cudf-polars engine block named {name!r} at this Prefect API. Save one with "
                f"{SAVE_ENGINE.format(name=name, backend='auto')} (or `CudfPolarsEngine(backend=...).save({name!r})`), "
                "or list the saved ones with `prefect block ls`.") from None
        raise


def load_engine_block(name: str) -> CudfPolarsEngine:
    """
    Load a saved :class:`CudfPolarsEngine` block by name, from sync or async code alike.

    For code that must have the block itself, such as a task runner entered by
    an async flow run (where :meth:`CudfPolarsEngine.load` returns a coroutine).

    Parameters
    ----------
    name : str
        The block document's name.

    Returns
    -------
    CudfPolarsEngine
        The block itself, never a coroutine.

    Raises
    ------
    BlockNotFoundError
        As for :meth:`CudfPolarsEngine.load`.
    """
    from prefect.utilities.asyncutils import run_coro_as_sync

    return run_coro_as_sync(CudfPolarsEngine.aload(name))
