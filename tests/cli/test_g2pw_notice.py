"""Without G2PW, every front door says the same thing: serve/synth/webui (build_studio), cluster, and the page,
whose notice reaches the browser whole (a bare ``<model folder>`` would be an HTML tag to markdown)."""

from __future__ import annotations

import argparse
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
import yaml

from engine.text.chinese import g2pw_fetch_command, g2pw_fix


def _config(tmp_path, version="v2"):
    section = {"version": version, "device": "cpu", "is_half": False, "t2s_weights_path": "g.ckpt",
               "vits_weights_path": "s.pth", "bert_base_path": "bert", "cnhuhbert_base_path": "hubert"}
    path = tmp_path / "tts_infer.yaml"
    path.write_text(yaml.safe_dump({"custom": section}))
    return path


def test_cluster_prints_the_g2pw_notice_that_serve_prints(tmp_path, monkeypatch, capsys) -> None:
    from engine.config import load_config
    from studio.cli import build_parser
    from studio.cli import cluster as cluster_cli
    from studio.cli.bootstrap import build_studio
    from studio.cluster import launch

    path = _config(tmp_path)
    monkeypatch.chdir(tmp_path)
    build_studio(load_config(path), argparse.Namespace(device="cpu", precision=None), warmup=False, scheduler=False)
    serve_note = next(line for line in capsys.readouterr().err.splitlines() if "G2PW" in line)
    assert serve_note.startswith("note: Mandarin polyphones are read with pypinyin")
    assert "sovits-studio download --g2pw --root" in serve_note

    class Stop(Exception):
        pass

    def deploy(config):
        raise Stop  # the notices are printed before the cluster starts

    monkeypatch.setattr(launch, "deploy", deploy)
    with pytest.raises(Stop):
        cluster_cli.run(build_parser("cluster").parse_args(["-c", str(path)]))
    assert serve_note in capsys.readouterr().err.splitlines()
    with pytest.raises(Stop):  # v1: the official v1 frontend never uses G2PW, nothing to say
        cluster_cli.run(build_parser("cluster").parse_args(["-c", str(_config(tmp_path, "v1"))]))
    assert "G2PW" not in capsys.readouterr().err


class _Visible(HTMLParser):
    """The text a browser shows for some HTML (tags, known or not, show nothing)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.mark.parametrize("locale", ["en", "zh-CN", "ja", "ko"])
def test_the_pages_g2pw_notice_is_shown_whole(tmp_path, locale) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    from webui.app import UISettings, _notice

    base = tmp_path / "weights"
    problem, command = g2pw_fix("v2", base / "GPT_SoVITS/text/G2PWModel", base)
    assert problem and command == g2pw_fetch_command(base)
    studio = SimpleNamespace(runtime=SimpleNamespace(device="cpu"), g2pw_fix=(problem, command),
                             default_weights=SimpleNamespace(base_dir=base))
    notice = _notice(studio, UISettings(), locale)
    html = markdown_it.MarkdownIt("commonmark", {"html": True}).render(notice)  # as the page's markdown does
    shown = _Visible()
    shown.feed(html)
    text = "".join(shown.text)
    assert "no G2PW model at <model folder>/GPT_SoVITS/text/G2PWModel" in text  # the whole reason
    assert "sovits-studio download --g2pw --root <model folder>" in text  # and the whole command
    assert str(base) not in text  # no server path
