"""
The ``cpu`` backend's GPU-support check: would cudf-polars run this plan on the GPU?

cudf-polars 26.10 decides before it runs anything: it translates polars'
optimized plan into its own IR (``cudf_polars.Translator``) and records every
node or expression it has no GPU implementation for
(``Translator.unsupported_operations_error()``). ``engine.execute`` raises that
error whatever ``raise_on_fail`` is (``execute_persisted_query`` calls
``raise_for_translation_errors``); ``collect`` raises it with
``raise_on_fail=True`` and otherwise lets polars' CPU engine run the query
(``cudf_polars.callback.execute_with_cudf``). The ``cpu`` backend makes the same
decision at the same point, so a flow developed on a laptop fails there, with
cudf-polars' own reason, rather than on the GPU machine.

Translation needs no GPU, only ``import cudf_polars``, which needs the CUDA
wheels cudf-polars depends on (libcudf, libnvJitLink, libnvrtc) in this
Python environment. The configuration is fixed so that no device is touched:
cudf-polars 26.10 reads the GPU's memory size through NVML for its streaming
executor unless ``min_device_size`` is given, so a nominal size is given (it
only feeds partition-size defaults, which translation does not use). The
block's executor options are passed as the GPU session passes them.

Where the import or a trial translation fails, nothing is checked, and
:attr:`GPUSupportCheck.status` (in the session's start line) says why. Every
use of cudf-polars here was checked against cudf-polars 26.10.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import polars as pl

from prefect_cudf_polars.blocks.backends.compat import plan_visitor, with_optimizations
from prefect_cudf_polars.blocks.backends.engine_errors import error_text
from prefect_cudf_polars.blocks.engine_block import CudfPolarsEngine
from prefect_cudf_polars.blocks.errors import INSTALL


logger = logging.getLogger("prefect_cudf_polars.gpu_support")

#: GPU memory size (bytes) given to cudf-polars' configuration in place of an NVML reading.
NOMINAL_DEVICE_BYTES = 80 * 2**30

REFUSAL_NOTE = ("\nRefused on the cpu backend before anything ran: cudf-polars {version} checked this plan as the GPU "
                "engines do, and they would refuse it. Rewrite the step it names with operations cudf-polars runs on "
                "the GPU. Only `collect` can fall back: raise_on_fail=False on the engine block lets polars' CPU engine "
                "run such a collect on every backend, while `execute` and GPU tasks always refuse it.")


@dataclasses.dataclass
class GPUSupportCheck:
    """
    Checks plans the way cudf-polars 26.10 does, where cudf-polars can be imported.

    Build it with :meth:`open`.

    Attributes
    ----------
    status : str
        ``"GPU support checked (cudf-polars 26.10.02)"``, or
        ``"GPU support not checked: <why>"``.
    version : str or None
        The cudf-polars version checking, or ``None`` when nothing is checked.
    """

    status: str
    version: str | None = None
    translator: Any = None
    engine: pl.GPUEngine | None = None
    _warned: bool = False

    @classmethod
    def open(cls, block: CudfPolarsEngine) -> GPUSupportCheck:
        """
        Import cudf-polars and translate a trial plan; never raises.

        The import runs on each call (Python caches it), so a process where
        ``cudf_polars`` cannot be imported is told apart from one where it can.

        Parameters
        ----------
        block : CudfPolarsEngine

        Returns
        -------
        GPUSupportCheck
            Checking, or not checking with the reason in :attr:`status`.
        """
        try:
            from cudf_polars import Translator, __version__ as version
        except Exception as exc:  # a missing wheel: ImportError; a broken one: OSError and others
            missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").startswith("cudf_polars")
            why = ("cudf-polars is not installed here" if missing else
                   f"cudf-polars cannot be imported here ({type(exc).__name__}: {exc})")
            return cls(f"GPU support not checked: {why}; install the check extra ({INSTALL.format(extra='check')}) "
                       "to refuse on the CPU what the GPU would refuse")
        try:
            # The streaming executor with the block's options, and a nominal GPU memory size unless the block sets one.
            options = {"min_device_size": NOMINAL_DEVICE_BYTES, **block.executor_settings()}
            engine = pl.GPUEngine(raise_on_fail=True, executor="streaming", executor_options=options)
            Translator(plan_visitor(pl.LazyFrame({"a": [1]}).select(pl.col("a") + 1)), engine).translate_ir()
        except Exception as exc:
            return cls(f"GPU support not checked: cudf-polars {version} cannot translate plans "
                       f"here with this block's options ({type(exc).__name__}: {exc})")
        return cls(f"GPU support checked (cudf-polars {version})", version=version, translator=Translator, engine=engine)

    def check(self, lf: pl.LazyFrame, flags: pl.QueryOptFlags) -> None:
        """
        Refuse ``lf`` when cudf-polars would not run it on the GPU.

        Parameters
        ----------
        lf : polars.LazyFrame
            The query the ``cpu`` engine is about to run.
        flags : polars.QueryOptFlags
            The optimizations it runs with (the GPU engines plan with the same).

        Raises
        ------
        NotImplementedError
            cudf-polars' own "Query execution with GPU not possible:
            unsupported operations" message, naming each unsupported step, and
            what to do. Nothing has run. A plan the check itself cannot
            translate runs unchecked, with a warning logged once per session.
        """
        if self.translator is None:  # nothing is checked
            return
        try:
            # cudf-polars 26.10 reads the plan as engine.execute does: Translator(lf._ldf.visit(), engine).
            translator = self.translator(plan_visitor(with_optimizations(lf, flags)), self.engine)
            translator.translate_ir()
            refusal = translator.unsupported_operations_error()
        except Exception as exc:
            if not self._warned:
                self._warned = True
                logger.warning("cudf-polars %s could not check a query for GPU support (%s); the cpu backend runs "
                               "such queries unchecked.", self.version, error_text(exc))
            return
        if refusal is not None:
            raise NotImplementedError(refusal.args[0] + REFUSAL_NOTE.format(version=self.version))
