"""
``prefect-cudf-polars``: save an engine block and deploy the project's flows.

Commands
--------
``prefect-cudf-polars save-engine NAME --backend spmd [--device-memory-limit 40%] [--admission-limit gpu-memory]``
    Save a ``cudf-polars-engine`` block (there is no Prefect CLI command that
    saves a block with field values).
``prefect-cudf-polars admission-limit NAME --slots N``
    Create the Prefect global concurrency limit ``NAME`` with ``N`` slots (GiB of
    device memory), or set an existing one's size to ``N``; either way it is
    active and its slots do not decay.
``prefect-cudf-polars deploy [--engine-block gpu] [--backend spmd] [--pool gpu-pool] [--admission-limit NAME --device-memory-limit 40%]``
    Run, in order and printing each one, the commands of the README's "Deploy"
    section: register the block type, save the engine block, create the process
    work pool with a concurrency limit of 1, and ``prefect --no-prompt deploy --all``
    with the project's ``prefect.yaml``. ``make deploy`` calls it. Without
    ``--backend``, the engine block is ``spmd`` where a GPU backend can run here,
    else what ``make run`` runs, ``auto`` with ``cpu_fallback`` (said before the
    commands), so a first deployment's flow runs complete on a worker without a
    GPU too (:func:`deploy_backend`). With
    ``--admission-limit``, flow runs share the GPU by bytes instead
    (``docs/admission.md``): the engine block gets ``device_memory_limit`` and
    ``admission_limit``, the global concurrency limit gets one slot per GiB of
    the GPU's memory, and the work pool's concurrency limit is cleared.

All three talk to the Prefect API that ``PREFECT_API_URL`` names (a running
``prefect server start``, or Prefect Cloud): a worker cannot reach the
temporary API Prefect starts when none is configured, so ``deploy`` refuses to
run without one.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from prefect_cudf_polars.blocks import CudfPolarsEngine
from prefect_cudf_polars.blocks.admission import slots_for
from prefect_cudf_polars.blocks.backends import probe as gpu_probe
from prefect_cudf_polars.blocks.engine_block import LIMIT_NAME_PATTERN, Backend
from prefect_cudf_polars.blocks.errors import LIMIT_NAME_RULE, invalid_fields

#: The work pool the project's prefect.yaml deploys to.
DEFAULT_POOL = "gpu-pool"
#: The engine block name the project's prefect.yaml passes to the main job.
DEFAULT_ENGINE_BLOCK = "gpu"


class DeployError(RuntimeError):
    """A deploy step failed or cannot run; the message says what to do."""


def memory_limit_value(text: str) -> int | str:
    """
    A ``--device-memory-limit`` as the block takes it (argparse's ``type``): bytes (``"40000000000"`` -> int), else
    the text as typed (``"40%"``), for the block's validator to accept or refuse.
    """
    try:
        return int(text)
    except ValueError:
        return text


def whole_gib(text: str) -> int:
    """``--slots`` and ``--gpu-memory-gib`` (argparse's ``type``): the GPU's memory in whole GiB, 1 or more."""
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"got {text}: give the GPU's memory in whole GiB (1 or more)")
    return int(text)


def set_admission_limit(name: str, slots: int) -> None:
    """
    Create the global concurrency limit ``name`` with ``slots`` slots, or set an existing one's size to ``slots``.

    Its slots are GiB of device memory: give one per GiB of the smallest GPU's
    memory that the flow runs admitted by it share, rounded up
    (:func:`~prefect_cudf_polars.blocks.admission.slots_for`). The slots in use
    are kept. Either way the limit is active and its slots do not decay
    (``slot_decay_per_second=0``): a slot is given back only when the engine
    that occupied it has shut down.

    Raises
    ------
    prefect.exceptions.PrefectHTTPStatusError
        If the API refuses it (a bad name, or ``slots`` below 0).
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    fields = {"limit": slots, "active": True, "slot_decay_per_second": 0.0}
    with get_client(sync_client=True) as client:
        try:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(**fields))
        except ObjectNotFound:  # none of that name yet
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, **fields))


