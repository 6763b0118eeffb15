"""``--vocoder-backend {torch,coreml}`` on every command that builds an engine, through the one bootstrap."""

from __future__ import annotations

import argparse

import pytest
import yaml

from studio.cli import build_parser
from tests.support.paths import REPO


@pytest.mark.parametrize("command", ["synth", "serve", "webui", "cluster", "bench"])
def test_every_command_takes_the_flag(command) -> None:
    action = next(a for a in build_parser(command)._actions if "--vocoder-backend" in a.option_strings)
    assert tuple(action.choices) == ("torch", "coreml") and action.default is None  # default: the config's keys


def test_the_bootstrap_applies_it_to_every_version(tmp_path) -> None:
    import re

    from engine.config import parse_config
    from studio.cli.bootstrap import build_studio

    text = re.search(r"```yaml\n(.*?)```", (REPO / "docs/coreml.md").read_text("utf-8"), re.DOTALL).group(1)
    config = parse_config(yaml.safe_load(text), "coreml.md", base_dir=tmp_path)
    settings = dict(scheduler=False, warmup=False)

    def studio(flag):
        args = argparse.Namespace(device="cpu", precision=None, vocoder_backend=flag)
        return build_studio(config, args, **settings).default_weights

    assert studio(None).backend("v4")[0] == "coreml" and studio(None).backend("v2Pro")[0] == "torch"
    assert {studio("torch").backend(v)[0] for v in ("v2", "v3", "v4")} == {"torch"}
    forced = studio("coreml")
    assert forced.backend("v2Pro") == ("coreml", "")  # no package for v2Pro: the torch decoder stays (logged)
    assert ("v2Pro", "") not in forced.coreml_decoders() and ("v2", "/path/to/my_voice_dec.mlpackage") in \
        forced.coreml_decoders()
