"""
``prefect-cudf-polars``: save an engine block and deploy the project's flows.

Commands
--------
``prefect-cudf-polars save-engine NAME --backend spmd``
    Save a ``cudf-polars-engine`` block (there is no Prefect CLI command that
    saves a block with field values).
``prefect-cudf-polars deploy [--engine-block gpu] [--backend spmd] [--pool gpu-pool]``
    Run, in order and printing each one, the commands of the README's "Deploy"
    section: register the block type, save the engine block, create the process
    work pool with a concurrency limit of 1, and ``prefect --no-prompt deploy --all``
    with the project's ``prefect.yaml``. ``make deploy`` calls it.

Both talk to the Prefect API that ``PREFECT_API_URL`` names (a running
``prefect server start``, or Prefect Cloud): a worker cannot reach the
temporary API Prefect starts when none is configured, so ``deploy`` refuses to
run without one.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: The work pool the project's prefect.yaml deploys to.
DEFAULT_POOL = "gpu-pool"
#: The engine block name the project's prefect.yaml passes to the main job.
DEFAULT_ENGINE_BLOCK = "gpu"


class DeployError(RuntimeError):
    """A deploy step failed or cannot run; the message says what to do."""


def api_url() -> str | None:
    """The configured ``PREFECT_API_URL`` (environment or active profile), or ``None``."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def save_engine(name: str, *, backend: str, cpu_fallback: bool = False) -> str:
    """
    Save a ``cudf-polars-engine`` block under ``name`` (overwriting one of that name).

    Parameters
    ----------
    name
        Block document name (what ``CudfPolarsEngine.load(name)`` and the
        deployment's ``engine_block`` parameter use).
    backend
        ``"auto"``, ``"spmd"``, ``"dask"``, ``"ray"`` or ``"cpu"``.
    cpu_fallback
        Use the ``cpu`` backend with a warning where no GPU is usable.

    Returns
    -------
    str
        The saved block's id.

    Raises
    ------
    pydantic.ValidationError
        If ``backend`` is not one of the names above.
    """
    from prefect_cudf_polars.blocks import CudfPolarsEngine

    return str(CudfPolarsEngine(backend=backend, cpu_fallback=cpu_fallback).save(name, overwrite=True))


def deploy_commands(*, engine_block: str, backend: str, pool: str,
                    cpu_fallback: bool = False) -> list[list[str]]:
    """
    The commands ``deploy`` runs, in order, as the README writes them.

    Returns
    -------
    list of list of str
        Each starts with ``prefect`` or ``prefect-cudf-polars``; :func:`to_argv`
        turns one into the argument list this Python runs.
    """
    return [
        ["prefect", "block", "register", "-m", "prefect_cudf_polars.blocks"],
        ["prefect-cudf-polars", "save-engine", engine_block, "--backend", backend]
        + (["--cpu-fallback"] if cpu_fallback else []),
        ["prefect", "work-pool", "create", pool, "--type", "process", "--overwrite"],
        ["prefect", "work-pool", "set-concurrency-limit", pool, "1"],
        ["prefect", "--no-prompt", "deploy", "--all"],
    ]


def to_argv(command: list[str]) -> list[str]:
    """Run a README command with this Python (``python -m prefect`` / ``-m prefect_cudf_polars.cli``)."""
    module = {"prefect": "prefect", "prefect-cudf-polars": "prefect_cudf_polars.cli"}[command[0]]
    return [sys.executable, "-m", module, *command[1:]]


def deploy(*, engine_block: str = DEFAULT_ENGINE_BLOCK, backend: str = "spmd", pool: str = DEFAULT_POOL,
           project_dir: str | Path = ".", cpu_fallback: bool = False) -> None:
    """
    Register the block type, save the engine block, create the pool, deploy every flow.

    Parameters
    ----------
    engine_block, backend, cpu_fallback
        The engine block to save (see :func:`save_engine`).
    pool
        The process work pool (created or overwritten, concurrency limit 1: one
        flow run at a time per GPU machine). It must match ``prefect.yaml``.
    project_dir
        Folder holding ``prefect.yaml`` (the checkout's root).

    Raises
    ------
    DeployError
        If no ``PREFECT_API_URL`` is configured, ``prefect.yaml`` is missing, or
        a command fails (its exit status and command line are named).
    """
    root = Path(project_dir).resolve()
    if not (root / "prefect.yaml").is_file():
        raise DeployError(f"No prefect.yaml in {root}. Run this from the prefect-cudf-polars checkout's "
                          "root (or pass --project-dir).")
    if api_url() is None:
        raise DeployError(
            "PREFECT_API_URL is not set, so deployments would go to a temporary API no "
            "worker can reach. Start a server (`prefect server start`) and point at it: "
            "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`."
        )
    for command in deploy_commands(engine_block=engine_block, backend=backend, pool=pool,
                                   cpu_fallback=cpu_fallback):
        shown = shlex.join(command)
        print(f"$ {shown}", flush=True)
        # prefect.yaml's pull step names "{{ $PWD }}": the checkout's root.
        done = subprocess.run(to_argv(command), cwd=root, env={**os.environ, "PWD": str(root)})
        if done.returncode != 0:
            raise DeployError(f"`{shown}` failed with exit status {done.returncode} (its output is above); "
                              "fix that and run the deploy again (every step can be repeated).")


