"""The official pretrained files each model version needs, fetched into the official folder layout.

Layout (official ``TTS.py`` ``TTS_Config.default_configs``): everything under
``<root>/GPT_SoVITS/pretrained_models/``, the paths the
official ``tts_infer.yaml`` names, so a downloaded tree works with both the official code and ours.
Sources: the official weight repo ``lj1995/GPT-SoVITS`` on the Hugging Face hub, NVIDIA's
``nvidia/bigvgan_v2_24khz_100band_256x`` for the v3 vocoder, and the G2PW archive from
``XXXXRT/GPT-SoVITS-Pretrained`` (the mirror the official installer uses; with any v2+ version by default, as the
official frontend reads v2+ Mandarin with it), and G2PW's two correction tables from the official repository on
GitHub at the commit we follow (pinned length and sha256). Each repository has its own revision; hub URLs go
through ``HF_ENDPOINT`` as the hub client's do, GitHub URLs through ``SOVITS_STUDIO_GITHUB_MIRROR`` (a base URL that
stands in for ``https://raw.githubusercontent.com``).

``huggingface_hub`` is imported only when something is actually fetched. Downloads resume (the hub
client keeps partial files next to the target) and show its per-file bars; ``on_progress`` follows the
whole download (bytes and files). Every file is checked as it lands, before it counts as installed: the size
(and sha256) the hub reports, for the pretrained SoVITS files the md5 of their first 8 KiB that the official
version detection keys on (``process_ckpt.py`` ``get_sovits_version_from_path_fast``), and its head for its kind
(:func:`file_head_problem`: never an HTML or JSON error page, a Git LFS pointer or a truncated zip). A file that
fails is removed. A rerun checks the files already there the same way (sizes when the hub answers) and fetches
again any that fail, instead of skipping them as present. :func:`check` verifies an installed tree without
fetching.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from engine.errors import CheckpointError, EngineError
from engine.loading.file_head import md5_head
from engine.versions import VERSIONS

WEIGHTS_REPO = "lj1995/GPT-SoVITS"
BIGVGAN_REPO = "nvidia/bigvgan_v2_24khz_100band_256x"
G2PW_REPO = "XXXXRT/GPT-SoVITS-Pretrained"
PRETRAINED = "GPT_SoVITS/pretrained_models"
BIGVGAN_FOLDER = f"{PRETRAINED}/models--nvidia--bigvgan_v2_24khz_100band_256x"


class DownloadError(EngineError):
    """Files could not be fetched (offline, refused, or corrupt); the message lists what and where."""

    def __init__(self, message: str, report: "DownloadReport | None" = None):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Asset:
    """One file of a hub repo and where it goes: ``<root>/<folder>/<filename>`` (the hub client's
    ``local_dir`` layout). With ``unpack`` the file is a zip extracted into ``<root>/<unpack>``."""

    repo_id: str
    filename: str  # path inside the repo (its folders are kept below `folder`)
    folder: str  # destination folder relative to the GPT-SoVITS root
    what: str  # what it is, for messages
    md5_head: str = ""  # md5 of the first 8 KiB when known (the official version detection table)
    unpack: str = ""  # for archives: the folder they are extracted to
    unpack_markers: tuple[str, ...] = ()  # files that prove an extracted archive is complete
    source_path: str = ""  # a file on GitHub (raw.githubusercontent.com/<source_path>), fetched as it is
    size: int = 0  # bytes, when pinned here (the GitHub files); 0: the hub says, or nobody
    sha256: str = ""  # pinned sha256 (the GitHub files); hub files: the hub says

    @property
    def source_url(self) -> str:
        """Where a GitHub file comes from, through ``SOVITS_STUDIO_GITHUB_MIRROR`` when set ("" for hub files)."""
        return f"{github_raw()}/{self.source_path}" if self.source_path else ""

    @property
    def target(self) -> PurePosixPath:
        return PurePosixPath(self.folder) / self.filename

    @property
    def installed(self) -> PurePosixPath:
        """What must exist once the asset is in place (the file, or the extracted folder)."""
        return PurePosixPath(self.unpack) if self.unpack else self.target

    @property
    def url(self) -> str:
        return self.url_at("main")

    def url_at(self, revision: str) -> str:
        """Where the file is fetched from: through ``HF_ENDPOINT`` (a mirror) when it is set, as the hub client."""
        if self.source_url:
            return self.source_url
        return f"{hub_endpoint()}/{self.repo_id}/resolve/{revision}/{self.filename}"


def hub_endpoint() -> str:
    """The hub the client talks to: ``HF_ENDPOINT`` (e.g. a mirror), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


