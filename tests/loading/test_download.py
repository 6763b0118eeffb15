"""`sovits-studio download`: what each version needs, the official layout, resumption, verification,
and the offline message. The hub is never contacted: `hf_hub_download` is replaced by a fake that
writes files the way the real client does (``local_dir/filename``), or the real client runs with
``HF_HUB_OFFLINE=1``."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import socket
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from engine.config import VERSIONS
from engine.data import load_json
from engine.loading import download as dl
from studio.cli import main as cli_main


def _content(repo_id: str, filename: str) -> bytes:
    return f"{repo_id}/{filename}\n".encode() * 3000  # > 8 KiB, distinct per file


class FakeHub:
    """Stands in for huggingface_hub: records calls, writes files where the real client does."""

    def __init__(self, monkeypatch, content=_content, fail_on: set[str] | None = None, error: Exception | None = None,
                 sha: dict[str, str] | None = None):
        import huggingface_hub

        self.calls: list[str] = []
        self.content, self.fail_on, self.error, self.sha = content, fail_on or set(), error, sha or {}
        monkeypatch.setattr(huggingface_hub, "hf_hub_download", self.hf_hub_download)
        monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", self.get_hf_file_metadata)
        monkeypatch.setattr(dl, "_hub_unreachable", lambda: "")  # the fake hub is always there

    def hf_hub_download(self, repo_id, filename, revision=None, local_dir=None, **_):
        self.calls.append(f"{repo_id}/{filename}")
        if self.error is not None and (not self.fail_on or filename in self.fail_on):
            raise self.error
        out = Path(local_dir) / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(self.content(repo_id, filename))
        return str(out)

    def get_hf_file_metadata(self, url, **_):
        name = url.split("/resolve/main/", 1)[1]
        return type("Meta", (), {"etag": f'"{self.sha.get(name, "abc123")}"', "size": None})()


def _with_fake_md5(assets):
    # the official md5 heads cannot be produced by fake bytes: expect the fake content's instead
    return [dataclasses.replace(a, md5_head=hashlib.md5(_content(a.repo_id, a.filename)[:8192]).hexdigest())
            if a.md5_head else a for a in assets]


def test_every_version_gets_the_files_the_official_config_names() -> None:
    """The targets are exactly the paths of the official TTS_Config.default_configs (TTS.py)."""
    defaults = load_json("tts_infer_default.json")["TTS_Config.default_configs"]
    for version in VERSIONS:
        targets = {str(a.target) for a in dl.assets_for([version])}
        folders = {str(PurePosixPath(t).parent) for t in targets}
        section = defaults[version]
        assert section["t2s_weights_path"] in targets, version
        assert section["vits_weights_path"] in targets, version
        assert section["bert_base_path"] in folders and section["cnhuhbert_base_path"] in folders, version
    assert "GPT_SoVITS/pretrained_models/sv/pretrained_eres2netv2w24s4ep4.ckpt" in {
        str(a.target) for a in dl.assets_for(["v2ProPlus"])}
    assert {str(a.target) for a in dl.assets_for(["v3"])} >= {
        f"{dl.BIGVGAN_FOLDER}/config.json", f"{dl.BIGVGAN_FOLDER}/bigvgan_generator.pt"}
    assert "GPT_SoVITS/pretrained_models/gsv-v4-pretrained/vocoder.pth" in {str(a.target) for a in dl.assets_for(["v4"])}
    # shared files are listed once
    both = dl.assets_for(["v3", "v4"])
    assert len(both) == len(set(both))


def test_md5_heads_are_the_official_version_table() -> None:
    from engine.loading.checkpoints import PRETRAINED_MD5

    heads = {a.md5_head for assets in dl.ASSETS.values() for a in assets if a.md5_head}
    assert heads == set(PRETRAINED_MD5)


def test_g2pw_comes_with_v2_and_later_by_default() -> None:
    """The official frontend reads v2+ Mandarin with G2PW (chinese2.py): download fetches it unless told not to."""
    assert dl.G2PW in dl.assets_for(["v2"]) and dl.G2PW in dl.assets_for(["v1", "v4"])
    assert dl.G2PW not in dl.assets_for(["v1"]) and dl.G2PW not in dl.assets_for(["v2"], g2pw=False)
    assert dl.G2PW in dl.assets_for(["v1"], g2pw=True)
    assert "--g2pw" not in dl.check_command(["v2"], ".", True)  # the default needs no flag
    assert "--no-g2pw" in dl.check_command(["v2"], ".", False) and "--g2pw" in dl.check_command(["v1"], ".", True)


def test_unknown_version_is_refused() -> None:
    with pytest.raises(dl.DownloadError, match="--version: unknown version 'v9'"):
        dl.assets_for(["v9"])


def test_download_into_the_official_layout_then_nothing_twice(tmp_path, monkeypatch) -> None:
    hub = FakeHub(monkeypatch)
    assets = _with_fake_md5(dl.assets_for(["v2", "v2Pro"], g2pw=False))
    report = dl.download(tmp_path, assets, log=lambda _: None)
    assert len(report.fetched) == len(assets) and not report.missing
    for a in assets:
        assert (tmp_path / a.target).read_bytes() == _content(a.repo_id, a.filename)
    assert (tmp_path / "GPT_SoVITS/pretrained_models/gsv-v2final-pretrained/s2G2333k.pth").is_file()
    # a second run (or a resumed one) fetches only what is missing
    (tmp_path / assets[-1].target).unlink()
    hub.calls.clear()
    report = dl.download(tmp_path, assets, log=lambda _: None)
    assert hub.calls == [f"{assets[-1].repo_id}/{assets[-1].filename}"]
    assert len(report.present) == len(assets) - 1


def test_a_file_that_is_not_the_official_one_is_removed_and_named(tmp_path, monkeypatch) -> None:
    FakeHub(monkeypatch)
    assets = dl.assets_for(["v2"], g2pw=False)  # the real md5 heads: fake bytes can never match them
    with pytest.raises(dl.DownloadError) as err:
        dl.download(tmp_path, assets, log=lambda _: None)
    sovits = tmp_path / "GPT_SoVITS/pretrained_models/gsv-v2final-pretrained/s2G2333k.pth"
    assert "not the official pretrained file" in str(err.value) and str(sovits.resolve()) in str(err.value)
    assert not sovits.exists()
    assert [a.filename for a in err.value.report.missing] == ["gsv-v2final-pretrained/s2G2333k.pth"]


def test_sha256_from_the_hub_is_checked(tmp_path, monkeypatch) -> None:
    name = "chinese-hubert-base/config.json"
    good = hashlib.sha256(_content(dl.WEIGHTS_REPO, name)).hexdigest()
    assets = [a for a in dl.assets_for([]) if a.filename == name]
    FakeHub(monkeypatch, sha={name: good})
    dl.download(tmp_path, assets, log=lambda _: None)
    (tmp_path / assets[0].target).unlink()
    FakeHub(monkeypatch, sha={name: "0" * 64})
    with pytest.raises(dl.DownloadError, match="sha256"):
        dl.download(tmp_path, assets, log=lambda _: None)
    assert not (tmp_path / assets[0].target).exists()


def test_offline_says_what_is_missing_and_where(tmp_path, monkeypatch) -> None:
    from huggingface_hub.errors import LocalEntryNotFoundError

    hub = FakeHub(monkeypatch, error=LocalEntryNotFoundError("no connection"))
    assets = dl.assets_for(["v4"])
    with pytest.raises(dl.DownloadError) as err:
        dl.download(tmp_path, assets, log=lambda _: None)
    assert len(hub.calls) == 1  # it stops asking once the hub is unreachable
    msg = str(err.value)
    assert "cannot be reached" in msg and f"{len(assets)} file(s) are missing" in msg
    for a in assets:
        assert str((tmp_path / a.installed).resolve()) in msg and a.url in msg


def test_a_refused_request_is_an_error_naming_the_file(tmp_path, monkeypatch) -> None:
    FakeHub(monkeypatch, error=PermissionError("401 gated repo"))
    with pytest.raises(dl.DownloadError, match=r"chinese-hubert-base/config.json failed: PermissionError"):
        dl.download(tmp_path, dl.assets_for([]), log=lambda _: None)


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_g2pw_archive_is_unpacked_to_the_official_folder(tmp_path, monkeypatch) -> None:
    archive = _zip({"G2PWModel_1.1/POLYPHONIC_CHARS.txt": b"x", "G2PWModel_1.1/g2pW.onnx": b"y"})
    FakeHub(monkeypatch, content=lambda repo, name: archive if name.endswith(".zip") else _content(repo, name))
    dl.download(tmp_path, [dl.G2PW], log=lambda _: None)
    folder = tmp_path / "GPT_SoVITS/text/G2PWModel"
    assert (folder / "POLYPHONIC_CHARS.txt").read_bytes() == b"x" and (folder / "g2pW.onnx").is_file()
    assert not (tmp_path / dl.G2PW.target).exists() and dl.is_present(tmp_path, dl.G2PW)


def test_an_archive_escaping_its_folder_is_refused(tmp_path, monkeypatch) -> None:
    archive = _zip({"../../evil.txt": b"x", "POLYPHONIC_CHARS.txt": b"x"})
    FakeHub(monkeypatch, content=lambda repo, name: archive)
    with pytest.raises(dl.DownloadError, match="points outside"):
        dl.download(tmp_path, [dl.G2PW], log=lambda _: None)
    assert not (tmp_path.parent / "evil.txt").exists() and not (tmp_path / "GPT_SoVITS/text/G2PWModel").exists()


def test_cli_check_lists_missing_and_wrong_files(tmp_path, capsys) -> None:
    gpt = tmp_path / "GPT_SoVITS/pretrained_models/s1v3.ckpt"
    sovits = tmp_path / "GPT_SoVITS/pretrained_models/v2Pro/s2Gv2Pro.pth"
    for p in (gpt, sovits):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"not a checkpoint")
    assert cli_main(["download", "--version", "v2Pro", "--root", str(tmp_path), "--check", "--offline"]) == 1
    err = capsys.readouterr().err
    assert f"wrong: v2Pro SoVITS: {sovits}" in err  # present but not the official file (its md5 head)
    assert f"{gpt} is not a PyTorch file" in err  # present, and not even a torch file (its head)
    assert str((tmp_path / dl.SV.target).resolve()) in err  # missing, with its place
    assert str((tmp_path / dl.G2PW.installed).resolve()) in err  # G2PW comes with v2Pro


def test_check_verifies_every_file_by_size_and_head(tmp_path) -> None:
    """Every file the versions need: sizes against the hub's, heads by format (a truncated download, an HTML
    error page, a Git LFS pointer, broken JSON), and the G2PW folder file by file."""
    assets = dl.assets_for(["v4"])
    for a in assets:
        path = tmp_path / a.target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"{}" if a.filename.endswith(".json") else b"PK\x03\x04" + b"\0" * 100)
    g2pw = tmp_path / dl.G2PW.installed
    g2pw.mkdir(parents=True)
    for name in dl.G2PW_FILES:
        (g2pw / name).write_bytes(b"\x08\x07" if name.endswith(".onnx") else b"x")
    (tmp_path / dl.G2PW.target).unlink()
    plain = [a for a in assets if not a.unpack and not a.md5_head]
    sizes = {a: (tmp_path / a.target).stat().st_size for a in plain}  # as the hub reports them
    missing, wrong = dl.check(tmp_path, plain + [dl.G2PW], sizes)
    assert missing == [] and wrong == []
    hubert, config, vocoder = (next(a for a in plain if a.filename.endswith(n))
                               for n in ("hubert-base/pytorch_model.bin", "roberta-wwm-ext-large/config.json",
                                         "vocoder.pth"))
    (tmp_path / hubert.target).write_bytes(b"<!DOCTYPE html><html>rate limited</html>")
    (tmp_path / config.target).write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    (tmp_path / vocoder.target).write_bytes(b"PK\x03\x04")  # cut short
    (g2pw / "char_bopomofo_dict.json").unlink()
    offline = dict(dl.check(tmp_path, plain + [dl.G2PW])[1])  # no sizes: the heads alone
    assert "HTML page" in offline[hubert] and "Git LFS pointer" in offline[config]
    assert vocoder not in offline and "lacks char_bopomofo_dict.json" in offline[dl.G2PW]
    online = dict(dl.check(tmp_path, plain + [dl.G2PW], sizes)[1])
    assert "has 4 bytes, the hub says 104" in online[vocoder]


def test_cli_offline_with_the_real_hub_client(tmp_path, monkeypatch, capsys) -> None:
    """No mock: the real huggingface_hub in offline mode fails fast, and the command says what to do."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    assert cli_main(["download", "--version", "v1", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cannot be reached" in err
    assert str((tmp_path / "GPT_SoVITS/pretrained_models/s2G488k.pth").resolve()) in err
    assert f"sovits-studio download --version v1 --root {tmp_path} --check" in err


