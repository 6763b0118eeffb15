"""A fixed, documented benchmark workload: per-stage and end-to-end speed, latency and memory.

Workload (``run_benchmark``):

* weights: a ``tts_infer.yaml`` (real weights) or a random model set of one version written by
  :func:`engine.testweights.make_test_weights` (official dims unless ``tiny``);
* reference: a given clip, or a generated 5 s voiced-like signal at 32 kHz with the transcript
  ``REF_TEXT`` (Mandarin);
* stages (:data:`STAGES`, in order), each warmed up once then timed ``repeats`` times (median):
  the text frontend (phones + BERT), the reference features (HuBERT prompt tokens, spectrogram,
  SV embedding), T2S at batch 1 over exactly ``tokens`` tokens (EOS disabled) with the decoder the
  engine uses on that device, the acoustic stage (SoVITS decode, or CFM + vocoder for v3/v4) on
  those tokens, T2S batch throughput, end-to-end real-time factor for a short, a medium and a long
  text, the first-chunk latency of a streaming request, and N concurrent streams through one
  ``Studio`` (first-chunk percentiles, each stream's speed against real time, total audio seconds
  per second: the figures ``sovits-studio loadtest`` reports over HTTP);
* memory: peak process RSS and peak device memory.

Random weights never learned to stop, so end-to-end runs cap each sentence at ``tokens`` tokens.
"""

from __future__ import annotations

import platform
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

REF_TEXT = "今天天气很好，我们一起去公园散步吧。"
TEXTS = {
    "short": "你好，欢迎使用语音合成。",
    "medium": "这是一个用于测试语音合成速度的句子。我们希望它听起来自然流畅，并且速度足够快。",
    "long": ("人工智能正在改变我们的生活。从语音助手到自动驾驶，新的技术每天都在出现。"
             "语音合成让机器能够用人的声音说话，它可以朗读新闻、讲故事，也可以帮助有阅读困难的人。"
             "为了让合成的声音更加自然，研究人员不断改进模型的结构和训练的方法。"),
}


@dataclass(frozen=True)
class BenchConfig:
    version: str = "v2ProPlus"  # random weights of this version (ignored with ``config``)
    config: str | None = None  # a tts_infer.yaml with real weights instead
    tiny: bool = False  # tiny random weights (CI-size run)
    device: str = "auto"
    precision: str = "auto"
    vocoder_backend: str | None = None  # torch | coreml for every version; None: the config's
    tokens: int = 500  # T2S tokens per timed decode (EOS disabled)
    repeats: int = 3
    batches: tuple[int, ...] = (8, 32, 64)
    streams: tuple[int, ...] = (1, 2, 4, 8)  # concurrent in-process streams, one level each
    reference: str | None = None
    reference_text: str = REF_TEXT
    reference_lang: str = "zh"
    text_lang: str = "zh"
    t2s_decoder: str = "auto"  # EngineSettings.t2s_decoder (int8: the opt-in CPU path)


@dataclass
class Bench:
    """What the stages share: the workload, the loaded models and the fixed T2S inputs."""

    cfg: BenchConfig
    studio: Any  # engine.studio.Studio
    models: Any  # its default model set
    reference: Any  # engine.reference.Reference
    clip: Any  # the reference clip as read
    item: Any  # T2SInput: 60 random phones with BERT features
    prompt: torch.Tensor  # 125 random prompt tokens
    decoder_name: str
    decode: Callable[[], Any]  # one fixed-length T2S decode at batch 1
    decode_batch: Callable[[list], Any]  # the same for a batch of items

    @property
    def device(self) -> torch.device:
        return self.models.device

    def measure(self, fn: Callable[[], Any], repeats: int | None = None) -> dict[str, float]:
        return _measure(fn, self.device, self.cfg.repeats if repeats is None else repeats)


def _sync(device: torch.device) -> None:
    from engine.runtime import wait_for_device

    wait_for_device(device, all_streams=True)  # MPS too: its work is queued like CUDA's


