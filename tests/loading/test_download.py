"""`sovits-studio download`: what each version needs, the official layout, resumption, verification,
and the offline message. The hub is never contacted: `hf_hub_download` is replaced by a fake that
writes files the way the real client does (``local_dir/filename``), or the real client runs with
``HF_HUB_OFFLINE=1``. The GitHub files come from an HTTP server on 127.0.0.1 named by the mirror variable."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import io
import json
import socket
import threading
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from engine.config import VERSIONS
from engine.data import load_json
from engine.loading import download as dl
from studio.cli import main as cli_main


def _content(repo_id: str, filename: str) -> bytes:
    """Bytes of the file's kind (torch files are a torch.save-like zip, JSON parses), > 8 KiB, distinct per file."""
    text = f"{repo_id}/{filename}\n" * 3000
    if filename.endswith((".pth", ".ckpt", ".pt", ".bin")):
        return _zip({"archive/data.pkl": text.encode()})
    if filename.endswith(".json"):
        return json.dumps({"name": text}).encode()
    return text.encode()


class FakeHub:
    """Stands in for huggingface_hub: records calls, writes files where the real client does."""

    def __init__(self, monkeypatch, content=_content, fail_on: set[str] | None = None, error: Exception | None = None,
                 sha: dict[str, str] | None = None, sizes: dict[str, int] | None = None):
        import huggingface_hub

        self.calls: list[str] = []
        self.content, self.fail_on, self.error, self.sha = content, fail_on or set(), error, sha or {}
        self.sizes = sizes or {}
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
        return type("Meta", (), {"etag": f'"{self.sha.get(name, "abc123")}"', "size": self.sizes.get(name)})()


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
            z.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)  # the same bytes every time
    return buf.getvalue()


G2PW_ARCHIVE = _zip({f"G2PWModel_1.1/{n}": (b"\x08y" if n.endswith(".onnx") else b"{}" if n.endswith(".json")
                                              else b"x") for n in dl.G2PW_FILES})


def test_g2pw_archive_is_unpacked_to_the_official_folder(tmp_path, monkeypatch) -> None:
    archive = G2PW_ARCHIVE
    FakeHub(monkeypatch, content=lambda repo, name: archive if name.endswith(".zip") else _content(repo, name))
    dl.download(tmp_path, [dl.G2PW], log=lambda _: None)
    folder = tmp_path / "GPT_SoVITS/text/G2PWModel"
    assert (folder / "POLYPHONIC_CHARS.txt").read_bytes() == b"x" and (folder / "g2pW.onnx").is_file()
    assert dl.check(tmp_path, [dl.G2PW]) == ([], [])
    assert not (tmp_path / dl.G2PW.target).exists() and dl.is_present(tmp_path, dl.G2PW)


