"""`sovits-studio --version`: the installed package's version, as pyproject.toml gives it."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from studio.cli import main
from tests.support.paths import REPO


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_package_version(flag, capsys) -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"sovits-studio {declared}"


def test_version_from_the_installed_command_line() -> None:
    """As a user types it (the console script runs studio.cli:main), without loading the engine."""
    code = "import sys; from studio.cli import main; sys.exit(main(['--version']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("sovits-studio ") and out.stderr == ""
    assert "--version" in subprocess.run([sys.executable, "-c", "from studio.cli import main; main(['--help'])"],
                                         capture_output=True, text=True, cwd=REPO, timeout=60).stdout
