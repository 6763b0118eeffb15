"""Per-request synthesis options and engine settings: defaults exist here once, checked in one place.

``SynthesisOptions`` holds the options of the official ``TTS.run`` with its defaults (its ``inputs.get`` calls;
``engine/data/model_configs.json`` "TTS.run defaults"). It is frozen and validated in
``__post_init__``; invalid values raise :class:`OptionsError` naming the field. Unlike the official
``run``, nothing here rewrites a flag: the official mode rules (the flag rewrites at the start of
``TTS.run``) are applied by
:func:`resolve_plan`, which returns the effective :class:`SynthesisPlan` and says, in ``notes``,
every flag it had to override and why. The CLI, the HTTP API and the UI all build this one type.

``EngineSettings`` holds deployment choices of a running engine (cache bounds, the memory
watermark, the folders weights may come from); never architecture numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

from engine.errors import OptionsError
from engine.versions import VOCODER_VERSIONS

SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")
MAX_SEED = 2**32 - 1  # the official random seed range [0, 2^32 - 1]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class SynthesisOptions:
    """Options of one synthesis request (official ``TTS.run`` names and defaults)."""

    # ---- text -----------------------------------------------------------------------------
    text_split_method: str = "cut1"  # sentence splitter cut0..cut5 (TTS.run default; api_v2 uses cut5)
    # ---- batching -------------------------------------------------------------------------
    batch_size: int = 1  # sentences decoded together by the T2S model
    batch_threshold: float = 0.75  # bucketing: min ratio of the middle length to the mean length
    split_bucket: bool = True  # group sentences of similar length into batches (order restored)
    parallel_infer: bool = True  # batched T2S (and batched CFM for v3/v4) instead of one by one
    # ---- sampling (T2S) ---------------------------------------------------------------------
    top_k: int = 15  # keep the k most likely tokens (1 = greedy)
    top_p: float = 1.0  # nucleus filter on the un-tempered logits; 1 disables it
    temperature: float = 1.0  # logits divided by max(temperature, 1e-5)
    repetition_penalty: float = 1.35  # once per distinct token already in the sequence
    seed: int = -1  # -1: a random seed in [0, 2^32-1] (reported on every Result)
    early_stop_num: int | None = None  # stop past this many new tokens; None: hz*max_sec of the GPT (2700)
    # ---- acoustic ---------------------------------------------------------------------------
    speed_factor: float = 1.0  # > 1 speaks faster (latent time-stretch; disables bucketing)
    sample_steps: int = 32  # CFM Euler steps (v3/v4 only)
    super_sampling: bool = False  # v3: AP-BWE 24 -> 48 kHz (not bundled: see resolve_plan notes)
    # ---- output -----------------------------------------------------------------------------
    fragment_interval: float = 0.3  # seconds of silence after each sentence, counted at 32 kHz (official quirk)
    return_fragment: bool = False  # official "old streaming": sentences featurised lazily, no bucketing
    streaming_mode: bool = False  # token-chunk streaming (v1/v2/v2Pro*; v3/v4 fall back to return_fragment)
    overlap_length: int = 2  # streaming: semantic tokens of overlap between chunks
    min_chunk_length: int = 16  # streaming: minimum semantic tokens per chunk
    fixed_length_chunk: bool = False  # streaming: fixed-size chunks instead of splitting at mute tokens

    def __post_init__(self) -> None:
        if self.text_split_method not in SPLIT_METHODS:
            raise OptionsError(
                f"text_split_method {self.text_split_method!r} is unknown; use one of {', '.join(SPLIT_METHODS)}",
                field="text_split_method")
        for name in ("split_bucket", "parallel_infer", "super_sampling", "return_fragment", "streaming_mode",
                     "fixed_length_chunk"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name} must be true or false, got {getattr(self, name)!r}", field=name)
        self._int("batch_size", 1, 200)
        self._int("top_k", 1, 1025)
        self._int("sample_steps", 1, 256)
        self._int("overlap_length", 1, 50)
        self._int("min_chunk_length", 1, 1500)
        self._number("batch_threshold", 0.0, 1.0)
        self._number("top_p", 0.0, 1.0, low_open=True)
        self._number("temperature", 0.0, 100.0)
        self._number("repetition_penalty", 0.0, 100.0, low_open=True)
        self._number("speed_factor", 0.1, 10.0)
        self._number("fragment_interval", 0.0, 10.0)
        if not _is_int(self.seed) or not -1 <= self.seed <= MAX_SEED:
            raise OptionsError(f"seed must be -1 (random) or an integer in [0, {MAX_SEED}], got {self.seed!r}",
                               field="seed")
        if self.early_stop_num is not None and (not _is_int(self.early_stop_num) or self.early_stop_num < 1):
            raise OptionsError(f"early_stop_num must be a positive integer or None, got {self.early_stop_num!r}",
                               field="early_stop_num")
        if self.streaming_mode and self.min_chunk_length < self.overlap_length:
            # The official code neither checks nor clamps this: its first chunk (min_chunk_length tokens, or
            # a few more when cut at a mute token) is then shorter than the SOLA overlap of the next one, and
            # TTS.run fails after the stream began (an empty WAV).
            raise OptionsError(f"min_chunk_length ({self.min_chunk_length}) must be at least overlap_length "
                               f"({self.overlap_length}) when streaming token chunks", field="min_chunk_length")

    def _int(self, name: str, lo: int, hi: int) -> None:
        v = getattr(self, name)
        if not _is_int(v) or not lo <= v <= hi:
            raise OptionsError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}", field=name)

    def _number(self, name: str, lo: float, hi: float, low_open: bool = False) -> None:
        v = getattr(self, name)
        ok = _is_number(v) and (lo < v if low_open else lo <= v) and v <= hi
        if not ok:
            raise OptionsError(f"{name} must be a number in {'(' if low_open else '['}{lo:g}, {hi:g}], got {v!r}",
                               field=name)

    def replace(self, **changes: Any) -> "SynthesisOptions":
        """A copy with some fields changed (validated again); unknown names raise OptionsError."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise OptionsError(f"unknown synthesis option {unknown[0]!r}; known: {', '.join(option_names())}")
        return replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: dict[str, Any], ignore: tuple[str, ...] = ()) -> "SynthesisOptions":
        """Build from a dict of official names (e.g. an api_v2 request); unknown keys raise OptionsError
        unless listed in ``ignore``; None values keep the default."""
        known = set(option_names())
        picked = {}
        for key, value in values.items():
            if key in ignore or value is None:
                continue
            if key not in known:
                raise OptionsError(f"unknown synthesis option {key!r}; known: {', '.join(sorted(known))}")
            picked[key] = value
        return cls(**picked)


