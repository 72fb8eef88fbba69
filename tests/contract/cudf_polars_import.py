"""Whether cudf-polars can be imported here: its import needs the CUDA wheels, not a GPU."""

from __future__ import annotations

import pytest


def cudf_polars_or_skip() -> None:
    """Skip the calling test when ``import cudf_polars`` fails here (saying why)."""
    try:
        import cudf_polars  # noqa: F401
    except Exception as exc:  # the CUDA wheels are missing or cannot load here
        pytest.skip(f"cudf-polars cannot be imported here ({type(exc).__name__}: {exc})")