def _measure(fn: Callable[[], Any], device: torch.device, repeats: int) -> dict[str, float]:
    """Warm-up call timed on its own, then the median of ``repeats`` calls (seconds)."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    warm = time.perf_counter() - t0
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {"warmup_s": round(warm, 4), "median_s": round(statistics.median(times), 4)}


def synthetic_reference(path: Path, seconds: float = 5.0, rate: int = 32000) -> Path:
    """A deterministic voiced-like clip (harmonics with a moving pitch and syllable-like envelope)."""
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 12))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.0 * t) ** 2
    noise = np.random.default_rng(0).normal(0, 0.02, t.shape)
    audio = (0.25 * voice * envelope + noise).astype(np.float32)
    sf.write(path, audio / max(1.0, float(np.abs(audio).max()) / 0.9), rate)
    return path


def t2s_decoder_for(models) -> tuple[str, Any]:
    """The decoder the engine itself uses for these models: its FastT2S when it has one, else the loop."""
    if models.t2s_fast is not None:
        return "FastT2S (CUDA graph)" if models.device.type == "cuda" else "FastT2S", models.t2s_fast
    quantized = getattr(models.t2s.layers[0].self_attn, "in_proj", None) is not None
    return ("T2SDecoder, int8 linears" if quantized else "T2SDecoder"), None


# ---- set-up --------------------------------------------------------------------------------


def load_bench(cfg: BenchConfig, work: Path) -> tuple[Bench, float]:
    """Weights (written into ``work`` unless ``cfg.config``), the Studio and the fixed inputs; and the
    seconds spent writing random weights."""
    from engine.options import EngineSettings
    from engine.reference import Reference
    from engine.studio import Studio
    from engine.reference import read_reference
    from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
    from engine.testweights import make_test_weights

    t0 = time.perf_counter()
    config = cfg.config or str(make_test_weights(work, cfg.version, full_size=not cfg.tiny))
    setup_s = time.perf_counter() - t0
    studio = Studio.from_config(config, device=cfg.device, precision=cfg.precision,
                                settings=EngineSettings(t2s_decoder=cfg.t2s_decoder), vocoder_backend=cfg.vocoder_backend)
    models = studio.pool.models(studio.default_weights, studio.runtime)
    ref_path = cfg.reference or str(synthetic_reference(work / "ref.wav"))
    g = torch.Generator().manual_seed(0)
    width = models.t2s.bert_proj.in_features
    # phone ids valid for both models (the v1 GPT has 512 rows, the v1 SoVITS 322 symbols)
    n_phones = min(models.t2s.dims.phoneme_vocab_size, getattr(getattr(models.sovits, "dims", None), "n_symbols", 322))
    item = T2SInput(torch.randint(1, n_phones, (60,), generator=g), torch.randn(width, 60, generator=g))
    prompt = torch.randint(0, 1024, (125,), generator=g)
    rules = StopRules(early_stop_num=cfg.tokens - 1, min_steps=10**9)
    params = SamplingParams()
    name, fast = t2s_decoder_for(models)
    decoder = (lambda: fast) if fast else (lambda: T2SDecoder(models.t2s))  # the loop keeps per-call state
    bench = Bench(cfg, studio, models, Reference(ref_path, cfg.reference_text, cfg.reference_lang),
                  read_reference(ref_path), item, prompt, name,
                  decode=lambda: decoder().decode_naive(item, prompt, params, rules),
                  decode_batch=lambda items: decoder().decode_batch(items, prompt, params, rules))
    return bench, setup_s


# ---- stages --------------------------------------------------------------------------------


def bench_frontend(b: Bench) -> dict[str, Any]:
    """Phones + BERT features of the medium text."""
    from engine.text.frontend import TextFrontend

    version = b.models.version if b.models.version in ("v1", "v2") else "v2"
    frontend = TextFrontend(version, bert=b.models.bert)
    return b.measure(lambda: frontend.phones_and_bert(TEXTS["medium"], b.cfg.text_lang))


def bench_reference(b: Bench) -> dict[str, Any]:
    """Reference features: prompt tokens, spectrogram and SV embedding (prompt tokens for v3/v4)."""
    from engine.reference import prompt_semantic, reference_features

    m = b.models
    if m.uses_vocoder:
        return b.measure(lambda: prompt_semantic(b.clip, m.ssl, m.sovits, m.sovits_sample_rate))
    return b.measure(lambda: reference_features(b.clip, m.sovits, m.ssl, m.sv, sovits_sample_rate=m.sovits_sample_rate))


def bench_t2s_batch1(b: Bench) -> dict[str, Any]:
    """T2S at batch 1 over exactly ``tokens`` tokens."""
    t = b.measure(b.decode)
    return {**t, "tokens_per_s": round(b.cfg.tokens / t["median_s"], 1), "decoder": b.decoder_name}


def bench_acoustic(b: Bench) -> dict[str, Any] | None:
    """SoVITS decode of the batch-1 tokens (skipped for v3/v4, whose CFM + vocoder run end to end)."""
    from engine.reference import reference_features

    m = b.models
    if m.uses_vocoder:
        return None
    tokens = b.decode().tokens.to(b.device)
    feats = reference_features(b.clip, m.sovits, m.ssl, m.sv, sovits_sample_rate=m.sovits_sample_rate)
    dtype = next(m.sovits.parameters()).dtype
    spec = feats.spec.to(b.device, dtype)
    sv = [feats.sv_embedding.to(b.device, dtype)] if feats.sv_embedding is not None else None
    phones = b.item.phones.to(b.device).unsqueeze(0)
    with torch.inference_mode():
        a = b.measure(lambda: m.sovits.decode(tokens.view(1, 1, -1), phones, [spec], sv_emb=sv))
    return {**a, "stage": "SoVITS decode", "rtf": round(a["median_s"] / (len(tokens) * 0.04), 4)}


def bench_t2s_batches(b: Bench) -> dict[str, Any]:
    """T2S tokens/s over all rows at each batch size (one timed run each)."""
    out = {}
    for n in b.cfg.batches:
        r = b.measure(lambda n=n: b.decode_batch([b.item] * n), repeats=1)
        out[str(n)] = {"tokens_per_s": round(n * b.cfg.tokens / r["median_s"], 1), **r}
    return out


def _options(b: Bench):
    from engine.options import SynthesisOptions

    return SynthesisOptions(seed=1, early_stop_num=b.cfg.tokens, text_split_method="cut5")


def bench_end_to_end(b: Bench) -> dict[str, Any]:
    """Whole-file synthesis of the short, medium and long texts: wall time and real-time factor."""
    opts = _options(b)

    def timed(text: str) -> dict[str, Any]:
        seconds: list[float] = []

        def once() -> None:
            results = list(b.studio.synthesize(text, b.cfg.text_lang, b.reference, opts))
            seconds.append(sum(len(r.audio) for r in results) / results[0].sample_rate)

        r = b.measure(once)
        return {**r, "audio_s": round(seconds[-1], 2), "rtf": round(r["median_s"] / seconds[-1], 4)}

    return {label: timed(text) for label, text in TEXTS.items()}


def _stream_options(b: Bench):
    return _options(b).replace(streaming_mode=True, parallel_infer=False)


def bench_first_chunk(b: Bench) -> dict[str, Any]:
    """Time to the first streamed chunk of the medium text (one stream alone)."""
    opts = _stream_options(b)

    def first_chunk() -> None:
        it = b.studio.synthesize(TEXTS["medium"], b.cfg.text_lang, b.reference, opts)
        next(it)
        it.close()

    return b.measure(first_chunk)


def bench_concurrent_streams(b: Bench) -> dict[str, Any]:
    """For each N in ``streams``: N threads each stream the medium text through the one Studio at
    once (as N HTTP clients would); first-chunk percentiles, each stream's audio s per wall s, total
    audio s per s (:func:`engine.stream_stats.summarize`)."""
    return {str(n): _concurrent_streams(b, n) for n in b.cfg.streams}


def _concurrent_streams(b: Bench, n: int) -> dict[str, Any]:
    from engine.stream_stats import StreamSample, summarize

    opts = _stream_options(b)
    samples: list[StreamSample] = []
    gate = threading.Barrier(n + 1)  # every stream starts together

    def stream() -> None:
        gate.wait()
        t0 = time.perf_counter()
        first, audio, error = None, 0.0, None
        try:
            for r in b.studio.synthesize(TEXTS["medium"], b.cfg.text_lang, b.reference, opts):
                first = time.perf_counter() - t0 if first is None else first
                audio += len(r.audio) / r.sample_rate
        except Exception as e:  # noqa: BLE001 - a failing stream is a result here: count it by type
            error = type(e).__name__
        samples.append(StreamSample(first, time.perf_counter() - t0, audio, error))

    threads = [threading.Thread(target=stream, name=f"bench-stream-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return summarize(samples, time.perf_counter() - t0)


# stage name -> function; a function returning None skips its stage for these models
STAGES: tuple[tuple[str, Callable[[Bench], dict[str, Any] | None]], ...] = (
    ("frontend", bench_frontend),
    ("ssl_reference", bench_reference),
    ("t2s_batch1", bench_t2s_batch1),
    ("acoustic", bench_acoustic),
    ("t2s_batch_throughput", bench_t2s_batches),
    ("end_to_end", bench_end_to_end),
    ("first_chunk_latency", bench_first_chunk),
    ("concurrent_streams", bench_concurrent_streams),
)


def run_benchmark(cfg: BenchConfig, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run every stage of :data:`STAGES` on ``cfg``'s workload; the report (JSON-ready)."""
    with tempfile.TemporaryDirectory(prefix="sovits-bench-") as work:
        b, setup_s = load_bench(cfg, Path(work))
        log(f"models loaded on {b.studio.runtime.describe()}")
        report = describe(b, setup_s)
        for name, stage in STAGES:
            result = stage(b)
            if result is not None:
                report["stages"][name] = result
                log(f"{name} {result}")
        report["memory"] = peak_memory(b.device)
        return report


