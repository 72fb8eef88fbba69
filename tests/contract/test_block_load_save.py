"""
Saving and loading engine blocks as the README shows it, against a real Prefect API.

The README's examples run as written, twice (a second save of the same name
overwrites it: ``overwrite=True``, Prefect's convention), and loading a name
that was never saved says how to save one and how to list those saved.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from prefect_cudf_polars.blocks import CudfPolarsEngine

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_python_blocks() -> list[str]:
    """The README's fenced ```python blocks, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_save_example_runs_twice_as_written():
    blocks = readme_python_blocks()
    saving = [i for i, code in enumerate(blocks) if "CudfPolarsEngine(" in code and ".save(" in code]
    assert saving, "the README shows no CudfPolarsEngine(...).save(...) example"
    # The blocks up to the save example, run in order in one namespace (as a reader would).
    for _ in range(2):
        namespace: dict = {}
        for code in blocks[: saving[0] + 1]:
            # Named as no file: Prefect 3.9.1 reads a task's source with inspect.getsource, which would read
            # README.md's lines as Python (it catches OSError, not tokenize's TokenError).
            exec(compile(code, "<README.md example>", "exec"), namespace)
    saved = re.search(r"\.save\(\s*\"([^\"]+)\"", blocks[saving[0]]).group(1)
    assert isinstance(CudfPolarsEngine.load(saved), CudfPolarsEngine)


def test_loading_an_unknown_name_says_how_to_save_one_and_list_them():
    with pytest.raises(ValueError) as info:
        CudfPolarsEngine.load("no-such-block")
    message = str(info.value)
    assert "'no-such-block'" in message
    assert re.search(r"CudfPolarsEngine\(.*\)\.save\(['\"]no-such-block['\"]", message), message
    assert "prefect block ls" in message


def test_loading_an_unknown_name_from_async_code_says_the_same():
    async def load():
        return await CudfPolarsEngine.aload("no-such-block")

    with pytest.raises(ValueError, match=r"(?s)'no-such-block'.*prefect block ls"):
        asyncio.run(load())


def test_an_unknown_name_is_a_lookup_error_and_prefects_value_error():
    from prefect_cudf_polars.blocks import BlockNotFoundError

    with pytest.raises(BlockNotFoundError) as info:
        CudfPolarsEngine.load("no-such-block")
    assert isinstance(info.value, LookupError) and isinstance(info.value, ValueError)


def test_load_in_async_code_is_awaited_as_prefect_blocks_are():
    CudfPolarsEngine(backend="cpu").save("contract-async-load", overwrite=True)

    async def load(name):
        return await CudfPolarsEngine.load(name)

    assert asyncio.run(load("contract-async-load")).backend == "cpu"
    with pytest.raises(ValueError, match=r"(?s)'no-such-block'.*prefect block ls"):
        asyncio.run(load("no-such-block"))


def test_an_async_flow_runs_on_a_task_runner_given_a_saved_blocks_name(orders):
    import polars as pl
    from prefect import flow

    from prefect_cudf_polars.blocks import CudfPolarsTaskRunner
    from prefect_cudf_polars.tasks import collect, execute

    CudfPolarsEngine(backend="cpu").save("contract-async-runner", overwrite=True)

    @flow(task_runner=CudfPolarsTaskRunner(engine="contract-async-runner"))
    async def pipeline():
        return collect(execute(pl.scan_parquet(orders))).height

    assert asyncio.run(pipeline()) == 1000
