"""The lint gate of CONTRIBUTING.md: `ruff check` with pyproject.toml's rules finds nothing in the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["src", "tests", "benchmarks", "recipes"]


def ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    pytest.importorskip("ruff", reason="ruff is not installed (pip install -e \".[test]\" brings it)")
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    result = ruff(*PATHS)
    assert result.returncode == 0, f"ruff check {' '.join(PATHS)}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("source, path, rule", [
    ("import typer\n", "src/modelshrink/new_module.py", "TID251"),
    ("from rich.console import Console\n\nConsole()\n", "src/modelshrink/onnx/new_module.py", "TID251"),
    ("print('done')\n", "src/modelshrink/new_module.py", "T201"),
], ids=["typer", "rich", "print"])
def test_the_house_rules_are_in_the_configuration(source, path, rule):
    # library modules never import typer or rich and never print (STYLE.md): pyproject.toml's ruff section says so
    result = ruff("--stdin-filename", path, "-", stdin=source)
    assert result.returncode == 1 and rule in result.stdout, result.stdout + result.stderr


def test_commands_may_import_typer():
    result = ruff("--stdin-filename", "src/modelshrink/commands/new_command.py", "-", stdin="import typer\n\ntyper.echo\n")
    assert result.returncode == 0, result.stdout + result.stderr