def test_an_archive_without_every_g2pw_file_is_refused(tmp_path, monkeypatch) -> None:
    archive = _zip({"G2PWModel_1.1/POLYPHONIC_CHARS.txt": b"x", "G2PWModel_1.1/g2pW.onnx": b"\x08y"})
    FakeHub(monkeypatch, content=lambda repo, name: archive)
    with pytest.raises(dl.DownloadError, match="lacks MONOPHONIC_CHARS.txt"):
        dl.download(tmp_path, [dl.G2PW], log=lambda _: None)
    assert not (tmp_path / dl.G2PW.installed).exists() and not (tmp_path / dl.G2PW.target).exists()


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
        path.write_bytes(b"{}" if a.filename.endswith(".json") else _zip({"archive/data.pkl": b"\0" * 100}))
    g2pw = tmp_path / dl.G2PW.installed
    g2pw.mkdir(parents=True)
    for name in dl.G2PW_FILES:
        (g2pw / name).write_bytes(b"\x08\x07" if name.endswith(".onnx") else b"x")
    (tmp_path / dl.G2PW.target).unlink()
    plain = [a for a in assets if not a.unpack and not a.md5_head and not a.source_path]
    sizes = {a: (tmp_path / a.target).stat().st_size for a in plain}  # as the hub reports them
    missing, wrong = dl.check(tmp_path, plain + [dl.G2PW], sizes)
    assert missing == [] and wrong == []
    hubert, config, vocoder = (next(a for a in plain if a.filename.endswith(n))
                               for n in ("hubert-base/pytorch_model.bin", "roberta-wwm-ext-large/config.json",
                                         "vocoder.pth"))
    (tmp_path / hubert.target).write_bytes(b"<!DOCTYPE html><html>rate limited</html>")
    (tmp_path / config.target).write_bytes(b"version https://git-lfs.github.com/spec/v1\n")
    whole = (tmp_path / vocoder.target).read_bytes()
    (tmp_path / vocoder.target).write_bytes(whole[:40])  # cut short
    (g2pw / "char_bopomofo_dict.json").unlink()
    offline = dict(dl.check(tmp_path, plain + [dl.G2PW])[1])  # no sizes: the heads alone
    assert "HTML page" in offline[hubert] and "Git LFS pointer" in offline[config]
    assert "truncated PyTorch file" in offline[vocoder] and "lacks char_bopomofo_dict.json" in offline[dl.G2PW]
    online = dict(dl.check(tmp_path, plain + [dl.G2PW], sizes)[1])
    assert f"has 40 bytes, the hub says {len(whole)}" in online[vocoder]


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
    def metadata(url, **_):  # the size of what the fake hub serves
        repo, rest = url.split("/resolve/", 1)
        size = len(_content("/".join(repo.split("/")[-2:]), rest.split("/", 1)[1]))
        return type("Meta", (), {"etag": '"x"', "size": size})()

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", metadata)
    assets = _with_fake_md5(dl.assets_for(["v3"], g2pw=False))
    total = sum(len(_content(a.repo_id, a.filename)) for a in assets)
    progress, lines = [], []
    dl.download(tmp_path, assets, revisions={dl.WEIGHTS_REPO: "abc123"}, log=lines.append, verify_checksums=False,
                on_progress=lambda *p: progress.append(p))
    assert revisions_seen == {dl.WEIGHTS_REPO: "abc123", dl.BIGVGAN_REPO: "main"}
    assert any(line.startswith("[1/") and f"https://mirror.example/{dl.WEIGHTS_REPO}/resolve/abc123/" in line
               for line in lines)
    n = len(assets)
    assert progress[0] == (0, n, 0, total) and progress[-1] == (n, n, total, total)
    assert [p[0] for p in progress] == list(range(n + 1))
    assert dl.G2PW.url == "https://mirror.example/XXXXRT/GPT-SoVITS-Pretrained/resolve/main/G2PWModel.zip"


def test_cli_revision_flags(capsys) -> None:
    from studio.cli.download import parse_revisions

    assert parse_revisions(["v1.0", f"{dl.BIGVGAN_REPO}=deadbeef"]) == {dl.WEIGHTS_REPO: "v1.0",
                                                                          dl.BIGVGAN_REPO: "deadbeef"}
    from engine.errors import OptionsError

    with pytest.raises(OptionsError, match="REPO=REV"):
        parse_revisions(["someone/else=main"])


