"""A fixed, documented benchmark workload: per-stage and end-to-end speed, latency and memory.

Workload (``run_benchmark``):

* weights: a ``tts_infer.yaml`` (real weights) or a random model set of one version written by
  :func:`engine.testweights.make_test_weights` (official dims unless ``tiny``);
* reference: a given clip, or a generated 5 s voiced-like signal at 32 kHz with the transcript
  ``REF_TEXT`` (Mandarin);
* stages, each warmed up once then timed ``repeats`` times (median): the text frontend (phones +
  BERT), the reference features (HuBERT prompt tokens, spectrogram, SV embedding), T2S at batch 1
  over exactly ``tokens`` tokens (EOS disabled) with the decoder the engine uses on that device,
  the acoustic stage (SoVITS decode, or CFM + vocoder for v3/v4) on those tokens, T2S batch
  throughput, end-to-end real-time factor for a short, a medium and a long text, and the
  first-chunk latency of a streaming request;
* memory: peak process RSS and peak device memory.

Random weights never learned to stop, so end-to-end runs cap each sentence at ``tokens`` tokens.
"""

from __future__ import annotations

import platform
import resource
import statistics
import tempfile
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
    tokens: int = 500  # T2S tokens per timed decode (EOS disabled)
    repeats: int = 3
    batches: tuple[int, ...] = (8, 32, 64)
    reference: str | None = None
    reference_text: str = REF_TEXT
    reference_lang: str = "zh"
    text_lang: str = "zh"
    t2s_decoder: str = "auto"  # EngineSettings.t2s_decoder (int8: the opt-in CPU path)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def run_benchmark(cfg: BenchConfig, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    from engine.options import EngineSettings, SynthesisOptions
    from engine.pipeline import Reference, Studio
    from engine.reference import read_reference, reference_features
    from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
    from engine.testweights import make_test_weights
    from engine.text.frontend import TextFrontend

    work = tempfile.TemporaryDirectory(prefix="sovits-bench-")
    try:
        t0 = time.perf_counter()
        config = cfg.config or str(make_test_weights(work.name, cfg.version, full_size=not cfg.tiny))
        setup_s = time.perf_counter() - t0
        studio = Studio.from_config(config, device=cfg.device, precision=cfg.precision,
                                    settings=EngineSettings(t2s_decoder=cfg.t2s_decoder))
        models = studio.pool.models(studio.default_weights, studio.runtime)
        dev = models.device
        log(f"models loaded on {studio.runtime.describe()}")
        ref_path = cfg.reference or str(synthetic_reference(Path(work.name) / "ref.wav"))
        reference = Reference(ref_path, cfg.reference_text, cfg.reference_lang)
        report: dict[str, Any] = {
            "workload": asdict(cfg), "version": models.version, "device": str(dev),
            "precision": studio.runtime.describe(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine(),
            "cpu_threads": torch.get_num_threads(), "weights_setup_s": round(setup_s, 2), "stages": {},
        }
        stages = report["stages"]

        # ---- frontend -------------------------------------------------------------------------------
        frontend = TextFrontend(models.version if models.version in ("v1", "v2") else "v2", bert=models.bert)
        stages["frontend"] = _measure(lambda: frontend.phones_and_bert(TEXTS["medium"], cfg.text_lang), dev, cfg.repeats)
        log(f"frontend {stages['frontend']}")

        # ---- reference features (SSL) ----------------------------------------------------------------
        clip = read_reference(ref_path)
        if not models.uses_vocoder:
            stages["ssl_reference"] = _measure(
                lambda: reference_features(clip, models.sovits, models.ssl, models.sv,
                                           sovits_sample_rate=models.sovits_sample_rate), dev, cfg.repeats)
        else:
            from engine.reference import prompt_semantic

            stages["ssl_reference"] = _measure(lambda: prompt_semantic(clip, models.ssl, models.sovits,
                                                                       models.sovits_sample_rate), dev, cfg.repeats)
        log(f"ssl {stages['ssl_reference']}")

        # ---- T2S at batch 1, fixed length -----------------------------------------------------------------
        g = torch.Generator().manual_seed(0)
        width = models.t2s.bert_proj.in_features
        # phone ids valid for both models (the v1 GPT has 512 rows, the v1 SoVITS 322 symbols)
        n_phones = min(models.t2s.dims.phoneme_vocab_size, getattr(getattr(models.sovits, "dims", None), "n_symbols", 322))
        item = T2SInput(torch.randint(1, n_phones, (60,), generator=g),
                        torch.randn(width, 60, generator=g))
        prompt = torch.randint(0, 1024, (125,), generator=g)
        rules = StopRules(early_stop_num=cfg.tokens - 1, min_steps=10**9)
        params = SamplingParams()
        name, fast = t2s_decoder_for(models)
        decode = (lambda: fast.decode_naive(item, prompt, params, rules)) if fast else \
                 (lambda: T2SDecoder(models.t2s).decode_naive(item, prompt, params, rules))
        t = _measure(decode, dev, cfg.repeats)
        t["tokens_per_s"] = round(cfg.tokens / t["median_s"], 1)
        t["decoder"] = name
        stages["t2s_batch1"] = t
        log(f"t2s {t}")

        # ---- acoustic stage on those tokens -----------------------------------------------------------------
        tokens = decode().tokens.to(dev)
        audio_seconds = len(tokens) * 0.04
        if not models.uses_vocoder:
            feats = reference_features(clip, models.sovits, models.ssl, models.sv, sovits_sample_rate=models.sovits_sample_rate)
            dtype = next(models.sovits.parameters()).dtype
            spec = feats.spec.to(dev, dtype)
            sv = [feats.sv_embedding.to(dev, dtype)] if feats.sv_embedding is not None else None
            phones = item.phones.to(dev).unsqueeze(0)
            with torch.inference_mode():
                a = _measure(lambda: models.sovits.decode(tokens.view(1, 1, -1), phones, [spec], sv_emb=sv), dev,
                             cfg.repeats)
            a["stage"] = "SoVITS decode"
            a["rtf"] = round(a["median_s"] / audio_seconds, 4)
            stages["acoustic"] = a
            log(f"acoustic {a}")

        # ---- T2S batch throughput ---------------------------------------------------------------------------
        throughput = {}
        for b in cfg.batches:
            items = [item] * b
            if fast:
                fn = lambda: fast.decode_batch(items, prompt, params, rules)  # noqa: E731
            else:
                fn = lambda: T2SDecoder(models.t2s).decode_batch(items, prompt, params, rules)  # noqa: E731
            r = _measure(fn, dev, 1)
            throughput[str(b)] = {"tokens_per_s": round(b * cfg.tokens / r["median_s"], 1), **r}
        stages["t2s_batch_throughput"] = throughput
        log(f"batches {throughput}")

        # ---- end to end ------------------------------------------------------------------------------
        e2e = {}
        opts = SynthesisOptions(seed=1, early_stop_num=cfg.tokens, text_split_method="cut5")
        for label, text in TEXTS.items():
            def once(text=text):
                results = list(studio.synthesize(text, cfg.text_lang, reference, opts))
                return sum(len(r.audio) for r in results) / results[0].sample_rate
            holder: dict[str, float] = {}
            r = _measure(lambda: holder.__setitem__("seconds", once()), dev, cfg.repeats)
            r["audio_s"] = round(holder["seconds"], 2)
            r["rtf"] = round(r["median_s"] / holder["seconds"], 4)
            e2e[label] = r
            log(f"e2e {label} {r}")
        stages["end_to_end"] = e2e

        # ---- first streamed chunk ----------------------------------------------------------------------
        stream_opts = opts.replace(streaming_mode=True, parallel_infer=False)

        def first_chunk() -> None:
            it = studio.synthesize(TEXTS["medium"], cfg.text_lang, reference, stream_opts)
            next(it)
            it.close()

        stages["first_chunk_latency"] = _measure(first_chunk, dev, cfg.repeats)
        log(f"first chunk {stages['first_chunk_latency']}")

        report["memory"] = {"peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
        if dev.type == "cuda":
            report["memory"]["peak_device_mb"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
        return report
    finally:
        work.cleanup()


def format_report(report: dict[str, Any]) -> str:
    s = report["stages"]
    lines = [f"{report['version']} on {report['machine']} ({report['precision']}), torch {report['torch']}",
             f"  frontend (phones+BERT, medium text): {s['frontend']['median_s'] * 1000:.1f} ms",
             f"  reference features (SSL...):         {s['ssl_reference']['median_s'] * 1000:.1f} ms",
             f"  T2S batch 1 [{s['t2s_batch1']['decoder']}]: {s['t2s_batch1']['tokens_per_s']} tokens/s"]
    if "acoustic" in s:
        lines.append(f"  {s['acoustic']['stage']}: {s['acoustic']['median_s'] * 1000:.1f} ms (RTF {s['acoustic']['rtf']})")
    for b, r in s["t2s_batch_throughput"].items():
        lines.append(f"  T2S batch {b}: {r['tokens_per_s']} tokens/s total")
    for label, r in s["end_to_end"].items():
        lines.append(f"  end to end {label}: {r['median_s']:.3f} s for {r['audio_s']} s audio (RTF {r['rtf']})")
    lines.append(f"  first streamed chunk: {s['first_chunk_latency']['median_s'] * 1000:.1f} ms")
    lines.append("  memory: " + ", ".join(f"{k} {v}" for k, v in report["memory"].items()))
    return "\n".join(lines)