def test_an_unreachable_hub_is_said_at_once_without_trying_each_file(tmp_path, monkeypatch) -> None:
    import huggingface_hub

    with socket.socket() as s:  # a port nobody listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda **kw: calls.append(kw))
    with pytest.raises(dl.DownloadError, match=f"the hub cannot be reached: 127.0.0.1:{port}") as err:
        dl.download(tmp_path, dl.assets_for(["v2"]), log=lambda line: None)
    assert calls == [] and len(err.value.report.missing) == len(dl.assets_for(["v2"]))
    assert dl.check_command(["v2", "v2"], tmp_path) == f"sovits-studio download --version v2 --root {tmp_path} --check"


def test_revisions_per_repository_urls_through_hf_endpoint_and_progress(tmp_path, monkeypatch, capsys) -> None:
    """Each repository gets its own revision; printed URLs go through HF_ENDPOINT (a mirror); the progress callback
    hears bytes (the hub's sizes) and files."""
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    hub = FakeHub(monkeypatch)
    revisions_seen = {}
    original = hub.hf_hub_download

    def fetch(repo_id, filename, revision=None, local_dir=None, **kw):
        revisions_seen[repo_id] = revision
        return original(repo_id, filename, revision=revision, local_dir=local_dir, **kw)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fetch)
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata",
                        lambda url, **_: type("Meta", (), {"etag": '"x"', "size": 1000})())
    assets = _with_fake_md5(dl.assets_for(["v3"], g2pw=False))
    progress, lines = [], []
    dl.download(tmp_path, assets, revisions={dl.WEIGHTS_REPO: "abc123"}, log=lines.append, verify_checksums=False,
                on_progress=lambda *p: progress.append(p))
    assert revisions_seen == {dl.WEIGHTS_REPO: "abc123", dl.BIGVGAN_REPO: "main"}
    assert any(line.startswith("[1/") and f"https://mirror.example/{dl.WEIGHTS_REPO}/resolve/abc123/" in line
               for line in lines)
    n = len(assets)
    assert progress[0] == (0, n, 0, 1000 * n) and progress[-1] == (n, n, 1000 * n, 1000 * n)
    assert [p[0] for p in progress] == list(range(n + 1))
    assert dl.G2PW.url == "https://mirror.example/XXXXRT/GPT-SoVITS-Pretrained/resolve/main/G2PWModel.zip"