#: What ``prefect-cudf-polars --help`` prints above the commands (plain text).
DESCRIPTION = "Save a cudf-polars engine block and deploy this project's flows to Prefect."
#: What ``prefect-cudf-polars --help`` prints below the commands.
EPILOG = """\
Both commands talk to the Prefect API that PREFECT_API_URL names (a running
"prefect server start", or Prefect Cloud). Without one, save-engine saves the
block to the temporary local API Prefect starts (where flows run without a
server find it); deploy refuses to run: a worker cannot reach that API.

examples:
  prefect-cudf-polars save-engine gpu --backend spmd
  prefect-cudf-polars deploy --engine-block gpu --backend spmd
"""
BACKENDS = ["auto", "spmd", "dask", "ray", "cpu"]
BACKEND_HELP = (
    "auto: spmd with one visible GPU, dask with several; spmd: one GPU, in the flow "
    "run's process; dask: a local Dask cluster the flow run starts, one worker per GPU; "
    "ray: a local Ray the flow run starts, one actor per GPU; cpu: polars' CPU engine, "
    "no GPU (default: %(default)s)"
)
CPU_FALLBACK_HELP = "with no usable GPU, warn and use the cpu backend instead of failing"


def build_parser() -> argparse.ArgumentParser:
    """The ``prefect-cudf-polars`` argument parser (its help is plain text)."""
    parser = argparse.ArgumentParser(prog="prefect-cudf-polars", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    save = sub.add_parser(
        "save-engine", help="save a cudf-polars-engine block (overwrites one of that name)",
        description="Save a cudf-polars-engine block under NAME, overwriting one of that "
        "name. Flows load it with CudfPolarsEngine.load(NAME).",
    )
    save.add_argument("name", metavar="NAME", help="the block's name, e.g. gpu")
    dep = sub.add_parser(
        "deploy", help="register the block type, save the engine block, create the work pool, deploy",
        description="Run, printing each one: prefect block register -m "
        "prefect_cudf_polars.blocks; prefect-cudf-polars save-engine; prefect work-pool "
        "create (process type) and set-concurrency-limit 1; prefect --no-prompt deploy "
        "--all. Every step can be repeated.",
    )
    dep.add_argument("--engine-block", default=DEFAULT_ENGINE_BLOCK, metavar="NAME",
                     help="name of the engine block to save; prefect.yaml's deployment loads "
                     "'%(default)s' (default: %(default)s)")
    # Both commands save an engine block; save-engine's backend defaults to auto, deploy's to spmd.
    for command, backend in ((save, "auto"), (dep, "spmd")):
        command.add_argument("--backend", default=backend, choices=BACKENDS, help=BACKEND_HELP)
        command.add_argument("--cpu-fallback", action="store_true", help=CPU_FALLBACK_HELP)
    dep.add_argument("--pool", default=DEFAULT_POOL,
                     help="process work pool to create or overwrite, with a concurrency limit of 1; "
                     "it must match prefect.yaml (default: %(default)s)")
    dep.add_argument("--project-dir", default=".", metavar="DIR",
                     help="folder holding prefect.yaml, the checkout's root (default: the current folder)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``prefect-cudf-polars`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "save-engine":
            block_id = save_engine(args.name, backend=args.backend, cpu_fallback=args.cpu_fallback)
            print(f"Saved cudf-polars-engine block {args.name!r} (backend={args.backend}, id {block_id})")
        else:
            deploy(engine_block=args.engine_block, backend=args.backend, pool=args.pool,
                   project_dir=args.project_dir, cpu_fallback=args.cpu_fallback)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
