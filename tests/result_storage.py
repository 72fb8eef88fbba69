"""Result storage for tests: a LocalFileSystem block saved to the test API, and what it holds."""

from __future__ import annotations

import uuid
from pathlib import Path

from prefect.filesystems import LocalFileSystem


def saved_storage(path) -> LocalFileSystem:
    """A LocalFileSystem result storage block saved server-side (Prefect requires it)."""
    block = LocalFileSystem(basepath=str(path))
    block.save(f"results-{uuid.uuid4().hex[:12]}")
    return block


def stored_files(path) -> list[Path]:
    """Every file written under ``path`` (none when the folder was never created)."""
    folder = Path(path)
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []
