"""Project rules that a reader cannot see from one file: the library imports no front-door framework, the
import graph has no cycle and points one way (engine <- studio.http <- webui <- studio.cli), no work at import."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.imports import find_cycle, graph, imported_names, modules
from tests.support.paths import REPO

# Web and command-line frameworks belong to the front doors (studio/, webui/), never to the library.
FRONT_DOOR_FRAMEWORKS = ("fastapi", "starlette", "uvicorn", "gradio", "gradio_client", "argparse", "pydantic",
                         "multipart", "ray")
# Who may import whom: each layer imports only the layers listed for it (and itself).
LAYERS = {
    "engine": ("engine",),
    "studio.http": ("engine", "studio.http"),
    "studio.cluster": ("engine", "studio.http", "studio.cluster"),
    "studio.loadtest": ("engine", "studio.loadtest"),  # an HTTP client of any server: no server code
    "studio.bench": ("engine", "studio.bench"),  # the `bench` workload: the library's user, not part of it
    "webui": ("engine", "studio.http", "webui"),
    "studio.cli": ("engine", "studio.http", "studio.cluster", "webui", "studio.cli", "studio"),
    "studio": ("studio",),
}


def _layer(module: str) -> str:
    return max((layer for layer in LAYERS if module == layer or module.startswith(layer + ".")), key=len)


def test_the_engine_imports_no_web_or_cli_framework() -> None:
    offenders = sorted(f"{name} imports {m}" for name, path in modules().items() if name.startswith("engine")
                       for m in imported_names(path, name) if m.split(".")[0] in FRONT_DOOR_FRAMEWORKS)
    assert offenders == []


def test_the_import_graph_has_no_cycle() -> None:
    assert find_cycle(graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_imports_point_down_the_layers() -> None:
    offenders = sorted(f"{a} imports {b}" for a, deps in graph().items() for b in deps
                       if not any(b == ok or b.startswith(ok + ".") for ok in LAYERS[_layer(a)]))
    assert offenders == []


def test_the_library_holds_no_front_door() -> None:
    """The `bench` command's workload lives with the front doors (studio/bench.py), not in engine/."""
    assert not (REPO / "engine" / "benchmark.py").exists() and (REPO / "studio" / "bench.py").is_file()
    offenders = sorted(name for name in modules() if name.startswith("engine") and "bench" in name.split(".")[-1])
    assert offenders == []


def test_no_unsafe_torch_load() -> None:
    offenders = [p.relative_to(REPO).as_posix() for p in (REPO / "engine").rglob("*.py")
                 if re.search(r"weights_only\s*=\s*False", p.read_text())]
    assert offenders == []


def test_importing_the_cli_is_cheap() -> None:
    """The CLI and package import no torch, transformers or gradio until a command runs."""
    code = ("import sys, engine, studio.cli, engine.platform_env; "
            "print(','.join(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == ""


def test_public_names_resolve_lazily() -> None:
    import engine

    for name in engine.__all__:
        assert getattr(engine, name) is not None, name


MAX_MODULE_LINES = 1000  # past this a module holds more than one job: split it by what each part does


def test_no_module_grows_past_a_thousand_lines() -> None:
    long = sorted(f"{p.relative_to(REPO).as_posix()}: {n} lines" for top in ("engine", "studio", "webui")
                  for p in (REPO / top).rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES)
    assert long == []