GITHUB_MIRROR_VARIABLE = "SOVITS_STUDIO_GITHUB_MIRROR"
GITHUB_RAW = "https://raw.githubusercontent.com"


def github_raw() -> str:
    """Where the GitHub files come from: ``SOVITS_STUDIO_GITHUB_MIRROR`` (a base URL serving the same paths as
    raw.githubusercontent.com, e.g. a mirror or a proxy), else raw.githubusercontent.com itself."""
    return (os.environ.get(GITHUB_MIRROR_VARIABLE) or GITHUB_RAW).rstrip("/")


def mirror_hint(asset: "Asset") -> str:
    """The variable that points ``asset``'s downloads at a mirror, as a sentence."""
    if asset.source_path:
        return (f"set {GITHUB_MIRROR_VARIABLE} to a mirror of {GITHUB_RAW} (now {github_raw()}), or HTTPS_PROXY "
                "to a proxy")
    return f"set HF_ENDPOINT to a mirror of the Hugging Face hub (now {hub_endpoint()}), or HTTPS_PROXY to a proxy"


def _lj(filename: str, what: str, md5: str = "") -> Asset:
    return Asset(WEIGHTS_REPO, filename, PRETRAINED, what, md5)


HUBERT = tuple(_lj(f"chinese-hubert-base/{n}", "HuBERT (SSL features of the reference)")
               for n in ("config.json", "preprocessor_config.json", "pytorch_model.bin"))
ROBERTA = tuple(_lj(f"chinese-roberta-wwm-ext-large/{n}", "Chinese RoBERTa (BERT features)")
                for n in ("config.json", "tokenizer.json", "pytorch_model.bin"))
GPT_V1 = _lj("s1bert25hz-2kh-longer-epoch=68e-step=50232.ckpt", "v1 GPT")
GPT_V2 = _lj("gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt", "v2 GPT")
GPT_V3 = _lj("s1v3.ckpt", "GPT of v3, v4, v2Pro and v2ProPlus")
SV = _lj("sv/pretrained_eres2netv2w24s4ep4.ckpt", "ERes2NetV2 speaker-verification net (v2Pro*)")
BIGVGAN = tuple(Asset(BIGVGAN_REPO, n, BIGVGAN_FOLDER, "BigVGAN v2 24 kHz vocoder (v3)")
                for n in ("config.json", "bigvgan_generator.pt"))

# md5 heads: the official `hash_pretrained_dict` (process_ckpt.py; engine.loading.checkpoints.PRETRAINED_MD5)
ASSETS: dict[str, tuple[Asset, ...]] = {
    "v1": (GPT_V1, _lj("s2G488k.pth", "v1 SoVITS", "dc3c97e17592963677a4a1681f30c653")),
    "v2": (GPT_V2, _lj("gsv-v2final-pretrained/s2G2333k.pth", "v2 SoVITS", "6642b37f3dbb1f76882b69937c95a5f3")),
    "v3": (GPT_V3, _lj("s2Gv3.pth", "v3 SoVITS", "43797be674a37c1c83ee81081941ed0f"), *BIGVGAN),
    "v4": (GPT_V3, _lj("gsv-v4-pretrained/s2Gv4.pth", "v4 SoVITS", "4f26b9476d0c5033e04162c486074374"),
           _lj("gsv-v4-pretrained/vocoder.pth", "v4 vocoder (48 kHz)")),
    "v2Pro": (GPT_V3, _lj("v2Pro/s2Gv2Pro.pth", "v2Pro SoVITS", "c7e9fce2223f3db685cdfa1e6368728a"), SV),
    "v2ProPlus": (GPT_V3, _lj("v2Pro/s2Gv2ProPlus.pth", "v2ProPlus SoVITS", "66b313e39455b57ab1b0bc0b239c9d0a"),
                  SV),
}
G2PW = Asset(G2PW_REPO, "G2PWModel.zip", "GPT_SoVITS/text", "G2PW polyphone model (Mandarin, v2+)",
             unpack="GPT_SoVITS/text/G2PWModel", unpack_markers=("POLYPHONIC_CHARS.txt",))
