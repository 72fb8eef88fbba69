"""
Engine errors as users see them: cudf-polars' one-error groups unwrapped, and a
failed call's frames holding no engine data (see ``blocks/engine_errors.py``).
"""

from __future__ import annotations

import gc
import weakref

import polars as pl
import pytest

from prefect_cudf_polars.blocks.backends.engine_errors import raise_engine_error


class Chunk:
    """Stands for a device buffer a failed actor held in a local variable."""


def _fail_holding(probe: list, exc: BaseException) -> None:
    chunk = Chunk()  # what the failed frame holds
    probe.append(weakref.ref(chunk))
    raise exc


def _caught(exc: BaseException, probe: list | None = None) -> BaseException:
    try:
        try:
            _fail_holding(probe if probe is not None else [], exc)
        except BaseException as raised:  # noqa: BLE001
            raise_engine_error(raised)
    except BaseException as final:  # noqa: BLE001
        return final
    raise AssertionError("raise_engine_error returned")


def test_a_group_of_one_error_is_unwrapped():
    # cudf-polars 26.10's shape for a parquet file deleted before a re-scan.
    missing = FileNotFoundError(2, "No such file or directory")
    group = ExceptionGroup("unhandled errors in a TaskGroup", [missing])
    final = _caught(group)
    assert final is missing and final.__suppress_context__
    assert "No such file" in str(final)


def test_a_group_of_several_errors_stays_a_group():
    group = ExceptionGroup("two ranks failed", [ValueError("a"), KeyError("b")])
    assert _caught(group) is group


def test_a_held_error_keeps_no_local_variables_of_the_failed_call_alive():
    probe: list = []
    final = _caught(ExceptionGroup("x", [RuntimeError("boom")]), probe)
    gc.collect()
    assert probe[0]() is None, "the failed frame's local still holds the chunk"
    assert isinstance(final, RuntimeError)
    # The traceback still says where it failed.
    assert final.__traceback__ is not None


def test_a_session_error_on_the_cpu_backend_holds_no_udf_locals():
    from prefect_cudf_polars.blocks import CudfPolarsEngine

    probe: dict = {}

    def fails(df: pl.DataFrame) -> pl.DataFrame:
        chunk = Chunk()
        probe["ref"] = weakref.ref(chunk)
        raise ValueError("the query failed")

    # A Python function cudf-polars does not run on the GPU: raise_on_fail=False lets
    # polars' CPU engine run this collect (the GPU-support check would refuse it).
    with CudfPolarsEngine(backend="cpu", raise_on_fail=False).session() as session:
        with pytest.raises(ValueError, match="the query failed") as info:
            session.collect(pl.LazyFrame({"a": [1]}).map_batches(fails))
        gc.collect()
        assert info.value is not None  # the error is still held here
        assert probe["ref"]() is None
