"""README.md and the guides in docs/: every repository path they name exists, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
TOP = ("blocks", "tasks", "flows", "docs", "tests", "benchmarks", "prefect_cudf_polars")
# A path that starts at one of the repository's top-level folders, not inside another path
# or a URL (`prefect/blocks/core.py` names Prefect's file, not ours).
PATH = re.compile(rf"(?<![\w./~-])(?:{'|'.join(TOP)})/[\w./-]*[\w/]")


def named_paths(text: str) -> list[str]:
    """The repository paths a Markdown text names, in order, each once."""
    return list(dict.fromkeys(m.group(0) for m in PATH.finditer(text)))


def exists(path: str) -> bool:
    """A file or folder, or a module path with a name after it (`blocks/backends/cpu.held_partitions`)."""
    if (ROOT / path).exists():
        return True
    stem, dot, _ = path.partition(".")
    return bool(dot) and (ROOT / f"{stem}.py").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_doc_names_exists(doc):
    missing = [p for p in named_paths(doc.read_text()) if not exists(p)]
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def test_the_path_check_sees_paths_and_refuses_missing_ones():
    text = (
        "see `blocks/backends/dask/lease.py`, `tests/storage/`, `blocks/backends/cpu.held_partitions()`,"
        " docs/storage.md, `blocks/dask_lease.py` and "
        "https://github.com/PrefectHQ/prefect/blob/main/src/prefect/blocks/core.py"
    )
    found = named_paths(text)
    assert found == [
        "blocks/backends/dask/lease.py",
        "tests/storage/",
        "blocks/backends/cpu.held_partitions",
        "docs/storage.md",
        "blocks/dask_lease.py",
    ]
    assert [p for p in found if not exists(p)] == ["blocks/dask_lease.py"]


def test_the_readme_is_a_manual_of_at_most_12_kb():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size} bytes; move detail into docs/ and link it"
