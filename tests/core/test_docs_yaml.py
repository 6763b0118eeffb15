"""Every YAML block of the documentation parses with the engine's own config parser (a user copies them as they
are), and the Core ML example does what its comments say."""

from __future__ import annotations

import re

import pytest
import yaml

from engine.config import parse_config
from engine.loading.model_pool import WeightSet
from tests.support.paths import REPO

DOCS = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[tuple[str, str]]:
    return [(f"{p.name}#{i}", text) for p in DOCS for i, text in enumerate(BLOCK.findall(p.read_text("utf-8")), 1)]


def test_the_docs_have_yaml_blocks() -> None:
    names = {name.split("#")[0] for name, _ in _blocks()}
    assert {"apple-silicon.md", "coreml.md"} <= names  # the Mac pages' examples are found


@pytest.mark.parametrize("name,text", _blocks(), ids=lambda v: v if "#" in str(v) else "")
def test_every_docs_yaml_block_parses_as_a_config(name, text) -> None:
    parse_config(yaml.safe_load(text), name)


def test_the_coreml_example_switches_the_versions_it_names_and_no_other() -> None:
    text = next(t for n, t in _blocks() if n.startswith("coreml.md"))
    weights = WeightSet.from_config(parse_config(yaml.safe_load(text), "coreml.md"))
    for version in ("v2", "v3", "v4"):
        backend, package = weights.backend(version)
        assert backend == "coreml" and package.endswith(".mlpackage"), version
    assert weights.backend("v2Pro") == ("torch", "")  # a v2 section does not cover v2Pro
    assert weights.with_vocoder_backend("torch").backend("v4")[0] == "torch"  # --vocoder-backend torch


def test_the_page_shows_device_precision_and_backend_per_stage(tmp_path) -> None:
    """Studio.stage_plan (what the page's settings show): the runtime's precision per stage, the vocoder backend
    of the versions with a Core ML package, and a stage the fallback moved to the CPU."""
    from types import MappingProxyType

    import torch

    from engine.studio import Studio
    from engine.runtime import STAGES, Runtime
    from webui.app import stage_table

    text = next(t for n, t in _blocks() if n.startswith("coreml.md"))
    weights = WeightSet.from_config(parse_config(yaml.safe_load(text), "coreml.md"))
    dtypes = {s: torch.float32 if s == "vocoder" else torch.float16 for s in STAGES}
    studio = Studio(weights, Runtime(torch.device("cpu"), MappingProxyType(dtypes)))
    plan = {row[0]: row[1:] for row in studio.stage_plan()}
    assert plan["t2s"] == ("cpu", "fp16", "torch") and plan["vocoder"][1] == "fp32"
    assert plan["vocoder"][2].startswith("coreml (v3, v4)") and plan["sovits"][2].startswith("coreml (v2)")
    studio.fallback._remember("sovits", torch.device("mps"), NotImplementedError("aten::x missing on MPS"))
    assert "operator missing on mps" in dict((r[0], r[1]) for r in studio.stage_plan())["sovits"]
    assert "| vocoder | `cpu` | fp32 | coreml (v3, v4), else torch |" in stage_table(studio)
