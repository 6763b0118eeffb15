"""Project rules that a reader cannot see from one file: no gradio in the engine, no work at import."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO

ENGINE = REPO / "engine"


def test_engine_never_imports_gradio() -> None:
    pattern = re.compile(r"^\s*(import gradio|from gradio\b)", re.M)
    offenders = [p.relative_to(REPO).as_posix() for p in ENGINE.rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []


def test_no_unsafe_torch_load() -> None:
    offenders = [p.relative_to(REPO).as_posix() for p in (REPO / "engine").rglob("*.py")
                 if re.search(r"weights_only\s*=\s*False", p.read_text())]
    assert offenders == []


def test_importing_the_cli_is_cheap() -> None:
    """The CLI and package import no torch, transformers or gradio until a command runs."""
    code = ("import sys, engine, engine.cli, engine.platform_env; "
            "print(','.join(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""


def test_public_names_resolve_lazily() -> None:
    import engine

    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
