"""The `prefect-cudf-polars` command: saving an engine block, and deploy's refusals (real local API)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from prefect_cudf_polars import cli
from prefect_cudf_polars.blocks import CudfPolarsEngine

ROOT = Path(__file__).resolve().parents[1]


def test_save_engine_saves_a_block_that_loads_back(capsys):
    assert cli.main(["save-engine", "cli-test", "--backend", "cpu"]) == 0
    assert "Saved cudf-polars-engine block 'cli-test' (backend=cpu" in capsys.readouterr().out
    assert CudfPolarsEngine.load("cli-test").backend == "cpu"
    # Saving again overwrites (a deploy can be repeated).
    assert cli.main(["save-engine", "cli-test", "--backend", "spmd"]) == 0
    assert CudfPolarsEngine.load("cli-test").backend == "spmd"


def test_deploy_refuses_a_folder_without_prefect_yaml(tmp_path, capsys):
    assert cli.main(["deploy", "--project-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"No prefect.yaml in {tmp_path}" in err and "checkout's root" in err


def test_deploy_refuses_to_run_without_an_api_url(tmp_path, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    shutil.copy(ROOT / "prefect.yaml", tmp_path / "prefect.yaml")
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert cli.main(["deploy", "--project-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "PREFECT_API_URL is not set" in err and "prefect server start" in err


def test_deploy_commands_are_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    for command in cli.deploy_commands(engine_block="gpu", backend="spmd", pool="gpu-pool"):
        assert " ".join(command) in readme, command
    # Where no GPU backend can run, the engine block the README names instead.
    [save] = [c for c in cli.deploy_commands(engine_block="gpu", backend="auto", cpu_fallback=True, pool="gpu-pool")
              if c[1] == "save-engine"]
    assert " ".join(save[3:]) in readme, save


def test_deploy_commands_with_admission_are_the_admission_guides_and_leave_the_pool_unlimited():
    guide = (ROOT / "docs" / "admission.md").read_text()
    commands = cli.deploy_commands(engine_block="gpu", backend="spmd", pool="gpu-pool", device_memory_limit="40%",
                                   admission_limit="gpu-memory", gpu_memory_gib=140)
    for command in commands:
        assert " ".join(command) in guide, command
    shown = [" ".join(c) for c in commands]
    assert "prefect-cudf-polars save-engine gpu --backend spmd --device-memory-limit 40% --admission-limit gpu-memory" in shown
    assert "prefect-cudf-polars admission-limit gpu-memory --slots 140" in shown
    assert "prefect work-pool clear-concurrency-limit gpu-pool" in shown
    assert not [c for c in shown if "set-concurrency-limit" in c]


def test_save_engine_saves_the_device_memory_limit_and_the_admission_fields(capsys):
    assert cli.main(["save-engine", "cli-admitted", "--backend", "cpu", "--device-memory-limit", "40%",
                     "--admission-limit", "gpu-memory", "--admission-timeout", "90"]) == 0
    block = CudfPolarsEngine.load("cli-admitted")
    assert (block.device_memory_limit, block.admission_limit, block.admission_timeout) == ("40%", "gpu-memory", 90.0)
    assert cli.main(["save-engine", "cli-admitted", "--backend", "cpu", "--device-memory-limit", str(8 << 30)]) == 0
    block = CudfPolarsEngine.load("cli-admitted")
    assert (block.device_memory_limit, block.admission_limit) == (8 << 30, None)


@pytest.mark.parametrize(("args", "message"), [
    (["save-engine", "x", "--admission-limit", "gpu-memory"], "admission_limit='gpu-memory' needs device_memory_limit"),
    (["save-engine", "x", "--device-memory-limit", "120%"], "device_memory_limit: device_memory_limit='120%'"),
    (["save-engine", "x", "--device-memory-limit", "lots"],
     "device_memory_limit: device_memory_limit='lots' is not a percentage of the GPU's memory"),
    (["deploy", "--admission-limit", "gpu-memory"], "admission_limit='gpu-memory' needs device_memory_limit"),
    (["deploy", "--admission-limit", "gpu-memory", "--device-memory-limit", "40%"],
     "--admission-limit needs --gpu-memory-gib N (the GPU's memory in GiB, the limit's slots): no GPU is visible"),
    (["deploy", "--admission-limit", "gpu-memory", "--device-memory-limit", str(90 << 30), "--gpu-memory-gib", "80"],
     "is 90 GiB, more than the 80 GiB of --gpu-memory-gib"),
    (["admission-limit", "gpu-memory", "--slots", "0"], "--slots: got 0: give the GPU's memory in whole GiB"),
    (["deploy", "--admission-limit", "g", "--device-memory-limit", "40%", "--gpu-memory-gib", "x"],
     "--gpu-memory-gib: got x: give the GPU's memory in whole GiB"),
    (["admission-limit", "bad name/x", "--slots", "3"], "'bad name/x' is not a Prefect global concurrency limit's name"),
    (["save-engine", "x", "--device-memory-limit", "40%", "--admission-limit", "a/b"],
     "admission_limit='a/b' is not a Prefect global concurrency limit's name"),
    (["save-engine", "x", "--admission-timeout", "inf", "--device-memory-limit", "40%", "--admission-limit", "g"],
     "admission_timeout: Input should be a finite number"),
])
def test_admission_arguments_the_engine_would_refuse_are_one_line_usage_errors(args, message, capsys, monkeypatch):
    from prefect_cudf_polars.blocks.backends import probe

    monkeypatch.setattr(probe, "gpu_memory_bytes", lambda: None)  # as on a machine without a GPU
    with pytest.raises(SystemExit, match="^2$"):
        cli.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"prefect-cudf-polars {args[0]}: error: ") and message in err[-1], err


def test_the_gpu_memory_is_read_from_the_gpu_in_whole_gib_rounded_up_when_not_given(monkeypatch):
    from prefect_cudf_polars.blocks.backends import probe

    monkeypatch.setattr(probe, "gpu_memory_bytes", lambda: 150_121_545_728)  # an H200: 139.8 GiB
    ran = {}
    monkeypatch.setattr(cli, "deploy", lambda **kwargs: ran.update(kwargs))
    assert cli.main(["deploy", "--admission-limit", "gpu-memory", "--device-memory-limit", "40%"]) == 0
    assert ran["gpu_memory_gib"] == 140 and ran["admission_limit"] == "gpu-memory"


@pytest.mark.parametrize(("runs", "percent", "fit"), [(2, 50, True), (4, 25, True), (5, 20, True), (10, 10, True),
                                                       (3, 33, False), (3, 32, True)])
def test_n_runs_of_a_percentage_fit_in_the_limit_sized_from_the_gpu_as_the_guide_says(runs, percent, fit):
    from prefect_cudf_polars.blocks.admission import slots_for

    h200 = 150_121_545_728  # 139.8 GiB
    limit = slots_for(h200)
    assert limit == 140
    # A percentage's bytes, as the block reads it against the GPU, occupy their GiB rounded up.
    block = CudfPolarsEngine(backend="cpu", device_memory_limit=f"{percent}%")
    assert (runs * slots_for(block.memory_limit_bytes(h200)) <= limit) is fit
    guide = (ROOT / "docs" / "admission.md").read_text()
    assert f"{runs} × {percent}%" in guide


def test_admission_limit_creates_the_global_concurrency_limit_then_resizes_it(capsys):
    import uuid

    from prefect.client.orchestration import get_client

    name = f"cli-gpu-memory-{uuid.uuid4().hex[:8]}"
    assert cli.main(["admission-limit", name, "--slots", "80"]) == 0
    assert cli.main(["admission-limit", name, "--slots", "140"]) == 0  # repeated: resized, not refused
    assert f"Global concurrency limit {name!r}: 140 slot(s)" in capsys.readouterr().out
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    assert (limit.limit, limit.active, limit.active_slots, limit.slot_decay_per_second) == (140, True, 0, 0)


def test_admission_limit_enables_a_disabled_limit_and_stops_its_slots_decaying(capsys):
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    name = f"cli-gpu-memory-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=name, limit=80, active=False, slot_decay_per_second=2.0))
    assert cli.main(["admission-limit", name, "--slots", "80"]) == 0  # the same size: still set right
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(name)
    assert (limit.limit, limit.active, limit.slot_decay_per_second) == (80, True, 0)


@pytest.mark.timeout(600)
def test_deploy_with_admission_saves_the_block_sizes_the_limit_and_clears_the_pools_limit(monkeypatch, capsys):
    """The whole deploy, its commands as subprocesses, against the tests' local API."""
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the commands' subprocesses use this API
    name = f"cli-deploy-gpu-memory-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:  # as a deploy without admission left it
        client.create_work_pool(WorkPoolCreate(name=cli.DEFAULT_POOL, type="process", concurrency_limit=1),
                                overwrite=True)
    assert cli.main(["deploy", "--backend", "cpu", "--engine-block", "cli-deployed", "--admission-limit", name,
                     "--device-memory-limit", str(20 << 30), "--gpu-memory-gib", "80",
                     "--project-dir", str(ROOT)]) == 0
    shown = [line[2:] for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert f"prefect-cudf-polars admission-limit {name} --slots 80" in shown
    block = CudfPolarsEngine.load("cli-deployed")
    assert (block.device_memory_limit, block.admission_limit) == (20 << 30, name)
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name(name).limit == 80
        assert client.read_work_pool(cli.DEFAULT_POOL).concurrency_limit is None
        assert client.read_deployment_by_name("flight-delay-report/daily-flight-delay-report").work_pool_name == (
            cli.DEFAULT_POOL)


NO_GPU_HERE = "no NVIDIA driver: libcuda.so.1 was not found"


def gpu_here(monkeypatch, problem: str | None) -> None:
    """This machine as the GPU probe sees it: a GPU backend can run (``problem`` None) or not, and why."""
    from prefect_cudf_polars.blocks.backends import probe

    monkeypatch.setattr(probe, "probe", lambda: probe.GPUProbe(gpus=int(problem is None), rapids=problem is None,
                                                                problem=problem))


@pytest.mark.timeout(600)
def test_a_first_deploy_without_a_gpu_here_saves_what_make_run_runs_and_says_so(monkeypatch, capsys):
    """`make deploy` with no backend chosen, on a machine without a GPU: the whole deploy, against the tests' API."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    gpu_here(monkeypatch, NO_GPU_HERE)
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the commands' subprocesses use this API
    assert cli.main(["deploy", "--engine-block", "cli-first-deploy", "--project-dir", str(ROOT)]) == 0
    out = capsys.readouterr().out
    assert f"No GPU backend can run here ({NO_GPU_HERE}), so the engine block gets backend=auto with cpu_fallback" in out
    assert "--backend spmd (make deploy ENGINE_BACKEND=spmd)" in out
    shown = [line[2:] for line in out.splitlines() if line.startswith("$ ")]
    assert "prefect-cudf-polars save-engine cli-first-deploy --backend auto --cpu-fallback" in shown
    block = CudfPolarsEngine.load("cli-first-deploy")
    assert (block.backend, block.cpu_fallback) == ("auto", True)
    with get_client(sync_client=True) as client:
        assert client.read_work_pool(cli.DEFAULT_POOL).concurrency_limit == 1
        assert client.read_deployment_by_name("flight-delay-report/daily-flight-delay-report")


@pytest.mark.parametrize(("problem", "args", "saved"), [
    (None, [], ("spmd", False)),  # a GPU here: the GPU, strictly
    (NO_GPU_HERE, ["--backend", "spmd"], ("spmd", False)),  # chosen: kept (the worker may have the GPU)
    (NO_GPU_HERE, ["--backend", "cpu"], ("cpu", False)),
    (None, ["--backend", "dask", "--cpu-fallback"], ("dask", True)),
])
def test_deploy_keeps_a_chosen_backend_and_chooses_spmd_where_a_gpu_backend_can_run(
        problem, args, saved, monkeypatch, capsys):
    gpu_here(monkeypatch, problem)
    ran = {}
    monkeypatch.setattr(cli, "deploy", lambda **kwargs: ran.update(kwargs))
    assert cli.main(["deploy", *args]) == 0
    assert (ran["backend"], ran["cpu_fallback"]) == saved
    assert "No GPU backend can run here" not in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["gpu-x", "GPU"])
def test_save_engine_rejects_an_unknown_backend(bad, capsys):
    with pytest.raises(SystemExit, match="^2$"):
        cli.main(["save-engine", "x", "--backend", bad])
    assert "invalid choice" in capsys.readouterr().err


def _help_of(capsys, *args: str) -> str:
    """What ``prefect-cudf-polars ARGS --help`` prints (it exits with status 0)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*args, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _arguments(help_text: str) -> dict[str, str]:
    """Each argument listed in a help text, with the help written for it (argparse's layout)."""
    found: dict[str, str] = {}
    current = None
    for line in help_text.splitlines():
        if re.match(r"^  \S", line):  # "  --pool POOL   help..." or "  --backend {...}"
            current, _, text = re.sub(r"\s{2,}", "\0", line.strip(), count=1).partition("\0")
            found[current] = text
        elif current and line.startswith("    "):  # the help, continued or on its own line
            found[current] = f"{found[current]} {line.strip()}".strip()
        else:
            current = None
    return found


@pytest.mark.parametrize("command", ["save-engine", "admission-limit", "deploy"])
def test_help_is_plain_text_and_explains_every_argument(command, capsys):
    top = _help_of(capsys)
    assert command in top
    text = _help_of(capsys, command)
    arguments = _arguments(text)
    expected = {
        "save-engine": ["NAME", "--backend", "--cpu-fallback", "--device-memory-limit", "--admission-limit",
                        "--admission-timeout"],
        "admission-limit": ["NAME", "--slots"],
        "deploy": ["--engine-block", "--backend", "--cpu-fallback", "--device-memory-limit", "--admission-limit",
                   "--gpu-memory-gib", "--pool", "--project-dir"],
    }[command]
    for name in expected:
        [entry] = [k for k in arguments if k.split()[0] == name]
        assert len(arguments[entry]) > 20, (entry, arguments[entry])
    for help_text in (top, text):
        for markup in ("``", ":func:", ":mod:", ":class:", ":meth:", "`"):
            assert markup not in help_text, markup
    if command == "deploy":
        assert "(default: gpu-pool)" in arguments["--pool POOL"]
        assert arguments["--backend {auto,spmd,dask,ray,cpu}"].endswith(
            "(default: spmd where a GPU backend can run here, else auto with --cpu-fallback, as make run)")