def deploy_commands(*, engine_block: str = DEFAULT_ENGINE_BLOCK, backend: str = "spmd", pool: str = DEFAULT_POOL,
                    cpu_fallback: bool = False, device_memory_limit: int | str | None = None,
                    admission_limit: str | None = None, gpu_memory_gib: int | None = None) -> list[list[str]]:
    """
    The commands ``deploy`` runs, in order, as the README (and ``docs/admission.md``) write them.

    Without ``admission_limit``: register the block type, save the engine block,
    create the process work pool, set its concurrency limit to 1 (one flow run
    at a time per GPU machine), deploy. With it: the engine block also gets
    ``device_memory_limit`` and ``admission_limit``, the global concurrency
    limit is created or resized to ``gpu_memory_gib`` slots, and the work pool's
    concurrency limit is cleared (flow runs share the GPU by bytes instead).

    Parameters
    ----------
    engine_block, backend, cpu_fallback
        The engine block to save (the fields of :class:`~prefect_cudf_polars.blocks.CudfPolarsEngine`).
    pool
        The process work pool (created or overwritten). It must match
        ``prefect.yaml``. Without admission its concurrency limit is 1: one
        flow run at a time per GPU machine; with admission it has none.
    device_memory_limit : int or str, optional
        The engine block's ``device_memory_limit`` (bytes or ``"40%"``), per flow run.
    admission_limit : str, optional
        The global concurrency limit flow runs occupy their GiB of; needs
        ``device_memory_limit`` and ``gpu_memory_gib``.
    gpu_memory_gib : int, optional
        The limit's slots: GiB of the GPU's memory.

    Returns
    -------
    list of list of str
        Each starts with ``prefect`` or ``prefect-cudf-polars``; :func:`to_argv`
        turns one into the argument list this Python runs.

    Raises
    ------
    ValueError
        ``admission_limit`` without ``device_memory_limit`` or ``gpu_memory_gib``.
    """
    if admission_limit is not None and (device_memory_limit is None or gpu_memory_gib is None):
        raise ValueError("admission_limit needs device_memory_limit and gpu_memory_gib")
    save = ["prefect-cudf-polars", "save-engine", engine_block, "--backend", backend]
    save += ["--cpu-fallback"] if cpu_fallback else []
    save += ["--device-memory-limit", str(device_memory_limit)] if device_memory_limit is not None else []
    sharing = [["prefect", "work-pool", "set-concurrency-limit", pool, "1"]]
    if admission_limit is not None:
        save += ["--admission-limit", admission_limit]
        sharing = [["prefect-cudf-polars", "admission-limit", admission_limit, "--slots", str(gpu_memory_gib)],
                   ["prefect", "work-pool", "clear-concurrency-limit", pool]]
    return [
        ["prefect", "block", "register", "-m", "prefect_cudf_polars.blocks"],
        save,
        ["prefect", "work-pool", "create", pool, "--type", "process", "--overwrite"],
        *sharing,
        ["prefect", "--no-prompt", "deploy", "--all"],
    ]


def deploy_backend(backend: str | None, cpu_fallback: bool) -> tuple[str, bool, str | None]:
    """
    The engine block's backend and ``cpu_fallback`` that ``deploy`` saves, and a note when it chose them.

    A ``backend`` given is kept, as given. Without one: ``spmd`` where a GPU
    backend can run here (:func:`~prefect_cudf_polars.blocks.backends.probe.probe`);
    else what ``make run`` runs, ``auto`` with ``cpu_fallback``, so the flow runs
    use the GPU on a worker with one and complete on the CPU elsewhere (with a
    WARNING in their log), instead of all failing with ``NoGPUError``.

    Returns
    -------
    (backend, cpu_fallback, note)
        ``note`` says why and how to choose otherwise; ``None`` unless ``auto`` was chosen.
    """
    if backend is not None:
        return backend, cpu_fallback, None
    problem = gpu_probe.probe().problem
    if problem is None:
        return "spmd", cpu_fallback, None
    return "auto", True, (f"No GPU backend can run here ({problem}), so the engine block gets backend=auto with "
                          "cpu_fallback, as `make run` runs: flow runs use the GPU on a worker with one, else the CPU "
                          "(a WARNING in their log). For flow runs that must use the GPU, deploy with --backend "
                          "spmd (make deploy ENGINE_BACKEND=spmd).")


def to_argv(command: list[str]) -> list[str]:
    """Run a README command with this Python (``python -m prefect`` / ``-m prefect_cudf_polars.cli``)."""
    module = {"prefect": "prefect", "prefect-cudf-polars": "prefect_cudf_polars.cli"}[command[0]]
    return [sys.executable, "-m", module, *command[1:]]


