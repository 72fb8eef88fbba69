"""The engine block: fields, validation, save/load through the real Prefect API."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prefect_cudf_polars.blocks import CudfPolarsEngine


def test_defaults_match_the_contract():
    block = CudfPolarsEngine()
    assert block.backend == "auto"
    assert block.cpu_fallback is False
    assert block.raise_on_fail is True
    assert block.executor_options == {}
    assert CudfPolarsEngine.get_block_type_slug() == "cudf-polars-engine"


def test_saves_and_loads_by_name_with_its_fields():
    block = CudfPolarsEngine(
        backend="spmd",
        target_partition_size=16_000_000,
        spill_device_limit="70%",
        device_memory_resource="pool",
        device_memory_pool_size=2**30,
        executor_options={"broadcast_limit": 1_000_000},
    )
    block.save("test-engine-roundtrip", overwrite=True)
    loaded = CudfPolarsEngine.load("test-engine-roundtrip")
    assert loaded.backend == "spmd"
    assert loaded.target_partition_size == 16_000_000
    assert loaded.spill_device_limit == "70%"
    assert loaded.device_memory_pool_size == 2**30
    assert loaded.executor_options == {"broadcast_limit": 1_000_000}


def test_block_schema_lists_editable_fields_for_the_ui():
    schema = CudfPolarsEngine.model_json_schema()
    for field in ("backend", "cpu_fallback", "raise_on_fail", "target_partition_size",
                  "spill_device_limit", "device_memory_resource", "executor_options"):
        assert field in schema["properties"]
    assert set(schema["properties"]["backend"]["enum"]) == {"auto", "spmd", "dask", "ray", "cpu"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"spill_device_limit": "lots"}, "spill_device_limit='lots'"),
        ({"executor_options": {"cluster": "spmd"}}, "cudf-polars sets them"),
        ({"executor_options": {"target_partition_size": 1}}, "use the block field"),
        ({"target_partition_size": 0}, "greater than 0"),
        ({"backend": "gpu"}, "backend"),
        ({"device_memory_resource": "managed", "device_memory_pool_size": 10}, "applies to"),
    ],
)
def test_invalid_options_are_refused_with_a_clear_error(fields, message):
    with pytest.raises(ValidationError, match=message):
        CudfPolarsEngine(**fields)


def test_memory_resource_config_maps_names_to_rmm():
    assert CudfPolarsEngine().memory_resource_config() is None
    assert CudfPolarsEngine(device_memory_resource="pool", device_memory_pool_size=256).memory_resource_config() == {
        "qualname": "rmm.mr.PoolMemoryResource",
        "options": {"upstream_mr": {"qualname": "rmm.mr.CudaMemoryResource"}, "initial_pool_size": 256},
    }
    assert CudfPolarsEngine(device_memory_resource="managed").memory_resource_config() == {
        "qualname": "rmm.mr.ManagedMemoryResource",
        "options": {},
    }


def test_live_state_never_enters_the_block(cpu_block):
    with cpu_block.session() as session:
        assert session.backend == "cpu"
        dumped = cpu_block.model_dump()
    assert "session" not in dumped and set(dumped) >= {"backend", "executor_options"}


def test_an_unknown_saved_block_name_says_how_to_save_one(orders):
    import polars as pl
    from prefect import flow

    from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
    from prefect_cudf_polars.blocks.engine_block import load_engine_block
    from prefect_cudf_polars.tasks import collect, execute

    with pytest.raises(LookupError, match=r"No saved cudf-polars engine block named 'nosuch'.*save-engine nosuch"):
        load_engine_block("nosuch")

    @flow(task_runner=CudfPolarsTaskRunner(engine="nosuch"))
    def misnamed():
        return collect(execute(pl.scan_parquet(orders)))

    with pytest.raises(LookupError, match="prefect block ls"):
        misnamed()
    CudfPolarsEngine(backend="cpu").save("now-saved", overwrite=True)
    assert load_engine_block("now-saved").backend == "cpu"