def option_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(SynthesisOptions))


# ---- mode resolution (the flag rewrites at the start of the official TTS.run) ---------------


# What each option does, in a user's words (the CLI's --help; front doors may show it too)
OPTION_HELP: dict[str, str] = {
    "text_split_method": "how the text is cut into sentences: cut0 none, cut1 every 4 sentences, cut2 every "
                         "50 characters, cut3 at Chinese full stops, cut4 at English full stops, cut5 at every mark",
    "batch_size": "sentences decoded together by the GPT model",
    "batch_threshold": "bucketing: smallest ratio of a batch's middle length to its mean length",
    "split_bucket": "group sentences of similar length into batches (the order of the audio is kept)",
    "parallel_infer": "decode sentences in batches (false: one by one, as the official naive loop)",
    "top_k": "sample among the k most likely tokens (1: always the most likely)",
    "top_p": "nucleus sampling: keep the most likely tokens up to this total probability (1: off)",
    "temperature": "sampling temperature: lower is steadier, higher more varied",
    "repetition_penalty": "discourage tokens already said (1: off)",
    "seed": "random seed; -1 picks one (printed, so a run can be repeated)",
    "early_stop_num": "stop a sentence after this many tokens (50 tokens = 2 s); default: the model's maximum",
    "speed_factor": "speaking speed: above 1 faster, below 1 slower",
    "sample_steps": "v3/v4 only: diffusion steps (fewer is faster, more is cleaner)",
    "super_sampling": "v3 only: raise the 24 kHz output to 48 kHz with the official AP-BWE model",
    "fragment_interval": "seconds of silence between sentences",
    "return_fragment": "deliver the audio sentence by sentence (the official older streaming)",
    "streaming_mode": "deliver the audio in small chunks as it is made (v1/v2/v2Pro/v2ProPlus)",
    "overlap_length": "streaming: tokens shared by consecutive chunks, cross-faded",
    "min_chunk_length": "streaming: the fewest tokens in a chunk",
    "fixed_length_chunk": "streaming: chunks of a fixed size instead of cutting at pauses",
}


