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
            exec(compile(code, str(README), "exec"), namespace)
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
