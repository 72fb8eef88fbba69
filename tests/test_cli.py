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


@pytest.mark.parametrize("command", ["save-engine", "deploy"])
def test_help_is_plain_text_and_explains_every_argument(command, capsys):
    top = _help_of(capsys)
    assert command in top
    text = _help_of(capsys, command)
    arguments = _arguments(text)
    expected = {
        "save-engine": ["NAME", "--backend", "--cpu-fallback"],
        "deploy": ["--engine-block", "--backend", "--cpu-fallback", "--pool", "--project-dir"],
    }[command]
    for name in expected:
        [entry] = [k for k in arguments if k.split()[0] == name]
        assert len(arguments[entry]) > 20, (entry, arguments[entry])
    for help_text in (top, text):
        for markup in ("``", ":func:", ":mod:", ":class:", ":meth:", "`"):
            assert markup not in help_text, markup
    if command == "deploy":
        assert "(default: gpu-pool)" in arguments["--pool POOL"]
        assert arguments["--backend {auto,spmd,dask,ray,cpu}"].endswith("(default: spmd)")