def test_cli_revision_flags(capsys) -> None:
    from studio.cli.download import parse_revisions

    assert parse_revisions(["v1.0", f"{dl.BIGVGAN_REPO}=deadbeef"]) == {dl.WEIGHTS_REPO: "v1.0",
                                                                          dl.BIGVGAN_REPO: "deadbeef"}
    from engine.errors import OptionsError

    with pytest.raises(OptionsError, match="REPO=REV"):
        parse_revisions(["someone/else=main"])


def test_g2pw_brings_the_official_correction_dictionary(tmp_path, monkeypatch) -> None:
    """Official chinese2.py corrects G2PW's readings with polyphonic.rep / polyphonic-fix.rep (not in the model
    archive): they come from the official repository at the pinned commit, into GPT_SoVITS/text/g2pw/, where
    the engine's G2PW converter reads them."""
    import urllib.request

    from engine.text.chinese.g2pw import correction_files

    assert set(dl.G2PW_CORRECTIONS) <= set(dl.assets_for(["v2"]))
    assert all(dl.OFFICIAL_COMMIT in a.url and a.url.startswith("https://raw.githubusercontent.com/")
               for a in dl.G2PW_CORRECTIONS)
    archive = _zip({"G2PWModel_1.1/POLYPHONIC_CHARS.txt": b"x", "G2PWModel_1.1/g2pW.onnx": b"y"})
    FakeHub(monkeypatch, content=lambda repo, name: archive)
    urls = []

    def urlopen(url, timeout=None):
        urls.append(url)
        return io.BytesIO(f"{url.rsplit('/', 1)[1]}: ['hang2']\n".encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    dl.download(tmp_path, [dl.G2PW, *dl.G2PW_CORRECTIONS], log=lambda _: None)
    assert urls == [a.url for a in dl.G2PW_CORRECTIONS]
    found = correction_files(tmp_path / "GPT_SoVITS/text/G2PWModel")
    assert [p.name for p in found] == ["polyphonic.rep", "polyphonic-fix.rep"]

    def refused(url, timeout=None):
        import urllib.error

        raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)

    (tmp_path / dl.G2PW_CORRECTIONS[0].target).unlink()
    monkeypatch.setattr(urllib.request, "urlopen", refused)
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.download(tmp_path, [dl.G2PW, *dl.G2PW_CORRECTIONS], log=lambda _: None)