@contextlib.contextmanager
def github_mirror(monkeypatch, files: dict[str, tuple[int, bytes]]):
    """An HTTP server on 127.0.0.1 serving ``{url path: (status, body)}``, named by SOVITS_STUDIO_GITHUB_MIRROR;
    yields the list of paths asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server name
            asked.append(self.path)
            status, body = files.get(self.path, (404, b"404: Not Found"))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for key in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(dl.GITHUB_MIRROR_VARIABLE, f"http://127.0.0.1:{server.server_address[1]}/")
    try:
        yield asked
    finally:
        server.shutdown()
        server.server_close()


def _pinned(asset: dl.Asset, body: bytes) -> dl.Asset:
    """The asset with ``body`` as its pinned content (the real tables are not in the test data)."""
    return dataclasses.replace(asset, size=len(body), sha256=hashlib.sha256(body).hexdigest())


def test_g2pw_brings_the_official_correction_tables_through_the_mirror(tmp_path, monkeypatch) -> None:
    """Official chinese2.py corrects G2PW's readings with polyphonic.rep / polyphonic-fix.rep (not in the model
    archive): they come from the official repository at the pinned commit (their pinned length and sha256), into
    GPT_SoVITS/text/g2pw/ where the engine's G2PW converter reads them, through the GitHub mirror variable."""
    from engine.text.chinese.g2pw import correction_files

    assert set(dl.G2PW_CORRECTIONS) <= set(dl.assets_for(["v2"]))
    assert all(dl.OFFICIAL_COMMIT in a.url and a.url.startswith("https://raw.githubusercontent.com/")
               and a.size > 1000 and len(a.sha256) == 64 for a in dl.G2PW_CORRECTIONS)
    archive = G2PW_ARCHIVE
    FakeHub(monkeypatch, content=lambda repo, name: archive)
    bodies = {a: f"{a.filename}: ['hang2']\n".encode() for a in dl.G2PW_CORRECTIONS}
    tables = [_pinned(a, body) for a, body in bodies.items()]
    with github_mirror(monkeypatch, {f"/{a.source_path}": (200, body) for a, body in bodies.items()}) as asked:
        assert all(a.url.startswith("http://127.0.0.1:") for a in tables)
        dl.download(tmp_path, [dl.G2PW, *tables], log=lambda _: None)
    assert asked == [f"/{a.source_path}" for a in tables]
    found = correction_files(tmp_path / "GPT_SoVITS/text/G2PWModel")
    assert [p.name for p in found] == ["polyphonic.rep", "polyphonic-fix.rep"]
    assert [p.read_bytes() for p in found] == list(bodies.values())


@pytest.mark.parametrize("status, body, says", [
    (200, b"polyphonic: ['hang2']\n", "has 22 bytes, the official repository says 1391"),  # cut short
    (200, b"<!DOCTYPE html><html><body>Rate limited</body></html>", "bytes, the official repository says"),
    (404, b"404: Not Found", "HTTP 404"),
])
def test_a_bad_correction_table_is_never_installed_and_the_failure_names_url_and_variable(
        tmp_path, monkeypatch, status, body, says) -> None:
    table = dl.G2PW_CORRECTIONS[0]  # the real pinned length and sha256
    with github_mirror(monkeypatch, {f"/{table.source_path}": (status, body)}):
        url = table.url
        with pytest.raises(dl.DownloadError) as err:
            dl.download(tmp_path, [table], log=lambda _: None)
    msg = str(err.value)
    assert says in msg and url in msg and dl.GITHUB_MIRROR_VARIABLE in msg
    assert not (tmp_path / table.target).exists() and err.value.report.missing == [table]


