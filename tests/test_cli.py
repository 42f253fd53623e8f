from __future__ import annotations

import subprocess
import sys

import click
import pytest

from aivitals import cli as cli_module
from aivitals.errors import ConfigError


def test_help_lists_commands_without_importing_them(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli_module.main(["--help"])
    except SystemExit as exc:
        code = exc.code
    assert code in (0, None)
    out = capsys.readouterr().out
    for name in cli_module.COMMANDS:
        assert name in out


def test_every_registered_command_imports() -> None:
    for name, (module, attr, _) in cli_module.COMMANDS.items():
        cmd = cli_module.cli.get_command(click.Context(cli_module.cli), name)
        assert isinstance(cmd, click.Command), (name, module, attr)


def test_base_error_is_printed_as_type_and_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @click.command("boom")
    def boom() -> None:
        raise ConfigError("interval must be positive, got -1")

    monkeypatch.setattr(cli_module.cli, "commands", {**cli_module.cli.commands, "boom": boom})
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["boom"])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.strip() == "ConfigError: interval must be positive, got -1"
    assert "Traceback" not in err


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_module.main(["no-such-command"])
    assert exc.value.code == 2
    assert "No such command" in capsys.readouterr().err


def test_console_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "aivitals.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "aivitals" in out.stdout


def test_import_is_light() -> None:
    code = (
        "import sys, aivitals, aivitals.cli; print('numpy' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