@dataclass(frozen=True)
class SynthesisPlan:
    """What a request will actually do once the official mode rules are applied."""

    t2s_loop: str  # "batch" (parallel, left-padded), "naive" (one sentence at a time) or "stream"
    streaming: bool  # token-chunk streaming of SoVITS audio (official streaming_mode)
    return_fragment: bool  # sentences featurised lazily per batch (no bucketing, no punctuation collapse)
    split_bucket: bool  # sort sentences into length buckets
    parallel_infer: bool  # effective parallel flag (batched CFM for v3/v4)
    super_sampling: bool  # effective (always False: AP-BWE is not bundled)
    notes: tuple[str, ...] = field(default_factory=tuple)  # each flag override, in the official order


def resolve_plan(options: SynthesisOptions, version: str) -> SynthesisPlan:
    """Apply the official ``TTS.run`` mode rules for a model ``version`` and explain each override.

    In the order of the official ``TTS.run``: T2S loop selection; v3/v4 + streaming -> return_fragment; parallel +
    streaming -> parallel off; return_fragment + streaming -> return_fragment off; streaming or
    return_fragment -> no bucketing; speed_factor != 1 or (v3/v4 and parallel) -> no bucketing.
    """
    use_vocoder = version in VOCODER_VERSIONS
    parallel, streaming, fragment = options.parallel_infer, options.streaming_mode, options.return_fragment
    bucket = options.split_bucket
    notes: list[str] = []
    if parallel and not streaming:
        loop = "batch"
    elif not parallel and streaming and not use_vocoder:
        loop = "stream"
    elif streaming and use_vocoder:
        notes.append(f"streaming_mode is not available for {version} models: returning whole sentences "
                     "(return_fragment) instead")
        streaming, fragment = False, True
        loop = "batch" if parallel else "naive"
    elif parallel and streaming:
        notes.append("streaming_mode decodes one sentence at a time: parallel_infer turned off")
        parallel = False
        loop = "stream"
    else:
        loop = "naive"
    if fragment and streaming:
        notes.append("return_fragment does not combine with streaming_mode: return_fragment turned off")
        fragment = False
    if (fragment or streaming) and bucket:
        notes.append("return_fragment/streaming_mode keep the sentence order: split_bucket turned off")
        bucket = False
    if bucket and options.speed_factor != 1.0:
        notes.append("speed_factor != 1 decodes sentences one by one: split_bucket turned off")
        bucket = False
    elif bucket and use_vocoder and parallel:
        notes.append(f"{version} with parallel_infer synthesises whole batches: split_bucket turned off")
        bucket = False
    sr = False
    if options.super_sampling:
        notes.append("super_sampling needs the AP-BWE model, which is not bundled: output keeps its rate"
                     if version == "v3" else f"super_sampling applies to v3 only, not {version}: ignored")
    return SynthesisPlan(t2s_loop=loop, streaming=streaming, return_fragment=fragment, split_bucket=bucket,
                         parallel_infer=parallel, super_sampling=sr, notes=tuple(notes))


# ---- engine settings ------------------------------------------------------------------------

MIB = 1 << 20
GIB = 1 << 30
PRESSURE_ACTIONS = ("cpu", "wait", "refuse")
T2S_DECODERS = ("auto", "fast", "reference", "int8")