def test_an_unreachable_github_names_the_url_and_the_variable(tmp_path, monkeypatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(dl.GITHUB_MIRROR_VARIABLE, f"http://127.0.0.1:{port}")
    with pytest.raises(dl.DownloadError) as err:
        dl.download(tmp_path, list(dl.G2PW_CORRECTIONS), log=lambda _: None)
    msg = str(err.value)
    assert all(a.url in msg for a in dl.G2PW_CORRECTIONS) and f"set {dl.GITHUB_MIRROR_VARIABLE}" in msg


HTML = b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head></html>"


@pytest.mark.parametrize("name, bad, says", [
    ("chinese-hubert-base/pytorch_model.bin", HTML, "an HTML page"),
    ("chinese-hubert-base/config.json", b'{"error": "Entry not found"}', "a JSON error answer (Entry not found)"),
    ("s1v3.ckpt", b"", "truncated PyTorch file"),  # b"": the first 100 bytes of the real content
    ("G2PWModel.zip", b"", "not a whole zip archive"),
])
def test_a_download_that_is_not_the_file_is_never_installed(tmp_path, monkeypatch, name, bad, says) -> None:
    """An error page, a JSON error answer or a cut-short file that lands in a file's place is refused and removed;
    the message names the file and what it is."""
    archive = G2PW_ARCHIVE

    def content(repo, filename):
        good = archive if filename.endswith(".zip") else _content(repo, filename)
        return (bad or good[:100]) if filename == name else good

    hub = FakeHub(monkeypatch, content=content)
    assets = [a for a in dl.assets_for(["v3"], g2pw=True) if not a.source_path and not a.md5_head]
    asset = next(a for a in assets if a.filename == name)
    with pytest.raises(dl.DownloadError) as err:
        dl.download(tmp_path, assets, log=lambda _: None)
    assert says in str(err.value) and str((tmp_path / asset.installed).resolve()) in str(err.value)
    assert err.value.report.missing == [asset] and len(hub.calls) == len(assets)  # the others were fetched
    assert not (tmp_path / asset.target).exists() and not dl.is_present(tmp_path, asset)
    assert dl.check(tmp_path, [a for a in assets if a != asset]) == ([], [])


def test_a_download_of_another_size_than_the_hub_says_is_refused(tmp_path, monkeypatch) -> None:
    name = "chinese-hubert-base/pytorch_model.bin"
    asset = next(a for a in dl.assets_for([]) if a.filename == name)
    FakeHub(monkeypatch, sizes={name: len(_content(asset.repo_id, name)) + 1})
    with pytest.raises(dl.DownloadError, match=r"bytes, the hub says"):
        dl.download(tmp_path, [asset], log=lambda _: None, verify_checksums=False)  # the size even so
    assert not (tmp_path / asset.target).exists()


def test_a_rerun_fetches_again_what_fails_the_check_instead_of_skipping_it(tmp_path, monkeypatch) -> None:
    """Files already in place are checked as fetched ones are (their heads, and their sizes when the hub says
    them): a page saved in a file's place, a cut-short file or a half-unpacked G2PW folder is fetched again."""
    archive = G2PW_ARCHIVE
    assets = [a for a in dl.assets_for(["v3"], g2pw=True) if not a.source_path and not a.md5_head]
    sizes = {a.filename: len(_content(a.repo_id, a.filename)) for a in assets if not a.unpack}
    hub = FakeHub(monkeypatch, content=lambda r, n: archive if n.endswith(".zip") else _content(r, n), sizes=sizes)
    dl.download(tmp_path, assets, log=lambda _: None)
    page, cut, folder = (next(a for a in assets if a.filename == n)
                         for n in ("chinese-hubert-base/config.json", "s1v3.ckpt", "G2PWModel.zip"))
    (tmp_path / page.target).write_bytes(HTML)
    good = (tmp_path / cut.target).read_bytes()
    (tmp_path / cut.target).write_bytes(good[:-10])  # its size is not the hub's (and its zip directory is cut)
    (tmp_path / folder.installed / "g2pW.onnx").unlink()
    hub.calls.clear()
    lines: list[str] = []
    report = dl.download(tmp_path, assets, log=lines.append)
    assert sorted(hub.calls) == sorted(f"{a.repo_id}/{a.filename}" for a in (page, cut, folder))
    assert set(report.refetched) == {page, cut, folder} and len(report.present) == len(assets) - 3
    assert (tmp_path / cut.target).read_bytes() == good and dl.check(tmp_path, assets) == ([], [])
    assert any(line.startswith("fetching again") and f"{page.target}" in line for line in lines)


def test_download_g2pw_alone_fetches_g2pw_and_not_the_v2_weights(tmp_path, monkeypatch, capsys) -> None:
    """`download --g2pw` (the command the G2PW notice prints) brings G2PW, not the v2 weights with it."""
    from engine.text.chinese import g2pw_fetch_command

    fetched = []

    def fake_download(root, assets, **kw):
        fetched.extend(assets)
        return dl.DownloadReport(fetched=list(assets))

    monkeypatch.setattr(dl, "download", fake_download)
    assert cli_main(g2pw_fetch_command(tmp_path).split()[1:]) == 0
    assert fetched == [dl.G2PW, *dl.G2PW_CORRECTIONS]
    fetched.clear()
    assert cli_main(["download", "--version", "v2", "--g2pw", "--root", str(tmp_path)]) == 0
    assert dl.G2PW in fetched and dl.ASSETS["v2"][1] in fetched  # with a version: the version and G2PW
    capsys.readouterr()
    assert cli_main(["download", "--g2pw", "--root", str(tmp_path), "--check", "--offline"]) == 1
    err = capsys.readouterr().err
    assert "3 file(s) are missing" in err and "s2G2333k" not in err
    assert f"sovits-studio download --g2pw --root {tmp_path} --check" in err