OFFICIAL_REPO = "RVC-Boss/GPT-SoVITS"
OFFICIAL_COMMIT = "48b1a0169a28582a8984402f82cf438d3bfa6aca"  # the official code we stay compatible with
# G2PW's word corrections, which official chinese2.py applies after the model (not in the model archive):
# (name, bytes, sha256) of the files at OFFICIAL_COMMIT
G2PW_TABLES = (
    ("polyphonic.rep", 1391, "a8f13e2004702cbbf01e2e3fe8436d9d620a0fe4d57176a844704619ffd5df5e"),
    ("polyphonic-fix.rep", 1660967, "bbfac0e43e5b1db56566e5eb8b147f7e9b57175e07ffe6303195ee6563682f6b"),
)
G2PW_CORRECTIONS = tuple(
    Asset(OFFICIAL_REPO, name, "GPT_SoVITS/text/g2pw", f"G2PW correction dictionary {name} (official)",
          source_path=f"{OFFICIAL_REPO}/{OFFICIAL_COMMIT}/GPT_SoVITS/text/g2pw/{name}", size=size, sha256=sha)
    for name, size, sha in G2PW_TABLES)


def wants_g2pw(versions: Iterable[str]) -> bool:
    """G2PW by default: the official frontend reads v2+ Mandarin with it (chinese2.py, ``is_g2pw = True``)."""
    return any(v != "v1" for v in versions)


def assets_for(versions: Iterable[str], *, g2pw: bool | None = None) -> list[Asset]:
    """Every file the given versions need (shared files once), in a stable order; ``g2pw`` None: with v2+.
    No versions and ``g2pw`` True: G2PW alone (its model and correction tables)."""
    versions = list(versions)
    if not versions and g2pw:
        return [G2PW, *G2PW_CORRECTIONS]
    g2pw = wants_g2pw(versions) if g2pw is None else g2pw
    chosen: list[Asset] = [*HUBERT, *ROBERTA]
    for version in versions:
        if version not in ASSETS:
            raise DownloadError(f"--version: unknown version {version!r}; use one of {', '.join(VERSIONS)} or all")
        chosen += ASSETS[version]
    if g2pw:
        chosen += [G2PW, *G2PW_CORRECTIONS]
    return list(dict.fromkeys(chosen))


# ---- checking what is there ------------------------------------------------------------------


def is_present(root: Path, asset: Asset) -> bool:
    """Something is in the asset's place (a non-empty file, or the extracted folder with its markers); whether it
    is the right thing is :func:`installed_problem`'s question."""
    path = Path(root) / asset.installed
    if asset.unpack:
        return path.is_dir() and all((path / m).is_file() for m in asset.unpack_markers)
    return path.is_file() and path.stat().st_size > 0


def verify(root: Path, asset: Asset, expected_sha256: str = "", expected_size: int | None = None) -> None:
    """Raise CheckpointError if a present file is not the official one (as far as we can tell): its size and sha256
    against the given ones (else the asset's pinned ones), the official md5 of its head."""
    path = Path(root) / asset.target
    if not path.is_file() or path.stat().st_size == 0:
        raise CheckpointError(f"{asset.what}: {path} is missing or empty")
    size = path.stat().st_size
    expected_size = expected_size if expected_size is not None else (asset.size or None)
    expected_sha256 = expected_sha256 or asset.sha256
    source = "the official repository" if asset.source_path else "the hub"
    if expected_size is not None and size != expected_size:
        raise CheckpointError(f"{asset.what}: {path} has {size} bytes, {source} says {expected_size}; "
                              f"delete it and download again")
    if asset.md5_head and (got := md5_head(path)) != asset.md5_head:
        raise CheckpointError(f"{asset.what}: {path} is not the official pretrained file (its first 8 KiB have "
                              f"md5 {got}, expected {asset.md5_head}); delete it and download again")
    if expected_sha256 and (digest := _sha256(path)) != expected_sha256:
        raise CheckpointError(f"{asset.what}: {path} has sha256 {digest}, {source} says {expected_sha256}; "
                              f"delete it and download again")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