def deploy(*, engine_block: str = DEFAULT_ENGINE_BLOCK, backend: str = "spmd", pool: str = DEFAULT_POOL,
           project_dir: str | Path = ".", cpu_fallback: bool = False, device_memory_limit: int | str | None = None,
           admission_limit: str | None = None, gpu_memory_gib: int | None = None) -> None:
    """
    Register the block type, save the engine block, create the pool (and the admission limit), deploy every flow.

    Parameters
    ----------
    project_dir
        Folder holding ``prefect.yaml`` (the checkout's root).
    engine_block, backend, pool, cpu_fallback, device_memory_limit, admission_limit, gpu_memory_gib
        As for :func:`deploy_commands`, which says what each does.

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
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:  # the environment's or the active profile's
        raise DeployError("PREFECT_API_URL is not set, so deployments would go to a temporary API no worker can "
                          "reach. Start a server (`prefect server start`) and point at it: "
                          "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`.")
    for command in deploy_commands(engine_block=engine_block, backend=backend, pool=pool, cpu_fallback=cpu_fallback,
                                   device_memory_limit=device_memory_limit, admission_limit=admission_limit,
                                   gpu_memory_gib=gpu_memory_gib):
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
All three commands talk to the Prefect API that PREFECT_API_URL names (a running
"prefect server start", or Prefect Cloud). Without one, save-engine saves the
block to the temporary local API Prefect starts (where flows run without a
server find it); deploy refuses to run: a worker cannot reach that API.

examples:
  prefect-cudf-polars save-engine gpu --backend spmd
  prefect-cudf-polars deploy --engine-block gpu --backend spmd
  prefect-cudf-polars deploy --admission-limit gpu-memory --device-memory-limit 40%
"""
BACKEND_HELP = ("auto: spmd with one visible GPU, dask with several; spmd: one GPU, in the flow run's process; dask: "
                "a local Dask cluster the flow run starts, one worker per GPU; ray: a local Ray the flow run starts, "
                "one actor per GPU; cpu: polars' CPU engine, no GPU (default: %(default)s)")
DEPLOY_BACKEND_DEFAULT = "spmd where a GPU backend can run here, else auto with --cpu-fallback, as make run"


