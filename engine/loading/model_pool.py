"""Loaded models: the ``Models`` bundle of one GPT + SoVITS set, and a memory-bounded pool of them.

Responsibilities: (1) ``Models`` is one language-blind set of networks (T2S, SoVITS, HuBERT, BERT,
plus the vocoder for v3/v4 or the speaker-verification net for v2Pro*), loaded once, never mutated
per request and shareable between threads; (2) ``ModelPool`` owns loaded networks keyed by weight
file (and device/dtype), evicts the least recently used ones past a byte budget, and refuses
weight paths outside the allowed folders. Each request names its own weights, so two users never
swap each other's model (the official global ``set_*_weights`` does; RVC-Boss/GPT-SoVITS issue #1037).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.errors import CheckpointError, OptionsError
from engine.lru import LRUCache
from engine.runtime import Runtime, attention_without_shape_plans
from engine.versions import VOCODER_VERSIONS, uses_speaker_embedding

log = logging.getLogger(__name__)

MUTE_TOKEN = 486  # semantic token of silence (TTS_Config.mute_tokens, the same for every version)
OFFICIAL_EXTRAS = {  # where the official code looks when the config names no file (relative to its root)
    "v3": Path("GPT_SoVITS/pretrained_models/models--nvidia--bigvgan_v2_24khz_100band_256x"),
    "v4": Path("GPT_SoVITS/pretrained_models/gsv-v4-pretrained/vocoder.pth"),
    "sv": Path("GPT_SoVITS/pretrained_models/sv/pretrained_eres2netv2w24s4ep4.ckpt"),
}
OFFICIAL_BASES = {  # the pretrained base model a v3/v4 LoRA file is merged into
    "v3": Path("GPT_SoVITS/pretrained_models/s2Gv3.pth"),
    "v4": Path("GPT_SoVITS/pretrained_models/gsv-v4-pretrained/s2Gv4.pth"),
}


class WeightPathError(CheckpointError, OptionsError):
    """A weight path is missing or lies outside the folders weights may be loaded from."""


class WeightsNotFoundError(WeightPathError):
    """A weight path names no file or folder (the weights were never fetched, or the path is wrong)."""


# ---- which files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightSet:
    """The files of one model set. ``vocoder``/``sv`` None: the official location under ``base_dir``.

    The vocoder, SV and Core ML choices are per version (``per_version``, from the config's sections), so
    a v3 and a v4 model named by requests on one config each find their own vocoder."""

    gpt: Path
    sovits: Path
    bert: Path
    ssl: Path
    vocoder: Path | None = None  # for any version without its own (per_version) entry
    sv: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    vocoder_backend: str = "torch"  # "torch" or "coreml" (config key vocoder_backend; coreml on macOS only)
    vocoder_package: str = ""  # the Core ML package for "coreml" (config key vocoder_coreml_package)
    per_version: tuple[tuple[str, str, str], ...] = ()  # (version, config key, value) set by the config
    g2pw: Path | None = None  # G2PW model folder (Mandarin polyphones, v2+); None: the official location

    @classmethod
    def from_config(cls, config, gpt: str | os.PathLike | None = None,
                    sovits: str | os.PathLike | None = None) -> "WeightSet":
        """The active section of an ``InferConfig``; ``gpt``/``sovits`` override its two weight paths."""
        from engine.versions import VERSIONS

        entries = []
        for version in VERSIONS:
            for key in ("vocoder_path", "sv_weights_path", "vocoder_coreml_package"):
                if (path := config.extension_path(key, version)) is not None:
                    entries.append((version, key, str(path)))
            if (backend := config.extension("vocoder_backend", version)) not in ("", "torch"):
                entries.append((version, "vocoder_backend", backend))
        return cls(
            gpt=Path(gpt) if gpt else config.path("t2s_weights_path"),
            sovits=Path(sovits) if sovits else config.path("vits_weights_path"),
            bert=config.path("bert_base_path"),
            ssl=config.path("cnhuhbert_base_path"),
            base_dir=config.base_dir,
            per_version=tuple(entries),
            g2pw=config.g2pw_folder(),
        )

    def replace(self, gpt: str | os.PathLike | None = None, sovits: str | os.PathLike | None = None) -> "WeightSet":
        from dataclasses import replace

        return replace(self, gpt=Path(gpt) if gpt else self.gpt, sovits=Path(sovits) if sovits else self.sovits)

    def setting(self, key: str, version: str) -> str:
        """The config value of ``key`` for models of ``version`` ("" when the config sets none)."""
        return next((v for ver, k, v in self.per_version if ver == version and k == key), "")

    def extra(self, kind: str, version: str) -> Path:
        """The vocoder (kind "vocoder", for v3/v4) or SV (kind "sv") file, with the official fallback."""
        own = self.setting("vocoder_path" if kind == "vocoder" else "sv_weights_path", version)
        chosen = Path(own) if own else (self.vocoder if kind == "vocoder" else self.sv)
        return chosen if chosen is not None else self.base_dir / OFFICIAL_EXTRAS["sv" if kind == "sv" else version]

    def with_vocoder_backend(self, backend: str | None) -> "WeightSet":
        """Every version on ``backend`` (``--vocoder-backend``): the config's per-version backend keys give way,
        its packages stay. None: unchanged."""
        from dataclasses import replace

        if backend is None:
            return self
        from engine.config import VOCODER_BACKENDS

        if backend not in VOCODER_BACKENDS:
            raise OptionsError(f"vocoder backend {backend!r} is not one of {', '.join(VOCODER_BACKENDS)}")
        kept = tuple(e for e in self.per_version if e[1] != "vocoder_backend")
        return replace(self, vocoder_backend=backend, per_version=kept)

    def g2pw_folder(self) -> Path:
        """Where the G2PW model should be (official chinese2.py: ``GPT_SoVITS/text/G2PWModel`` under the root)."""
        from engine.config import G2PW_FOLDER

        return self.g2pw if self.g2pw is not None else self.base_dir / G2PW_FOLDER

    def backend(self, version: str) -> tuple[str, str]:
        """(vocoder backend, Core ML package) for models of ``version``."""
        return (self.setting("vocoder_backend", version) or self.vocoder_backend,
                self.setting("vocoder_coreml_package", version) or self.vocoder_package)

    def wants_coreml(self) -> bool:
        """Whether any version is set to the Core ML backend (the flag or the config's keys)."""
        from engine.versions import VERSIONS

        return any(self.backend(v)[0] == "coreml" for v in VERSIONS)

    def coreml_decoders(self) -> tuple[tuple[str, str], ...]:
        """(version, package) of the v1/v2/v2Pro* versions whose HiFi-GAN decoder should run in Core ML."""
        from engine.versions import DIRECT_VERSIONS

        return tuple((v, pkg) for v in DIRECT_VERSIONS for backend, pkg in [self.backend(v)]
                     if backend == "coreml" and pkg)  # without a package: torch (config.problems() says so)


def _followed(path: str | os.PathLike) -> Path | None:
    """``path`` (``~`` expanded) with every symlink followed; None for a symlink loop or a name the file system
    refuses (RuntimeError on Python 3.11, OSError later)."""
    try:
        return Path(os.path.expanduser(str(path))).resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def check_weight_path(path: str | os.PathLike, roots: tuple[str, ...], name: str, must_exist: bool = True) -> Path:
    """The resolved path; WeightPathError (naming ``name``) if it is missing or escapes ``roots``."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise WeightPathError(f"{name} is empty: give the path of a weight file")
    resolved = _followed(path)
    if resolved is None:
        raise WeightPathError(f"{name} {str(path)!r} cannot be followed (a symlink loop?)")
    if roots:
        allowed = [r for r in map(_followed, roots) if r is not None]  # a looping folder allows nothing
        if not any(resolved == r or r in resolved.parents for r in allowed):
            raise WeightPathError(
                f"{name} {str(path)!r} is outside the allowed weight folders ({', '.join(map(str, allowed))})"
            )
    if must_exist and not resolved.exists():
        raise WeightsNotFoundError(f"{name} {str(path)!r} does not exist")
    return resolved


# ---- the bundle ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Models:
    """One loaded model set on one device. Shared read-only by every request that uses it."""

    weights: WeightSet
    runtime: Runtime
    t2s: nn.Module  # Text2SemanticModel
    early_stop_num: int  # hz * max_sec of the GPT checkpoint (2700 for the official files)
    mute_similarity: torch.Tensor  # (vocab,) cosine similarity of each token embedding to the mute token
    sovits: nn.Module  # SynthesizerTrn (v1/v2/v2Pro*) or SynthesizerTrnV3 (v3/v4)
    version: str  # v1 | v2 | v2Pro | v2ProPlus | v3 | v4 (of the SoVITS file)
    sovits_sample_rate: int  # hps.data.sampling_rate (32000): the reference rate and the silence unit
    ssl: nn.Module  # HuBERT
    bert: Any  # BertFeatureExtractor
    vocoder: Any = None  # v3 BigVGAN / v4 HiFi-GAN: the torch module, or a Core ML wrapper (mel -> audio)
    sv: nn.Module | None = None  # ERes2NetV2 (v2Pro*)
    t2s_fast: Any = None  # engine.t2s.fast.FastT2S over ``t2s`` (CUDA graphs), when the engine uses it
    zh_g2p: Any = None  # engine.text.chinese.ChineseG2P with G2PW (v2+, model present); None: pypinyin
    frontend_spec: Any = None  # engine.text.workers.FrontendSpec: how a worker process builds this set's front end

    @property
    def id(self) -> str:
        """Identity of the set for cache keys: weight files, device and precision."""
        w = self.weights
        return f"{w.gpt}|{w.sovits}|{w.bert}|{w.ssl}|{self.runtime.describe()}"

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def uses_vocoder(self) -> bool:
        return self.version in VOCODER_VERSIONS

    @property
    def output_sample_rate(self) -> int:
        """32000 for v1/v2/v2Pro*, 24000 for v3, 48000 for v4 (``output_sr`` in the official ``TTS.run``)."""
        return {"v3": 24000, "v4": 48000}.get(self.version, self.sovits_sample_rate)


def module_bytes(obj: Any) -> int:
    """Parameter + buffer bytes of a module (or of the ``.model`` of a wrapper such as the BERT extractor)."""
    module = obj if isinstance(obj, nn.Module) else getattr(obj, "model", None)
    if not isinstance(module, nn.Module):
        return 0
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


# ---- loaders (one per kind; the pool takes a replacement mapping in tests) ----------------------


def _load_t2s(path: Path, rt: Runtime, decoder: str = "reference") -> tuple[nn.Module, int, torch.Tensor, Any]:
    from engine.loading.t2s import load_t2s

    model, ckpt = load_t2s(path, rt.device, rt.dtype_for("t2s"))
    table = model.ar_audio_embedding.word_embeddings.weight.detach().float()  # (vocab, D)
    sim = torch.nn.functional.cosine_similarity(table[MUTE_TOKEN].unsqueeze(0), table, dim=-1)  # (vocab,)
    if decoder == "int8":
        from engine.t2s.quantize import quantize_t2s_int8

        if rt.device.type != "cpu":
            raise OptionsError(f"t2s_decoder 'int8' runs on the CPU, but this engine runs on {rt.device}")
        model = quantize_t2s_int8(model)
    fast = None
    if decoder == "fast":
        from engine.t2s.fast import FastT2S

        fast = FastT2S(model)
    return model, ckpt.early_stop_num, sim.cpu(), fast


def _load_sovits(path: Path, rt: Runtime, base_dir: str = ".", coreml: tuple[tuple[str, str], ...] = ()):
    from engine.loading.checkpoints import sovits_version_from_file
    from engine.loading.sovits import load_sovits

    _, version, is_lora = sovits_version_from_file(path)
    base = Path(base_dir) / OFFICIAL_BASES[version] if is_lora and version in OFFICIAL_BASES else None
    loaded = load_sovits(path, rt.device, rt.dtype_for("sovits"), base_path=base)
    module = loaded.module.to(rt.device, rt.dtype_for("sovits"))  # the v3/v4 loader returns fp32 on the CPU
    package = dict(coreml).get(loaded.model_version)
    if package is not None:  # vocoder_backend: coreml for this version: its HiFi-GAN decoder as a Core ML package
        from engine.acoustic.vocoder_backend import use_coreml_decoder

        use_coreml_decoder(module, package, loaded.sampling_rate)  # keeps the torch decoder when it cannot
    return module, loaded.model_version, loaded.sampling_rate


def _load_ssl(path: Path, rt: Runtime) -> nn.Module:
    from engine.acoustic.hubert import load_hubert

    return load_hubert(path).to(rt.device, rt.dtype_for("ssl"))


def _load_bert(path: Path, rt: Runtime):
    from engine.text.bert import BertFeatureExtractor

    return BertFeatureExtractor.from_folder(path, rt.device, rt.dtype_for("bert"))


VOCODER_IDENTITY = {"v3": ("bigvgan", 24000, 256), "v4": ("v4", 48000, 480)}  # kind, rate, samples per frame


def _load_vocoder(path: Path, rt: Runtime, version: str, backend: str = "torch", package: str = ""):
    from engine.acoustic.vocoder_backend import select_vocoder
    from engine.loading.vocoder import load_bigvgan, load_v4_vocoder

    model = load_bigvgan(path) if version == "v3" else load_v4_vocoder(path)
    model = model.to(rt.device, rt.dtype_for("vocoder"))
    if backend == "torch":
        return model
    kind, rate, hop = VOCODER_IDENTITY[version]
    chosen = select_vocoder(backend, model, kind=kind, sample_rate=rate, hop=hop, channels=100,
                            package=package or None)
    return chosen.vocoder  # the torch module whenever Core ML cannot be used (the reason is logged)


def _load_sv(path: Path, rt: Runtime) -> nn.Module:
    from engine.loading.sv import load_sv_model

    return load_sv_model(path, rt.device, rt.dtype_for("sv"))


DEFAULT_LOADERS: dict[str, Callable[..., Any]] = {
    "t2s": _load_t2s, "sovits": _load_sovits, "ssl": _load_ssl, "bert": _load_bert,
    "vocoder": _load_vocoder, "sv": _load_sv,
}


# ---- the pool ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolStats:
    loads: int
    hits: int
    evictions: int
    entries: int
    bytes: int


class ModelPool:
    """Loaded networks keyed by (kind, weight file, device, dtype); LRU past ``max_bytes``.

    ``models(weights, runtime)`` returns a :class:`Models` bundle, loading what is missing. Networks
    shared between sets (BERT, HuBERT) are loaded once. An evicted network stays alive while a
    running request still holds its bundle; the pool only drops its own reference.
    """

    def __init__(self, max_bytes: int = 12 << 30, weight_roots: tuple[str, ...] = (),
                 loaders: dict[str, Callable[..., Any]] | None = None,
                 size_of: Callable[[Any], int] | None = None, t2s_decoder: str = "auto") -> None:
        self.t2s_decoder = t2s_decoder  # auto | fast | reference (see EngineSettings.t2s_decoder)
        self.weight_roots = tuple(weight_roots)
        self._loaders = {**DEFAULT_LOADERS, **(loaders or {})}
        size_of = size_of or (lambda v: module_bytes(v[0] if isinstance(v, tuple) else v))
        # no entry limit; every network of the set being handed out is kept, even past max_bytes
        self._cache: LRUCache[Hashable, Any] = LRUCache(max_bytes=max_bytes, size_of=size_of, name="model pool",
                                                        log_level=logging.INFO)
        self._mandarin_cache: LRUCache[Hashable, Any] = LRUCache(max_entries=2, name="G2PW converters")

    # ---- public ------------------------------------------------------------------------
    def models(self, weights: WeightSet, runtime: Runtime) -> Models:
        """The bundle for ``weights`` on ``runtime``'s device (CheckpointError/WeightPathError name the file)."""
        roots = self.weight_roots
        gpt = check_weight_path(weights.gpt, roots, "GPT weights (gpt_weights_path)")
        sovits_path = check_weight_path(weights.sovits, roots, "SoVITS weights (sovits_weights_path)")
        bert_path = check_weight_path(weights.bert, (), "BERT folder (bert_base_path)")
        ssl_path = check_weight_path(weights.ssl, (), "HuBERT folder (cnhuhbert_base_path)")
        pinned: list[Hashable] = []
        decoder = self.t2s_decoder
        if decoder == "auto":
            decoder = "fast" if runtime.device.type == "cuda" else "reference"
        t2s, early_stop, sim, fast = self._get("t2s", gpt, runtime, pinned, decoder)
        sovits, version, sr = self._get("sovits", sovits_path, runtime, pinned, str(weights.base_dir),
                                        weights.coreml_decoders())
        ssl = self._get("ssl", ssl_path, runtime, pinned)
        bert = self._get("bert", bert_path, runtime, pinned)
        vocoder = sv = None
        if version in VOCODER_VERSIONS:
            path = check_weight_path(weights.extra("vocoder", version), (),
                                     f"{version} vocoder (vocoder_path of the config's {version} section)")
            vocoder = self._get("vocoder", path, runtime, pinned, version, *weights.backend(version))
        if uses_speaker_embedding(version):
            path = check_weight_path(weights.extra("sv", version), (), "speaker-verification weights (sv_weights_path)")
            sv = self._get("sv", path, runtime, pinned)
        self._cache.evict(self.max_bytes, keep=set(pinned))  # the set just handed out stays
        zh_g2p = self._mandarin(weights.g2pw_folder(), bert_path) if version != "v1" else None
        from engine.text.workers import FrontendSpec

        spec = FrontendSpec("v1" if version == "v1" else "v2", str(weights.g2pw_folder()) if zh_g2p else None,
                            str(bert_path) if zh_g2p else None)
        return Models(weights=weights, runtime=runtime, t2s=t2s, early_stop_num=early_stop, mute_similarity=sim,
                      sovits=sovits, version=version, sovits_sample_rate=sr, ssl=ssl, bert=bert, vocoder=vocoder,
                      sv=sv, t2s_fast=fast, zh_g2p=zh_g2p, frontend_spec=spec)

    def shrink(self, fraction: float = 0.5) -> int:
        """Drop least recently used networks until at most ``fraction`` of the bytes remain."""
        return self._cache.shrink(fraction)

    def evict_except(self, keep: Models | None) -> int:
        """Drop every network that ``keep`` does not use (the idle ones); bytes released. Networks still held by
        running requests stay alive until those end; the pool only drops its references."""
        used = set() if keep is None else {id(v) for v in (keep.t2s, keep.sovits, keep.ssl, keep.bert, keep.vocoder,
                                                          keep.sv) if v is not None}
        def idle(_key: Hashable, value: Any) -> bool:
            parts = value if isinstance(value, tuple) else (value,)
            return not any(id(p) in used for p in parts)

        released = self._cache.evict_where(idle)
        if released:
            log.info("model pool: evicted idle networks (%d bytes)", released)
        return released

    def stats(self) -> PoolStats:
        c = self._cache
        return PoolStats(c.builds, c.hits, c.evictions, len(c), c.nbytes)

    def keys(self) -> list[Hashable]:
        return self._cache.keys()

    @property
    def nbytes(self) -> int:
        return self._cache.nbytes

    @property
    def max_bytes(self) -> int:
        return self._cache.max_bytes

    @property
    def loads(self) -> int:
        return self._cache.builds

    @property
    def hits(self) -> int:
        return self._cache.hits

    @property
    def evictions(self) -> int:
        return self._cache.evictions

    # ---- internals ---------------------------------------------------------------------
    def _mandarin(self, folder: Path, tokenizer: Path):
        """The v2+ Mandarin converter with G2PW when its folder is there (the official chinese2.py's
        ``is_g2pw = True``); None (pypinyin) when it is not, or cannot run (logged once per folder)."""
        from engine.text.chinese import g2pw_converter

        if not folder.is_dir():
            return None
        key = (str(folder), str(tokenizer))
        return self._mandarin_cache.get_or_build(key, lambda: g2pw_converter(folder, tokenizer))[0]

    def _get(self, kind: str, path: Path, rt: Runtime, pinned: list, *extra: Any) -> Any:
        key = (kind, str(path), str(rt.device), str(rt.dtype_for(kind)), *extra)
        pinned.append(key)

        def load() -> Any:
            log.info("loading %s weights %s on %s", kind, path, rt.device)
            attention_without_shape_plans(rt.device)  # before any attention of it runs on a CUDA device
            return self._loaders[kind](path, rt, *extra)

        return self._cache.get_or_build(key, load, keep=set(pinned))[0]