def describe(b: Bench, setup_s: float) -> dict[str, Any]:
    """The report's header: workload, machine, versions."""
    dev = b.device
    return {
        "workload": asdict(b.cfg), "version": b.models.version, "device": str(dev),
        "precision": b.studio.runtime.describe(), "torch": torch.__version__, "python": platform.python_version(),
        "machine": (torch.cuda.get_device_name(dev) if dev.type == "cuda"
                    else platform.processor() or platform.machine()),
        "cpu_threads": torch.get_num_threads(), "weights_setup_s": round(setup_s, 2), "stages": {},
    }


def peak_memory(device: torch.device) -> dict[str, float]:
    out = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if device.type == "cuda":
        out["peak_device_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return out


def format_report(report: dict[str, Any]) -> str:
    from engine.stream_stats import format_summary

    s = report["stages"]
    lines = [f"{report['version']} on {report['machine']} ({report['precision']}), torch {report['torch']}",
             f"  frontend (phones+BERT, medium text): {s['frontend']['median_s'] * 1000:.1f} ms",
             f"  reference features (SSL...):         {s['ssl_reference']['median_s'] * 1000:.1f} ms",
             f"  T2S batch 1 [{s['t2s_batch1']['decoder']}]: {s['t2s_batch1']['tokens_per_s']} tokens/s"]
    if "acoustic" in s:
        a = s["acoustic"]
        lines.append(f"  {a['stage']}: {a['median_s'] * 1000:.1f} ms (RTF {a['rtf']})")
    for n, r in s["t2s_batch_throughput"].items():
        lines.append(f"  T2S batch {n}: {r['tokens_per_s']} tokens/s total")
    for label, r in s["end_to_end"].items():
        lines.append(f"  end to end {label}: {r['median_s']:.3f} s for {r['audio_s']} s audio (RTF {r['rtf']})")
    lines.append(f"  first streamed chunk: {s['first_chunk_latency']['median_s'] * 1000:.1f} ms")
    for n, r in s.get("concurrent_streams", {}).items():
        lines.append(f"  {n} concurrent streams: {format_summary(r)}")
    lines.append("  memory: " + ", ".join(f"{k} {v}" for k, v in report["memory"].items()))
    return "\n".join(lines)