HEAD_PEEK = 64  # bytes read to tell a file's format
ERROR_BODY_LIMIT = 64 << 10  # a JSON body this small that names an error is a server's answer, not a file
G2PW_FILES = ("POLYPHONIC_CHARS.txt", "MONOPHONIC_CHARS.txt", "bopomofo_to_pinyin_wo_tune_dict.json",
              "char_bopomofo_dict.json", "config.py", "g2pW.onnx")  # what the G2PW converter reads
_ERROR_KEYS = {"error", "errors", "detail", "message", "code", "status", "statusCode"}


def _error_body(path: Path, head: bytes) -> str:
    """The message of a JSON error answer saved in the file's place ({"error": "Entry not found"}), else ""."""
    if not head.lstrip().startswith(b"{") or path.stat().st_size > ERROR_BODY_LIMIT:
        return ""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return ""
    if isinstance(body, dict) and body and ("error" in body or set(body) <= _ERROR_KEYS):
        return str(body.get("error") or body.get("message") or body.get("detail") or body)[:200]
    return ""


def file_head_problem(path: Path) -> str:
    """What is wrong with a fetched file for its kind ("" when it looks right): never an HTML page, a JSON error
    answer or a Git LFS pointer; PyTorch files (.pth .ckpt .pt .bin) are a torch.save zip (whole: its central
    directory at the end is there, so a cut-short download shows) or a pickle, zips are whole, JSON files parse,
    ONNX files are protobuf, text tables are UTF-8."""
    with open(path, "rb") as f:
        head = f.read(HEAD_PEEK)
    if head.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the file itself"
    if head.lstrip()[:15].lower().startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        return "an HTML page (an error or login page), not the file"
    if error := _error_body(path, head):
        return f"a JSON error answer ({error}), not the file"
    suffix = path.suffix.lower()
    zipped = head[2:4] == b"\x03\x04"  # a zip (official my_save2 writes a 2-byte version tag over its "PK")
    if suffix in (".pth", ".ckpt", ".pt", ".bin"):
        if not (zipped or head[:1] == b"\x80"):
            return "not a PyTorch file (neither a torch.save zip nor a pickle)"
        if zipped and not zipfile.is_zipfile(path):
            return "a truncated PyTorch file (its zip directory is missing: the download was cut short)"
    if suffix == ".zip" and not (zipped and zipfile.is_zipfile(path)):
        return "not a whole zip archive (truncated, or not a zip)"
    if suffix == ".json":
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            return f"not valid JSON ({e})"
    if suffix == ".onnx" and head[:1] not in (b"\x08", b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x3a"):
        return "not an ONNX model"
    if suffix in (".rep", ".txt"):
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            return "not a UTF-8 text table"
    return ""


def installed_problem(root: str | os.PathLike, asset: Asset, expected_size: int | None = None) -> str:
    """What is wrong with an asset that :func:`is_present` finds ("" when it looks official): its size against
    ``expected_size`` (the hub's) or its pinned one, its official md5 head, its head for its kind; an extracted
    archive file by file."""
    root = Path(root)
    if asset.unpack:
        folder = root / asset.installed
        if lacking := [n for n in G2PW_FILES if not (folder / n).is_file() or not (folder / n).stat().st_size]:
            return f"{asset.what}: {folder} lacks {', '.join(lacking)}; delete it and download again"
        if problem := file_head_problem(folder / "g2pW.onnx"):
            return f"{asset.what}: {folder / 'g2pW.onnx'} is {problem}; delete the folder and download again"
        return ""
    try:
        verify(root, asset, expected_size=expected_size)
    except CheckpointError as e:
        return str(e)
    if problem := file_head_problem(root / asset.target):
        return f"{asset.what}: {root / asset.target} is {problem}; delete it and download again"
    return ""


def check(root: str | os.PathLike, assets: Sequence[Asset],
          sizes: Mapping[Asset, int] | None = None) -> tuple[list[Asset], list[tuple[Asset, str]]]:
    """Check of an installed tree: (missing assets, [(asset, problem)] for present but wrong ones). Every file is
    checked by :func:`installed_problem`, with ``sizes`` (bytes the hub reports, see :func:`hub_sizes`) when given."""
    missing, wrong = [], []
    for a in assets:
        if not is_present(root, a):
            missing.append(a)
        elif problem := installed_problem(root, a, (sizes or {}).get(a)):
            wrong.append((a, problem))
    return missing, wrong


def missing_message(root: Path, missing: Sequence[Asset], reason: str = "",
                    check_command: str = "sovits-studio download --check",
                    revisions: Mapping[str, str] | None = None) -> str:
    """What is missing, where to get it, exactly where to put it, and the variable that points at a mirror."""
    lines = [f"{len(missing)} file(s) are missing{f' ({reason})' if reason else ''}:"]
    for a in missing:
        dest = (Path(root) / a.installed).resolve()
        url = a.url_at((revisions or {}).get(a.repo_id, "main"))
        how = f"unzip {url} there (one folder holding {', '.join(a.unpack_markers)})" if a.unpack else url
        lines.append(f"  {a.what}: {dest}\n      from {how}")
    hints = dict.fromkeys(mirror_hint(a) for a in missing)
    lines.append(f"Behind a firewall: {'; '.join(hints)}.")
    lines.append("Put each file at the path shown (the official GPT-SoVITS layout), then run "
                 f"`{check_command}` to verify.")
    return "\n".join(lines)


# ---- fetching --------------------------------------------------------------------------------


@dataclass
class DownloadReport:
    fetched: list[Asset] = field(default_factory=list)
    present: list[Asset] = field(default_factory=list)
    missing: list[Asset] = field(default_factory=list)
    refetched: list[Asset] = field(default_factory=list)  # were present, failed the check, fetched again


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise DownloadError("huggingface_hub is not installed: `pip install huggingface_hub`") from e
    return huggingface_hub


def check_command(versions: Iterable[str], root: str | os.PathLike, g2pw: bool | None = None) -> str:
    """The ``download --check`` command for these versions and root (what the CLI and the page both print)."""
    versions = list(dict.fromkeys(versions))
    flag = [] if g2pw is None or g2pw == wants_g2pw(versions) else ["--g2pw" if g2pw else "--no-g2pw"]
    return " ".join(["sovits-studio download", *(f"--version {v}" for v in versions), *flag, f"--root {root}",
                     "--check"])


def _hub_unreachable(timeout: float = 3.0) -> str:
    """Why the hub cannot be reached now, or "" when it accepts a connection. Checked once before fetching,
    so an offline machine hears it at once rather than after the hub client's retries. Behind a proxy the
    client knows best: no check."""
    import huggingface_hub.constants as hc

    if hc.HF_HUB_OFFLINE:
        return "offline mode is on (HF_HUB_OFFLINE)"
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return ""
    url = urlsplit(hc.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return ""
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"


_OFFLINE_ERRORS = {"OfflineModeIsEnabled", "LocalEntryNotFoundError", "ConnectionError", "ConnectError", "Timeout",
                   "TimeoutException", "ReadTimeout", "ConnectTimeout", "NetworkError", "ProxyError", "SSLError",
                   "URLError"}


def _is_offline_error(e: BaseException) -> bool:
    """Connection trouble (as opposed to a refused or corrupt file): the rest would fail the same way."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & _OFFLINE_ERRORS) or isinstance(e, (ConnectionError, TimeoutError))


def _hub_checksum(hub, asset: Asset, revision: str) -> tuple[str, int | None]:
    """(sha256, size) the hub reports for an LFS file; ("", None) when it cannot tell."""
    try:
        meta = hub.get_hf_file_metadata(hub.hf_hub_url(asset.repo_id, asset.filename, revision=revision))
    except Exception:  # noqa: BLE001 - the file itself was fetched; a failing HEAD only means less checking
        return "", None
    etag = (getattr(meta, "etag", "") or "").strip('"').lower()
    sha = etag if len(etag) == 64 and all(c in "0123456789abcdef" for c in etag) else ""
    size = getattr(meta, "size", None)
    return sha, size if isinstance(size, int) else None


def _unpack(zip_path: Path, dest: Path, asset: Asset) -> None:
    """Extract a zip into ``dest``; a single top folder (e.g. ``G2PWModel_1.1/``) becomes ``dest`` itself.
    Members that would land outside ``dest`` are refused; so is an archive whose files fail their checks."""
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with zipfile.ZipFile(zip_path) as z:
            for member in z.namelist():
                if not (staging / member).resolve().is_relative_to(staging.resolve()):
                    raise CheckpointError(f"{asset.what}: archive member {member!r} points outside the folder")
            if (bad := z.testzip()) is not None:
                raise CheckpointError(f"{asset.what}: archive member {bad!r} is corrupt (CRC mismatch); "
                                      "delete it and retry")
            z.extractall(staging)
        tops = [p for p in staging.iterdir() if not p.name.startswith("__MACOSX")]
        inner = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
        missing = [m for m in asset.unpack_markers if not (inner / m).is_file()]
        if missing:
            raise CheckpointError(f"{asset.what}: the archive lacks {', '.join(missing)}")
        shutil.rmtree(dest, ignore_errors=True)
        inner.rename(dest)
    except (zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{asset.what}: {zip_path} is not a valid zip ({e}); delete it and retry") from e
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_url(url: str, target: Path, timeout: float = 30.0) -> None:
    """A file outside the hub, written whole or not at all (proxies from the environment, as urllib does)."""
    import urllib.error
    import urllib.request

    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            shutil.copyfileobj(response, out)
    except urllib.error.HTTPError as e:  # the server answered: not a connection problem
        partial.unlink(missing_ok=True)
        raise DownloadError(f"fetching {url} failed: HTTP {e.code} {e.reason}") from e
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)


def _landed(root: Path, a: Asset, sha: str, size: int | None) -> None:
    """The checks of a file that just landed (CheckpointError when it fails): size, sha256 and md5 head as
    :func:`verify`, then its head for its kind."""
    verify(root, a, sha, size)
    if problem := file_head_problem(root / a.target):
        raise CheckpointError(f"{a.what}: the download of {root / a.target} is {problem}")


def _fetch_one(hub, root: Path, a: Asset, revision: str, verify_checksums: bool) -> None:
    if a.source_path:
        url = a.source_url
        try:
            _fetch_url(url, root / a.target)
        except DownloadError as e:
            raise DownloadError(f"{e}; {mirror_hint(a)}") from e
        _landed(root, a, "", None)  # the pinned size and sha256
        return
    local_dir = root / a.folder
    local_dir.mkdir(parents=True, exist_ok=True)
    got = Path(hub.hf_hub_download(repo_id=a.repo_id, filename=a.filename, revision=revision,
                                   local_dir=str(local_dir)))
    if got.resolve() != (root / a.target).resolve():  # a hub client that answers with a cache path
        (root / a.target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(got, root / a.target)
    sha, size = _hub_checksum(hub, a, revision)  # the size where the hub gives one, always
    _landed(root, a, sha if verify_checksums else "", size)
    if a.unpack:
        _unpack(root / a.target, root / a.unpack, a)
        (root / a.target).unlink(missing_ok=True)
        if problem := installed_problem(root, a):  # the extracted folder, file by file
            raise CheckpointError(problem)


def _remove(root: Path, a: Asset) -> None:
    """Take a failed file (or extracted folder) out of its place, so it never passes for an installed one."""
    (root / a.target).unlink(missing_ok=True)
    if a.unpack:
        shutil.rmtree(root / a.unpack, ignore_errors=True)


Progress = Callable[[int, int, int, int], None]  # (files done, files to fetch, bytes done, bytes to fetch)


def download(
    root: str | os.PathLike,
    assets: Sequence[Asset],
    *,
    revisions: Mapping[str, str] | None = None,
    verify_checksums: bool = True,
    log: Callable[[str], None] = print,
    check_command: str = "sovits-studio download --check",
    on_progress: Progress | None = None,
) -> DownloadReport:
    """Fetch every asset not yet in place under ``root``, and again every one in place that fails its check
    (:func:`installed_problem`, with the hub's sizes when it answers). Every fetched file is checked as it lands
    and removed when it fails. Raises DownloadError listing what is still missing (where it goes, and the
    variable that points at a mirror) when a source cannot be reached or a download is corrupt.

    ``revisions``: repository -> branch, tag or commit (default main for each). ``on_progress`` hears the files
    and bytes fetched so far against the totals (sizes the hub reports; 0 when it does not say)."""
    root = Path(root)
    revisions = dict(revisions or {})
    report = DownloadReport()
    present = [a for a in assets if is_present(root, a)]
    unreachable = _hub_unreachable() if any(not a.source_path for a in assets) else ""
    hub = _hub()
    present_sizes = {a: size for a in present if not a.unpack and not a.source_path and not unreachable
                     and (size := _hub_checksum(hub, a, revisions.get(a.repo_id, "main"))[1])}
    todo: list[Asset] = []
    for a in assets:
        if a not in present:
            todo.append(a)
        elif problem := installed_problem(root, a, present_sizes.get(a)):
            log(f"fetching again: {problem}")
            _remove(root, a)
            report.refetched.append(a)
            todo.append(a)
        else:
            report.present.append(a)
    if not todo:
        log(f"all {len(assets)} file(s) are present under {root.resolve()}")
        return report
    if unreachable and any(not a.source_path for a in todo):
        report.missing = todo
        raise DownloadError(missing_message(root, todo, f"the hub cannot be reached: {unreachable}", check_command,
                                            revisions), report)
    offline = ""
    failures: list[str] = []
    sizes = [a.size if a.source_path else _hub_checksum(hub, a, revisions.get(a.repo_id, "main"))[1] or 0
             for a in todo] if on_progress else []
    done_bytes = 0
    if on_progress:
        on_progress(0, len(todo), 0, sum(sizes))
    for i, a in enumerate(todo, 1):
        if offline:  # a source is unreachable: list the rest without trying each
            report.missing.append(a)
            continue
        revision = revisions.get(a.repo_id, "main")
        log(f"[{i}/{len(todo)}] {a.url_at(revision)} -> {root / a.installed}")
        try:
            _fetch_one(hub, root, a, revision, verify_checksums)
            report.fetched.append(a)
            if on_progress:
                done_bytes += sizes[i - 1]
                on_progress(i, len(todo), done_bytes, sum(sizes))
        except CheckpointError as e:
            _remove(root, a)  # a corrupt file must not pass for a present one
            report.missing.append(a)
            failures.append(str(e))
            log(f"    removed a corrupt download: {e}")
        except DownloadError as e:
            if not a.source_path:
                raise
            report.missing.append(a)  # a GitHub file refused: the hub's files may still come
            failures.append(str(e))
            log(f"    {e}")
        except Exception as e:  # noqa: BLE001 - classified just below
            if not _is_offline_error(e):
                raise DownloadError(f"fetching {a.repo_id}/{a.filename} failed: {type(e).__name__}: {e}",
                                    report) from e
            report.missing.append(a)
            offline = (f"{a.source_url} cannot be reached: {type(e).__name__}: {e}" if a.source_path
                       else f"the hub cannot be reached: {type(e).__name__}")
    if report.missing:
        raise DownloadError(missing_message(root, report.missing, "; ".join([*filter(None, [offline]), *failures]),
                                            check_command, revisions), report)
    return report


def hub_sizes(assets: Sequence[Asset], revisions: Mapping[str, str] | None = None) -> dict[Asset, int]:
    """The sizes the hub reports for the (non-archive) hub assets; {} when the hub cannot be reached."""
    if _hub_unreachable():
        return {}
    hub = _hub()
    out = {}
    for a in assets:
        if not a.unpack and not a.source_path and (
                size := _hub_checksum(hub, a, (revisions or {}).get(a.repo_id, "main"))[1]):
            out[a] = size
    return out
