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


def _docs_config(tmp_path):
    import re

    from engine.config import parse_config

    text = re.search(r"```yaml\n(.*?)```", (REPO / "docs/coreml.md").read_text("utf-8"), re.DOTALL).group(1)
    return parse_config(yaml.safe_load(text), "coreml.md", base_dir=tmp_path)


def test_the_bootstrap_applies_it_to_every_version(tmp_path, monkeypatch) -> None:
    from engine.acoustic import vocoder_backend
    from studio.cli.bootstrap import build_studio

    monkeypatch.setattr(vocoder_backend, "current_system", lambda: "Darwin")  # a Mac with coremltools
    monkeypatch.setattr(vocoder_backend, "coremltools_available", lambda: True)
    config = _docs_config(tmp_path)
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


@pytest.mark.parametrize("system, coremltools_ok, why", [
    ("Linux", True, "Core ML runs only on macOS (this is Linux)"),
    ("Darwin", False, "coremltools is not installed (pip install coremltools, or the [coreml] extra)"),
])
def test_coreml_that_cannot_run_here_is_said_once_naming_what_runs(tmp_path, monkeypatch, capsys, caplog, system,
                                                                    coremltools_ok, why) -> None:
    """--vocoder-backend coreml off macOS or without coremltools: one clear line, naming the vocoder that runs (the
    torch one, on the engine's device and precision); every version then loads the torch vocoder without trying
    Core ML again (so nothing more is said at each load)."""
    import logging

    from engine.acoustic import vocoder_backend
    from engine.versions import VERSIONS
    from studio.cli.bootstrap import build_studio

    monkeypatch.setattr(vocoder_backend, "current_system", lambda: system)
    monkeypatch.setattr(vocoder_backend, "coremltools_available", lambda: coremltools_ok)
    config = _docs_config(tmp_path)
    for flag, asked in (("coreml", "--vocoder-backend coreml"), (None, "the config's vocoder_backend: coreml")):
        with caplog.at_level(logging.INFO):
            studio = build_studio(config, argparse.Namespace(device="cpu", precision=None, vocoder_backend=flag),
                                  scheduler=False, warmup=False)
        said = [line for line in capsys.readouterr().err.splitlines() if "vocoder" in line.lower()]
        assert said == [f"warning: {asked} is not used: {why}; the torch vocoder runs instead, on cpu (fp32)"]
        assert not [r for r in caplog.records if "vocoder" in r.getMessage().lower()]  # not said twice
        caplog.clear()
        assert {studio.default_weights.backend(v)[0] for v in VERSIONS} == {"torch"}
        assert studio.default_weights.coreml_decoders() == ()
    plain = build_studio(config, argparse.Namespace(device="cpu", precision=None, vocoder_backend="torch"),
                         scheduler=False, warmup=False)
    assert plain.vocoder_notice == "" and "vocoder" not in capsys.readouterr().err.lower()
