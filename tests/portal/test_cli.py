"""The gpuportal command line: version, and every PortalError becoming exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from portal.cli import run
from portal.errors import EXIT_USAGE

GPUPORTAL = Path(sys.executable).parent / "gpuportal"


def gpuportal(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed console script, as a person would."""
    return subprocess.run(
        [str(GPUPORTAL), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version_prints_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["version"]) == 0
    assert capsys.readouterr().out == f"gpuportal {version('gpuportal')}\n"


def test_version_flag_prints_the_same_as_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"gpuportal {version('gpuportal')}\n"


def test_console_script_exits_zero_on_success() -> None:
    result = gpuportal("version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpuportal ")


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run([])
    assert exited.value.code == EXIT_USAGE
    assert "COMMAND" in capsys.readouterr().err


def test_out_of_range_port_exits_2_naming_value_and_valid_range(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = gpuportal("demo", "--port", "70000", env={"GPUPORTAL_STATE_DIR": str(state)})
    assert result.returncode == EXIT_USAGE
    assert result.stdout == ""
    assert "demo_port" in result.stderr
    assert "70000" in result.stderr
    assert "65535" in result.stderr
    # Bad input changes no state.
    assert not state.exists()


def test_malformed_environment_setting_names_the_variable(tmp_path: Path) -> None:
    result = gpuportal(
        "demo",
        env={"GPUPORTAL_STATE_DIR": str(tmp_path), "GPUPORTAL_DEMO_PORT": "eighty"},
    )
    assert result.returncode == EXIT_USAGE
    assert "GPUPORTAL_DEMO_PORT" in result.stderr
    assert "'eighty'" in result.stderr
    assert "integer" in result.stderr


def test_unwritable_state_dir_exits_2_and_says_what_to_set(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    result = gpuportal("demo", env={"GPUPORTAL_STATE_DIR": str(blocker / "state")})
    assert result.returncode == EXIT_USAGE
    expected = f"gpuportal demo: error: cannot write the demo state directory {blocker}"
    assert expected in result.stderr
    assert "GPUPORTAL_STATE_DIR" in result.stderr
    assert "Traceback" not in result.stderr