def build_parser() -> argparse.ArgumentParser:
    """The ``prefect-cudf-polars`` argument parser (its help is plain text)."""
    parser = argparse.ArgumentParser(prog="prefect-cudf-polars", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    save = sub.add_parser("save-engine", help="save a cudf-polars-engine block (overwrites one of that name)",
                          description="Save a cudf-polars-engine block under NAME, overwriting one of that name. "
                          "Flows load it with CudfPolarsEngine.load(NAME).")
    save.add_argument("name", metavar="NAME", help="the block's name, e.g. gpu")
    limit = sub.add_parser(
        "admission-limit", help="create or resize the global concurrency limit of GiB of device memory",
        description="Create the Prefect global concurrency limit NAME with N slots, or set an existing one's size to "
        "N (the slots in use are kept); either way it is active and its slots do not decay. Its slots are GiB of "
        "device memory: give one per GiB of the GPU's memory, rounded up.")
    limit.add_argument("name", metavar="NAME", help="the limit's name, e.g. gpu-memory")
    limit.add_argument("--slots", type=whole_gib, required=True, metavar="N",
                       help="its size: GiB of the smallest GPU's memory the flow runs share, e.g. 80")
    dep = sub.add_parser(
        "deploy", help="register the block type, save the engine block, create the work pool, deploy",
        description="Run, printing each one: prefect block register -m prefect_cudf_polars.blocks; "
        "prefect-cudf-polars save-engine; prefect work-pool create (process type) and set-concurrency-limit 1; "
        "prefect --no-prompt deploy --all. With --admission-limit, flow runs share the GPU by bytes instead: the "
        "engine block gets the device memory limit and the admission limit, prefect-cudf-polars admission-limit "
        "creates or resizes the global concurrency limit to the GPU's GiB, and the work pool's concurrency limit "
        "is cleared. Every step can be repeated.")
    dep.add_argument("--engine-block", default=DEFAULT_ENGINE_BLOCK, metavar="NAME", help="name of the engine "
                     "block to save; prefect.yaml's deployment loads '%(default)s' (default: %(default)s)")
    # Both commands save an engine block; save-engine's backend defaults to auto, deploy's is chosen
    # from this machine (deploy_backend).
    for command, backend, default in ((save, "auto", "%(default)s"), (dep, None, DEPLOY_BACKEND_DEFAULT)):
        command.add_argument("--backend", default=backend, choices=get_args(Backend),
                             help=BACKEND_HELP.replace("%(default)s", default))
        command.add_argument("--cpu-fallback", action="store_true",
                             help="with no usable GPU, warn and use the cpu backend instead of failing")
        command.add_argument("--device-memory-limit", type=memory_limit_value, metavar="BYTES|PCT%",
                             help="device memory each flow run's engine may use: bytes (40000000000) or a percentage "
                             "of the GPU's memory (40%%); its slots of the admission limit are this in GiB, rounded "
                             "up (default: the whole GPU)")
        command.add_argument("--admission-limit", metavar="NAME", help="Prefect global concurrency limit whose slots "
                             "are GiB of device memory: each flow run occupies its device memory limit's GiB while its "
                             "engine runs (needs --device-memory-limit; default: no admission)")
    save.add_argument("--admission-timeout", type=float, metavar="SECONDS",
                      help="seconds a flow run waits for its admission slots before it fails (default: 3600)")
    dep.add_argument("--gpu-memory-gib", type=whole_gib, metavar="N",
                     help="slots of the admission limit: GiB of the GPU's memory (default: the smallest GPU "
                     "here's memory in GiB, rounded up; needed on a machine without one)")
    dep.add_argument("--pool", default=DEFAULT_POOL,
                     help="process work pool to create or overwrite, with a concurrency limit of 1 (none "
                     "with --admission-limit); it must match prefect.yaml (default: %(default)s)")
    dep.add_argument("--project-dir", default=".", metavar="DIR",
                     help="folder holding prefect.yaml, the checkout's root (default: the current folder)")
    parser.set_defaults(commands={"save-engine": save, "admission-limit": limit, "deploy": dep})
    return parser


def check_engine_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> CudfPolarsEngine:
    """
    The engine block the arguments configure; refuse, with argparse's one-line error (exit status 2), arguments the
    block would refuse.

    For ``deploy`` with ``--admission-limit``, also fill in ``args.gpu_memory_gib``
    from the smallest GPU here when it was not given: its GiB, rounded up, the
    same rule as a session's slots (:func:`~prefect_cudf_polars.blocks.admission.slots_for`),
    so N flow runs of ``100/N`` % of this GPU fit in it together (an H200's
    139.8 GiB give 140 slots, and each of two 50 % runs occupies 70).
    """
    from pydantic import ValidationError

    limit = args.device_memory_limit
    fields = ("backend", "cpu_fallback", "device_memory_limit", "admission_limit", "admission_timeout")
    try:  # the block's own validators say what each field allows (and that admission_limit needs a limit)
        block = CudfPolarsEngine(**{key: getattr(args, key) for key in fields if getattr(args, key, None) is not None})
    except ValidationError as exc:
        parser.error(invalid_fields(exc))
    if args.command != "deploy" or args.admission_limit is None:
        return block
    if args.gpu_memory_gib is None:
        found = gpu_probe.gpu_memory_bytes()
        if found is None:
            parser.error("--admission-limit needs --gpu-memory-gib N (the GPU's memory in GiB, the limit's "
                         "slots): no GPU is visible here to read it from")
        args.gpu_memory_gib = slots_for(found)
    if isinstance(limit, int) and slots_for(limit) > args.gpu_memory_gib:
        parser.error(f"--device-memory-limit {limit} is {slots_for(limit)} GiB, more than the "
                     f"{args.gpu_memory_gib} GiB of --gpu-memory-gib: no flow run would ever be admitted")
    return block


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``prefect-cudf-polars`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    parser = args.commands[args.command]  # its errors show the command's usage
    if args.command == "admission-limit":
        if not re.match(LIMIT_NAME_PATTERN, args.name):
            parser.error(f"{args.name!r} is not {LIMIT_NAME_RULE}")
        set_admission_limit(args.name, args.slots)
        print(f"Global concurrency limit {args.name!r}: {args.slots} slot(s), one per GiB of device memory")
        return 0
    # save-engine's --backend always has a value (auto by default), which deploy_backend keeps as given.
    args.backend, args.cpu_fallback, note = deploy_backend(args.backend, args.cpu_fallback)
    block = check_engine_arguments(parser, args)
    if args.command == "save-engine":
        block_id = block.save(args.name, overwrite=True)
        print(f"Saved cudf-polars-engine block {args.name!r} (backend={args.backend}, id {block_id})")
        return 0
    engine = {key: getattr(args, key) for key in ("backend", "cpu_fallback", "device_memory_limit", "admission_limit")}
    if note is not None:
        print(note, flush=True)
    try:
        deploy(engine_block=args.engine_block, pool=args.pool, project_dir=args.project_dir,
               gpu_memory_gib=args.gpu_memory_gib, **engine)
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