@dataclass(frozen=True)
class EngineSettings:
    """Bounds and policies of one running engine (the pool, the caches, the memory watermark)."""

    # prepared references kept (LRU), and their total tensor bytes: a reference of a 5-6 s clip is about 1 MB in
    # float32 (its spectrogram), so the bytes bind first (~450 clips); a count of 64 made a server with more users
    # than that, each with a clip of their own, prepare every request's reference again (LRU over a cycle longer
    # than the cache hits nothing): docs/benchmarks.md, issue 31
    reference_cache_entries: int = 1024
    reference_cache_bytes: int = 512 * MIB
    # threads that prepare new references on an accelerator (their clips' HuBERT and speaker-model runs meet in
    # batches of up to engine.cloner.REFERENCE_BATCH). Measured on an H100 (docs/benchmarks.md, issue 31): with
    # 256 users arriving with new clips, ~110-125 requests wait here on average whether 2 or 16 threads prepare;
    # 16 threads cost 30% at 64 users arriving at once (their references reach the scheduler in one burst), so 2
    reference_threads: int = 2
    model_pool_bytes: int = 12 * GIB  # parameter bytes of loaded models kept (LRU by weight file)
    memory_watermark: float = 0.9  # fraction of device memory; above it caches shrink, then new work degrades
    on_memory_pressure: str = "cpu"  # after shrinking: "cpu" (run on the CPU), "wait" or "refuse"
    memory_wait_seconds: float = 30.0  # "wait": how long to wait for memory before refusing
    weight_roots: tuple[str, ...] = ()  # folders weight files may come from; empty: any path
    warmup: bool = False  # run a tiny synthesis when a model set is loaded
    # "auto": FastT2S (CUDA graphs) on CUDA, else the reference loop; "fast"; "reference"; "int8": the
    # reference loop over int8 dynamically quantised linears (CPU only; reduced precision, see
    # docs/benchmarks.md for its token agreement). Used by the official flow (scheduler=False); the scheduler
    # decodes with its own slot pool (int8 linears apply there too).
    t2s_decoder: str = "auto"
    max_text_chars: int = 10_000  # longer request texts are refused
    # the continuous-batching scheduler (engine.serving) runs every request of Studio; False: each request
    # runs the official loops on its caller's thread (the official per-request RNG stream, no batching)
    scheduler: bool = True
    scheduler_slots: int = 0  # requests decoded at once; 0: from free device memory (CPU: 8)
    scheduler_queue: int = 64  # requests waiting for a slot; one more is refused with BusyError (HTTP 503)
    scheduler_context: int = 2048  # positions per slot: phones + prompt tokens + generated tokens
    # model sets with a live scheduler (each holds a KV-cache pool); one with requests in flight is never
    # closed to make room: a new set then waits for an idle one (BusyError, HTTP 503 + Retry-After)
    max_schedulers: int = 4
    # convolutions of the acoustic stages and reference preparation (engine.runtime.conv_backend): "auto" /
    # "cudnn" (cuDNN on CUDA), "native" (PyTorch's own: no cuDNN plan per new length, slower in batches)
    conv_backend: str = "auto"
    # streaming chunks voiced in batches (CUDA) are padded to bucketed shapes, so convolution plans are reused
    acoustic_buckets: bool = True
    # bucketed acoustic batches (CUDA) replay CUDA graphs of the shapes met (engine.acoustic.graphs)
    acoustic_graphs: bool = True
    # those graphs hold the voicing compiled by torch.compile over channels-last convolutions: 2.1x the voicing
    # on an H100, but warm-up took 134 s instead of ~25 s on an H200 and its serving speed under load is not yet
    # measured (docs/benchmarks.md, issue 31 on the GPU), so off by default
    acoustic_compile: bool = False
    # CUDA: each acoustic round's kernels are queued before the previous round's audio is delivered (its copy to
    # the host, peaks, pieces to their requests), so the device does not wait for that host work; False: one
    # round at a time (the same numbers either way)
    acoustic_pipeline: bool = True
    # CUDA: a prefill replays a CUDA graph captured for its bucket (rows, width rounded up; the first prefill of a
    # bucket runs eagerly, then the bucket is captured): a prefill is hundreds of launches, host-bound otherwise
    prefill_graphs: bool = True
    # CUDA, while rows decode: a new sentence waits up to this many milliseconds for others to share its prefill
    # (a prefill costs hundreds of launches whatever its rows); 0: each is prefilled as soon as the loop turns
    prefill_wait_ms: int = 50
    # the interpreter's GIL switch interval for a serving process, in ms (0: Python's own, 5 ms). A decode step
    # waits on the device with the GIL released, then needs it back; while another thread runs Python (the
    # acoustic thread launching kernels, the HTTP server) it gets it only after this interval: 1 ms steps took
    # 6 ms beside one busy thread on this CPU, 1.7 ms at 0.5 ms (benchmarks/gil_handoff.py). Set by the serving
    # commands (the interpreter is the process's, not the engine's); not yet measured on the product path
    switch_interval_ms: float = 0.0
    # processes that read request texts (normalisation, g2p; engine.text.workers), so that the front end never
    # holds the engine's GIL; -1: 2 on CUDA (where the GIL feeds the GPU), none elsewhere; 0: the request threads
    text_processes: int = -1
    # token streaming: the tokens before a chunk that its prefix encoders see; 0: the whole sentence so far (the
    # official decode, its numbers); N: at most N, so a chunk costs the same however long its sentence (an
    # approximation: docs/benchmarks.md "bounded context" gives its difference to the official decode)
    stream_context_tokens: int = 0

    def __post_init__(self) -> None:
        if self.conv_backend not in ("auto", "cudnn", "native"):
            raise OptionsError(f"conv_backend must be auto, cudnn or native, got {self.conv_backend!r}")
        for name in ("scheduler", "acoustic_buckets", "acoustic_graphs", "acoustic_compile", "acoustic_pipeline",
                     "prefill_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not _is_int(self.reference_threads) or self.reference_threads < 1:
            raise OptionsError(f"reference_threads must be an integer >= 1, got {self.reference_threads!r}")
        if not _is_int(self.scheduler_context) or self.scheduler_context < 64:
            raise OptionsError(f"scheduler_context must be an integer >= 64, got {self.scheduler_context!r}")
        for name in ("reference_cache_entries", "reference_cache_bytes", "model_pool_bytes", "max_text_chars",
                     "scheduler_slots", "scheduler_queue", "max_schedulers", "stream_context_tokens",
                     "prefill_wait_ms"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise OptionsError(f"{name} must be a non-negative integer, got {v!r}")
        if not _is_int(self.text_processes) or self.text_processes < -1:
            raise OptionsError(f"text_processes must be -1 (auto), 0 or a number of processes, "
                               f"got {self.text_processes!r}")
        if self.max_schedulers < 1:
            raise OptionsError(f"max_schedulers must be at least 1, got {self.max_schedulers!r}")
        if not _is_number(self.switch_interval_ms) or not 0.0 <= self.switch_interval_ms <= 100.0:
            raise OptionsError(f"switch_interval_ms must be a number of milliseconds in [0, 100] (0: Python's own), "
                               f"got {self.switch_interval_ms!r}")
        if not _is_number(self.memory_watermark) or not 0.0 < self.memory_watermark <= 1.0:
            raise OptionsError(f"memory_watermark must be a fraction in (0, 1], got {self.memory_watermark!r}")
        if self.on_memory_pressure not in PRESSURE_ACTIONS:
            raise OptionsError(f"on_memory_pressure must be one of {', '.join(PRESSURE_ACTIONS)}, "
                               f"got {self.on_memory_pressure!r}")
        if not _is_number(self.memory_wait_seconds) or self.memory_wait_seconds < 0:
            raise OptionsError(f"memory_wait_seconds must be >= 0, got {self.memory_wait_seconds!r}")
        if self.t2s_decoder not in T2S_DECODERS:
            raise OptionsError(f"t2s_decoder must be one of {', '.join(T2S_DECODERS)}, got {self.t2s_decoder!r}")
        if isinstance(self.weight_roots, str) or not all(isinstance(r, str) for r in self.weight_roots):
            raise OptionsError("weight_roots must be a tuple of folder paths")
