"""The package as a Prefect collection: entry point, block type and serializer registered."""

from __future__ import annotations

from importlib.metadata import entry_points


def test_prefect_loads_the_collection_through_its_entry_point():
    from prefect.plugins import load_prefect_collections

    names = [ep.name for ep in entry_points(group="prefect.collections")]
    assert "prefect_cudf_polars" in names
    loaded = load_prefect_collections()
    assert "prefect_cudf_polars" in loaded


def test_block_type_and_serializer_are_registered_by_name():
    from prefect.blocks.core import Block
    from prefect.serializers import Serializer
    from prefect.utilities.dispatch import lookup_type

    import prefect_cudf_polars  # noqa: F401

    assert lookup_type(Block, "cudf-polars-engine").__name__ == "CudfPolarsEngine"
    assert type(Serializer(type="cudf-polars-gpu")).__name__ == "GPUResultSerializer"


def test_the_top_level_exports_the_public_api_of_the_subpackages():
    import prefect_cudf_polars
    from prefect_cudf_polars import blocks, tasks
    from prefect_cudf_polars import (  # noqa: F401 (the import itself is checked)
        CudfPolarsEngine,
        CudfPolarsTaskRunner,
        GPUResult,
        collect,
        execute,
        gpu_task,
        tee,
    )

    assert sorted(prefect_cudf_polars.__all__) == [
        "CudfPolarsEngine", "CudfPolarsTaskRunner", "GPUResult", "collect", "execute", "gpu_task", "tee",
    ]
    # The same objects as the subpackage paths, not copies.
    for name in prefect_cudf_polars.__all__:
        home = blocks if name in blocks.__all__ else tasks
        assert getattr(prefect_cudf_polars, name) is getattr(home, name), name
