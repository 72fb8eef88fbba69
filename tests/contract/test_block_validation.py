"""
The engine block refuses bad configuration when it is built, naming the field and what it allows.

A value cudf-polars or rapidsmpf would refuse (or silently misread) at 06:00 on the GPU
machine is a ``pydantic.ValidationError`` on the laptop, where the block is written.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefect_cudf_polars.blocks import CudfPolarsEngine


@pytest.mark.parametrize("limit", ["120%", "0%", "100.5%", "0"])
def test_spill_device_limit_outside_what_rapidsmpf_can_use_is_refused(limit):
    with pytest.raises(ValidationError, match=r"(?s)spill_device_limit.*100%") as info:
        CudfPolarsEngine(spill_device_limit=limit)
    assert repr(limit) in str(info.value)


@pytest.mark.parametrize("limit", ["80%", "100%", "0.5%", "60000000000", 60_000_000_000])
def test_spill_device_limit_percentages_and_bytes_are_kept(limit):
    kept = CudfPolarsEngine(spill_device_limit=limit).spill_device_limit
    assert kept == limit and type(kept) is type(limit)


@pytest.mark.parametrize(
    ("limit", "said"),
    [
        (0.8, r'spill_device_limit=0\.8 is a float.*write a percentage: "80%"'),
        (6e10, r"spill_device_limit=60000000000\.0 is a float, not a percentage"),
        (-5, r"spill_device_limit=-5 is not a percentage of GPU memory"),
        (0, r"spill_device_limit=0 is not a percentage"),
        (True, r"spill_device_limit=True is not a percentage"),
        ("8GB", r"spill_device_limit='8GB' is not a percentage.*60_000_000_000"),
    ],
)
def test_spill_device_limit_that_is_not_bytes_or_a_percentage_is_refused(limit, said):
    with pytest.raises(ValidationError, match=rf"(?s){said}"):
        CudfPolarsEngine(spill_device_limit=limit)


def test_spill_device_limit_in_bytes_reaches_cudf_polars_as_its_digits():
    pytest.importorskip("cudf_polars", reason="the engine options are cudf-polars' own")
    
    options = CudfPolarsEngine(backend="cpu", spill_device_limit=60_000_000_000).engine_kwargs()
    assert options["rapidsmpf_options"].get_strings()["spill_device_limit"] == "60000000000"


def test_an_unknown_executor_option_names_the_key_and_the_options_allowed():
    with pytest.raises(ValidationError, match=r"(?s)executor_options.*'nonsense'") as info:
        CudfPolarsEngine(executor_options={"nonsense": 1})
    # What is allowed: cudf-polars 26.10's streaming executor options.
    message = str(info.value)
    for allowed in ("broadcast_limit", "fallback_mode", "max_concurrent_io_tasks"):
        assert allowed in message


@pytest.mark.parametrize(
    "options",
    [{"broadcast_limit": 1_000_000}, {"fallback_mode": "raise"}, {"dynamic_planning": None}],
)
def test_cudf_polars_executor_options_are_accepted(options):
    assert CudfPolarsEngine(executor_options=options).executor_options == options


def test_a_misspelled_field_is_refused_with_the_field_it_resembles():
    with pytest.raises(ValidationError, match=r"(?s)target_partiton_size.*target_partition_size"):
        CudfPolarsEngine(target_partiton_size=5)


def test_a_saved_block_still_loads_with_the_checks_in_place():
    CudfPolarsEngine(backend="cpu", spill_device_limit="75%",
                     executor_options={"fallback_mode": "warn"}).save(
        "contract-validation-roundtrip", overwrite=True
    )
    loaded = CudfPolarsEngine.load("contract-validation-roundtrip")
    assert loaded.spill_device_limit == "75%"
    assert loaded.executor_options == {"fallback_mode": "warn"}


def test_the_fixed_executor_option_names_are_cudf_polars_own():
    """Without cudf-polars the block checks keys against a list: the same names cudf-polars 26.10 has."""
    import dataclasses

    from cudf_polars_import import cudf_polars_or_skip
    from prefect_cudf_polars.blocks.engine_options import STREAMING_EXECUTOR_FIELDS

    cudf_polars_or_skip()
    from cudf_polars.utils.config import StreamingExecutor

    assert STREAMING_EXECUTOR_FIELDS == {f.name for f in dataclasses.fields(StreamingExecutor) if f.init}


def test_without_cudf_polars_executor_options_are_checked_against_the_26_10_names(monkeypatch):
    import sys

    from prefect_cudf_polars.blocks import engine_options as executor_options

    monkeypatch.setitem(sys.modules, "cudf_polars", None)  # import cudf_polars raises ImportError
    executor_options.streaming_executor_fields.cache_clear()
    try:
        with pytest.raises(ValidationError, match=r"'broadcst_limit' is not a cudf-polars 26.10 streaming executor option \(did you mean 'broadcast_limit'\?\)"):
            CudfPolarsEngine(executor_options={"broadcst_limit": 1})
        assert CudfPolarsEngine(executor_options={"broadcast_limit": 1}).executor_options == {"broadcast_limit": 1}
    finally:
        executor_options.streaming_executor_fields.cache_clear()


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"device_memory_limit": 0.4}, r'device_memory_limit=0\.4 is a float.*write a percentage: "40%"'),
        ({"device_memory_limit": "40GB"}, r"device_memory_limit='40GB' is not a percentage"),
        ({"device_memory_limit": "0%"}, r"device_memory_limit='0%' is not a percentage"),
        ({"device_memory_limit": "80"}, r"device_memory_limit='80' is 80 bytes, too few for a memory limit: give at "
                                        r"least 1 MiB .*write \"80%\""),
        ({"host_spill_limit": "50"}, r"host_spill_limit='50' is 50 bytes, too few.*host memory per GPU write \"50%\""),
        ({"spill_device_limit": 500}, r"spill_device_limit=500 is 500 bytes, too few.*or write a percentage"),
        ({"spill_results": "disk"}, r"spill_results.*'off' or 'host'"),
        ({"host_spill_limit": 0.5}, r'host_spill_limit=0\.5 is a float, not a percentage of the host memory per GPU.*'
                                    r'write a percentage: "50%"'),
        ({"host_spill_limit": None}, r"host_spill_limit=None is not a percentage of the host memory per GPU"),
        ({"admission_limit": "gpu-memory"}, r"admission_limit='gpu-memory' needs device_memory_limit"),
        ({"admission_limit": "gpu-memory", "device_memory_limit": 8 << 30, "admission_timeout": 0},
         r"admission_timeout.*greater than 0"),
    ],
)
def test_memory_fields_refuse_what_they_do_not_allow(fields, said):
    with pytest.raises(ValidationError, match=rf"(?s){said}"):
        CudfPolarsEngine(**fields)


def test_memory_fields_keep_what_they_allow():
    block = CudfPolarsEngine(device_memory_limit=" 40% ", spill_results="host", admission_limit="gpu-memory")
    assert (block.device_memory_limit, block.spill_results, block.admission_limit) == ("40%", "host", "gpu-memory")
    assert CudfPolarsEngine().spill_results == "off" and CudfPolarsEngine().device_memory_limit is None
    assert CudfPolarsEngine().host_spill_limit_bytes(8_000) == 4_000  # "50%" of the host memory per GPU
    assert CudfPolarsEngine(host_spill_limit=3_000_000).host_spill_limit_bytes(None) == 3_000_000


def test_a_pool_larger_than_the_device_memory_limit_is_refused():
    with pytest.raises(ValidationError, match=r"device_memory_pool_size=2000000000 is over device_memory_limit=1000000000"):
        CudfPolarsEngine(device_memory_limit=1_000_000_000, device_memory_pool_size=2_000_000_000)


def test_with_a_device_memory_limit_the_spill_limit_is_a_share_of_it_in_bytes():
    pytest.importorskip("cudf_polars", reason="the engine options are cudf-polars' own")

    block = CudfPolarsEngine(backend="cpu", device_memory_limit=8 << 30, spill_device_limit="50%")
    options = block.engine_kwargs(8 << 30, device_total=140 << 30, host_total=1000 << 30)
    strings = options["rapidsmpf_options"].get_strings()
    assert strings["spill_device_limit"] == str(4 << 30)
    assert strings["pinned_max_pool_size"] == str(int(0.8 * (1000 << 30) * 8 / 140))
    resource = options["engine_options"]["memory_resource_config"]
    assert resource.qualname == "rmm.mr.LimitingResourceAdaptor"
    assert resource.options == {"upstream_mr": {"qualname": "rmm.mr.CudaAsyncMemoryResource",
                                                "options": {"release_threshold": 8 << 30}},
                                "allocation_limit": 8 << 30}


@pytest.mark.parametrize("name", ["", "a/b", "x%y", " gpu-memory", "gpu-memory "])
def test_an_admission_limit_that_is_not_a_concurrency_limit_name_is_refused(name):
    with pytest.raises(ValidationError, match=r"is not a Prefect global concurrency limit's name"):
        CudfPolarsEngine(admission_limit=name, device_memory_limit="40%")


@pytest.mark.parametrize("field", ["admission_timeout", "teardown_timeout", "dask_connect_timeout"])
def test_a_timeout_that_is_not_finite_is_refused(field):
    # JSON has no infinity: a saved block would hold null, which no load accepts.
    with pytest.raises(ValidationError, match=rf"(?s){field}.*finite number"):
        CudfPolarsEngine(**{field: float("inf")})
