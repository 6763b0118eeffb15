"""One model set's request flow: text + reference + options in, an iterator of audio results out.

:class:`VoiceCloner` responsibilities: (1) text processing and the preparation of references (cached
by content), (2) running the official ``TTS.py`` ``TTS.run`` flow, on the caller's thread or through
the model set's serving scheduler, and yielding one :class:`~engine.results.Result` per sentence, or
per token chunk when streaming. Streaming and whole-file synthesis share this one path:
:func:`~engine.results.join` concatenates the results into exactly the official whole-file output.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.audio import postprocess, silence
from engine.errors import (
    CheckpointError,
    OptionsError,
    ReferenceAudioError,
    TextError,
    UnsupportedLanguageError,
    with_field,
)
from engine.loading.model_pool import Models
from engine.openmp import cpu_job, fit_threads
from engine.options import MAX_SEED, EngineSettings, SynthesisOptions, SynthesisPlan, resolve_plan
from engine.reference import (
    PreparedReference,
    Reference,
    ReferenceRules,
    prompt_audio16k,
    prompt_codes,
    read_reference,
    reference_features,
)
from engine.reference_cache import ReferenceCache, ReferenceKey, sha256_bytes
from engine.results import Result
from engine.runtime import DeviceFallback, conv_backend
from engine.serving.requests import Piece
from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput, T2SOutput
from engine.text.limits import check_user_text

log = logging.getLogger(__name__)

REFERENCE_BATCH = 16  # reference clips whose HuBERT features / speaker embeddings run in one batch (CUDA)
ProgressCallback = Callable[[int, int], None]  # (sentences done, sentences in total)
MAX_REFERENCE_FILE_BYTES = 64 << 20  # a reference file larger than this is refused before reading


# ---- helpers (pure) -------------------------------------------------------------------------


def bucket_batches(lengths: Sequence[int], batch_size: int, threshold: float, split_bucket: bool) -> list[list[int]]:
    """The official ``TTS.to_batch`` grouping: sentence indices per batch."""
    n = len(lengths)
    if not split_bucket:
        return [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
    order = sorted(range(n), key=lambda i: lengths[i])  # stable, like the official list.sort
    sorted_lens = np.array([lengths[i] for i in order], dtype=np.float32)
    batches, pos = [], 0
    while pos < n:
        end = min(pos + batch_size, n)
        while pos < end:
            window = sorted_lens[pos:end]
            score = window[(end - pos) // 2] / (window.mean() + 1e-8)
            if score >= threshold or end - pos == 1:
                batches.append(order[pos:end])
                pos = end
                break
            end -= 1
    return batches


def _read_clip_bytes(source: str | os.PathLike | bytes, what: str, field: str) -> bytes:
    if isinstance(source, bytes):
        if not source:
            raise ReferenceAudioError(f"{what} is empty (0 bytes)", field=field)
        return source
    path = Path(source)
    if not path.is_file():
        raise ReferenceAudioError(f"{what} not found: {path}", field=field)
    size = path.stat().st_size
    if size > MAX_REFERENCE_FILE_BYTES:
        raise ReferenceAudioError(f"{what} {path} is {size >> 20} MiB; references are short clips (3-10 s)",
                                  field=field)
    return path.read_bytes()


def _with_lookahead(items: Iterator[list]) -> Iterator[tuple[list, bool]]:
    """``(item, more)`` pairs: ``more`` says whether another item follows (computed one item ahead)."""
    it = iter(items)
    current = next(it, None)
    while current is not None:
        following = next(it, None)
        yield current, following is not None
        current = following


# ---- stage calls (each runs through VoiceCloner._stage, so a stage MPS cannot run falls back to the CPU) ----


def _reference_features(nets: tuple, clip, **kwargs):
    sovits, ssl, sv = nets
    return reference_features(clip, sovits, ssl, sv, **kwargs)


def _t2s_decode(model, inputs: list[T2SInput], prompt: torch.Tensor | None, params: SamplingParams,
                rules: StopRules, loop: str, generator: torch.Generator) -> list[T2SOutput]:
    decoder = T2SDecoder(model, generator=generator)
    if loop == "batch":
        return decoder.decode_batch(inputs, prompt, params, rules)
    return [decoder.decode_naive(x, prompt, params, rules) for x in inputs]


def _decode(sovits, *args, **kwargs) -> torch.Tensor:
    return sovits.decode(*args, **kwargs)


def _vocode(vocoder, mel: torch.Tensor) -> torch.Tensor:
    weights = next(vocoder.parameters(), None) if isinstance(vocoder, torch.nn.Module) else None
    return vocoder(mel if weights is None else mel.to(weights.device))


def _noise_from(gen: torch.Generator):
    """CFM noise from the request's generator, on its device, then moved where the CFM runs (the CPU when
    the stage fell back): the same stream either way, and bit-identical to drawing on the device."""

    def draw(shape, dtype, device):
        return torch.randn(shape, generator=gen, dtype=dtype, device=gen.device).to(device)

    return draw


class _FastDecoder:
    """A request's view of the shared FastT2S: the T2SDecoder methods with this request's generator."""

    def __init__(self, fast, generator: torch.Generator) -> None:
        self.fast, self.generator = fast, generator

    def decode_batch(self, items, prompt, params, rules) -> list[T2SOutput]:
        return self.fast.decode_batch(items, prompt, params, rules, self.generator)

    def decode_naive(self, item, prompt, params, rules) -> T2SOutput:
        return self.fast.decode_naive(item, prompt, params, rules, self.generator)

    def naive_steps(self, item, prompt, params, rules):
        return self.fast.naive_steps(item, prompt, params, rules, self.generator)


@dataclass(frozen=True)
class _Decoding:
    """The T2S side of one request in the official flow."""

    decoder: object  # T2SDecoder or _FastDecoder
    params: SamplingParams
    rules: StopRules
    gen: torch.Generator


def _sentence_piece(s: "_Sentence", out: T2SOutput, audio: torch.Tensor, gap: np.ndarray) -> Piece:
    """A whole sentence's audio followed by the official fragment_interval silence."""
    a = postprocess(audio)
    return Piece(np.concatenate([a, gap]) if gap.size else a, s, tuple(int(t) for t in out.tokens.tolist()),
                 "speech", True)


@dataclass(frozen=True)
class _Sentence:
    index: int
    phones: tuple[int, ...]
    bert: torch.Tensor  # (bert width, P) float32 (1024 with the official BERT)
    norm_text: str


# ---- the pipeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceBatches:
    """The runners that batch reference clips across concurrent requests (engine.batching.GroupRunner): each
    takes ``(model, audio)`` and gives what that clip alone gives, up to rounding."""

    ssl: Callable[[tuple[torch.nn.Module, torch.Tensor]], torch.Tensor]  # (HuBERT, prompt audio 16k) -> (1, 768, T)
    sv: Callable[[tuple[torch.nn.Module, torch.Tensor]], torch.Tensor]  # (speaker model, audio (1, n32)) -> (1, D)

    @classmethod
    def make(cls, executor: Executor | None = None, max_batch: int = REFERENCE_BATCH) -> "ReferenceBatches":
        from engine.acoustic.hubert import ssl_features_groups
        from engine.batching import GroupRunner
        from engine.reference import sv_embedding_groups

        return cls(GroupRunner(ssl_features_groups, max_batch=max_batch, executor=executor),
                   GroupRunner(sv_embedding_groups, max_batch=max_batch, executor=executor))


class VoiceCloner:
    """Clones a voice with one loaded model set.

    Responsibilities: (1) text processing and reference preparation (through a content-keyed,
    bounded cache it owns or is given), (2) the official synthesis flow, yielding results in order.
    Thread-safe: requests share the models read-only; each gets its own decoder and RNG.
    """

    def __init__(self, models: Models, cache: ReferenceCache | None = None,
                 reference_rules: ReferenceRules = ReferenceRules(),
                 max_text_chars: int = EngineSettings.max_text_chars, scheduler=None,
                 fallback: DeviceFallback | None = None, reopen: Callable[[], Any] | None = None,
                 gate=None, conv_backend: str = "auto", lane: Executor | None = None,
                 batches: "ReferenceBatches | None" = None, text_workers=None, stream_context: int = 0,
                 account: Callable[[str, float], None] | None = None) -> None:
        from engine.text.frontend import TextFrontend

        self.scheduler = scheduler  # engine.serving.Scheduler of these models; None: the official flow
        self._reopen = reopen  # the models' current scheduler, when the one held here was closed meanwhile
        self.models = models
        self.cache = cache if cache is not None else ReferenceCache(max_entries=8)
        self.reference_rules = reference_rules
        self.max_text_chars = max_text_chars
        self.fallback = fallback  # runs stages MPS cannot on the CPU (None: every stage on the models' device)
        # engine.serving.gate.DeviceGate of the engine: device work here waits while a CUDA graph is captured
        self._gate = gate
        self._convs = conv_backend  # engine.runtime.conv_backend of reference preparation (new lengths each clip)
        # the engine's threads for reference preparation on an accelerator (None: the caller's thread): each
        # thread that touches the device holds its own cuBLAS/cuDNN handles and workspaces, so hundreds of
        # request threads must not
        self._lane = lane
        # the engine's runners that batch reference clips with other requests' (CUDA); None: each clip alone
        self._batches = batches
        self.frontend = TextFrontend("v1" if models.version == "v1" else "v2", bert=models.bert,
                                     zh_g2p=models.zh_g2p)  # G2PW for v2+ Mandarin when its model is there
        # engine.text.workers.TextWorkers that read text in other processes (the same front end); None: here
        self._text_workers = text_workers
        self.stream_context = stream_context  # EngineSettings.stream_context_tokens (0: the official whole prefix)
        # account(place, seconds): the engine's sum of the time requests spent in a place before the scheduler
        # ("split", "reference", "first_sentence"): over an interval, the mean number of requests there
        self._account = account

    def _device_work(self):
        """The section device work of this cloner runs in (see engine.serving.gate)."""
        return self._gate.work() if self._gate is not None else contextlib.nullcontext()

    def _stage(self, stage: str, module, fn, *args, out_dtype: torch.dtype | None = None, **kwargs):
        """``fn(module, *args, **kwargs)``, through the engine's DeviceFallback when it has one."""
        if self.fallback is None:
            return fn(module, *args, **kwargs)
        return self.fallback.run(stage, module, fn, *args, out_dtype=out_dtype, **kwargs)

    # ---- references --------------------------------------------------------------------
    def prepare(self, reference: Reference) -> PreparedReference:
        """The prepared reference (from the cache when the same clip/transcript/model was seen)."""
        return self._prepare(reference)[0]

    def _prepare(self, reference: Reference) -> tuple[PreparedReference, bool]:
        if not isinstance(reference, Reference):
            raise OptionsError(f"reference must be a Reference, got {type(reference).__name__}")
        prompt_text = self._prompt_text(reference)
        if not prompt_text and self.models.uses_vocoder:
            raise OptionsError(f"a transcript is required for {self.models.version} models (no reference-free mode)",
                               field="reference.text")
        if prompt_text:
            self._check_language(reference.language, "reference.language")
            check_user_text(prompt_text, reference.language, "reference.text")
        main = _read_clip_bytes(reference.audio, "reference audio", "reference.audio")
        aux = tuple(_read_clip_bytes(a, f"auxiliary reference audio {i}", f"reference.aux_audio[{i}]")
                    for i, a in enumerate(reference.aux_audio))
        key = ReferenceKey(sha256_bytes(main), prompt_text, reference.language if prompt_text else "",
                           f"{self.models.id}|{self.reference_rules}",  # a clip checked under other rules differs
                           tuple(sha256_bytes(a) for a in aux))
        return self.cache.get_or_create(key, lambda: self._build_reference(main, aux, prompt_text, reference.language))

    def _build_reference(self, main: bytes, aux: tuple[bytes, ...], prompt_text: str, lang: str) -> PreparedReference:
        if self._lane is not None:
            return self._lane.submit(self._build_reference_here, main, aux, prompt_text, lang).result()
        return self._build_reference_here(main, aux, prompt_text, lang)

    def _build_reference_here(self, main: bytes, aux: tuple[bytes, ...], prompt_text: str, lang: str
                              ) -> PreparedReference:
        with self._device_work(), conv_backend(self.models.device, self._convs):
            return self._build_reference_now(main, aux, prompt_text, lang)

    @staticmethod
    def _prompt_text(reference: Reference) -> str:
        """Official prompt handling: strip newlines, end with "。" ("." for English) unless a split mark ends it."""
        from engine.text.segment import splits

        text = reference.text.strip("\n")
        if not text.strip():
            return ""
        if text[-1] not in splits():
            text += "." if reference.language == "en" else "。"
        return text

    @torch.no_grad()
    def _build_reference_now(self, main: bytes, aux: tuple[bytes, ...], prompt_text: str, lang: str
                             ) -> PreparedReference:
        m = self.models
        dev = m.device
        try:
            clip = read_reference(io.BytesIO(main), self.reference_rules)
        except ReferenceAudioError as e:
            raise with_field(e, "reference.audio")
        batches = self._batches
        # with the batches, HuBERT (below) and the speaker model run together with other requests' clips
        embed_sv = (lambda audio32k: batches.sv((m.sv, audio32k))) if batches is not None and m.sv is not None else None
        feats = self._stage("ssl", (m.sovits, m.ssl, m.sv), _reference_features, clip,
                            with_prompt=bool(prompt_text) and batches is None, embed_sv=embed_sv,
                            sovits_sample_rate=m.sovits_sample_rate)
        specs, svs = [feats.spec], [feats.sv_embedding]
        if not m.uses_vocoder:
            for i, data in enumerate(aux):
                try:
                    aux_clip = read_reference(io.BytesIO(data), self.reference_rules)
                except ReferenceAudioError as e:
                    raise with_field(e, f"reference.aux_audio[{i}]")
                f = self._stage("ssl", (m.sovits, None, m.sv), _reference_features, aux_clip, with_prompt=False,
                                sovits_sample_rate=m.sovits_sample_rate)
                specs.append(f.spec)
                svs.append(f.sv_embedding)
        phones: tuple[int, ...] = ()
        bert = None
        norm = ""
        if prompt_text:
            try:
                tf = self._phones_and_bert(prompt_text, lang, gated=False)  # in the reference's device work
            except TextError as e:
                raise TextError(f"the transcript: {e}", field="reference.text") from e
            phones, norm = tf.phone_ids, tf.norm_text
            bert = self._bert_features(tf).to(dev)
        voice_prompt = None
        sem = feats.prompt_semantic
        if prompt_text and batches is not None:  # HuBERT in one batch with other requests' clips, then the codes
            sem = prompt_codes(batches.ssl((m.ssl, prompt_audio16k(clip, m.sovits_sample_rate))), m.sovits)
        sem = sem.to(dev) if sem is not None else None
        if m.uses_vocoder:
            from engine.acoustic.cfm import prepare_prompt

            audio = torch.from_numpy(clip.audio).unsqueeze(0)  # (1, n) at the clip's rate
            voice_prompt = self._stage("cfm", m.sovits, prepare_prompt, sem, torch.tensor(phones, device=dev),
                                       feats.spec.to(dev), audio, clip.sample_rate)
        dtype = next(m.sovits.parameters()).dtype
        return PreparedReference(
            specs=tuple(s.to(dev, dtype) for s in specs),
            sv=tuple(s.to(dev) for s in svs) if m.sv is not None else None,
            prompt_semantic=sem, prompt_phones=phones, prompt_bert=bert, prompt_norm_text=norm,
            voice_prompt=voice_prompt,
        )

    # ---- text --------------------------------------------------------------------------
    def _check_language(self, code: str, name: str) -> None:
        try:
            self.frontend.check_language(code)
        except UnsupportedLanguageError as e:
            raise UnsupportedLanguageError(str(e), field=name) from e

    def _check_text(self, text: str, text_lang: str) -> None:
        if not isinstance(text, str):
            raise TextError(f"text must be a string, got {type(text).__name__}", field="text")
        if not text.strip():
            raise TextError("text is empty: enter something to read", field="text")
        if len(text) > self.max_text_chars:
            raise TextError(f"text is {len(text)} characters long; at most {self.max_text_chars} are accepted "
                            "per request (split it)", field="text")
        if not isinstance(text_lang, str):
            raise OptionsError("text_lang must be a language code string", field="text_lang")
        self._check_language(text_lang, "text_lang")
        check_user_text(text, text_lang, "text")

    def split(self, text: str, text_lang: str, options: SynthesisOptions = SynthesisOptions()) -> list[str]:
        """The sentences the text is cut into for these options (official non-streaming/streaming rules)."""
        from engine.text.segment import pre_seg_text

        plan = resolve_plan(options, self.models.version)
        if plan.return_fragment or plan.streaming:
            return pre_seg_text(text, text_lang, options.text_split_method)
        return self.frontend.sentences(text, text_lang, options.text_split_method)

    def read_text(self, text: str, lang: str):
        """``text`` through the text front end, without BERT (engine.text.frontend.TextFeatures): in the engine's
        text worker processes when it has them, else on this thread."""
        if self._text_workers is not None:
            return self._text_workers.read(text, lang)
        return self.frontend.phones_and_bert(text, lang, with_bert=False)

    def _phones_and_bert(self, text: str, lang: str, gated: bool = True):
        """``frontend.phones_and_bert(text, lang)``: the reading in a text worker when there are some, BERT here,
        in the device-work section (``gated``: enter it here; else the caller is in it)."""
        features = self._text_workers.read(text, lang) if self._text_workers is not None else None
        with self._device_work() if gated else contextlib.nullcontext():  # BERT runs on the device
            return self.frontend.phones_and_bert(text, lang) if features is None else self.frontend.add_bert(features)

    def _features(self, index: int, sentence: str, lang: str) -> _Sentence | None:
        try:
            tf = self._phones_and_bert(sentence, lang)
        except TextError as e:
            log.info("sentence %d skipped: %s", index, e)
            return None
        if not tf.phone_ids or not tf.norm_text:
            return None
        return _Sentence(index, tuple(tf.phone_ids), self._bert_features(tf), tf.norm_text)

    def _bert_features(self, tf) -> torch.Tensor:
        """(bert_dim, P) float32 for the T2S model. All-zero features (every non-Mandarin segment) are
        made at the GPT's width, so a BERT of another width only matters when it is really used."""
        width = self.models.t2s.bert_proj.in_features
        n = len(tf.phone_ids)
        if tf.bert is None or (tf.bert.shape[0] != width and not bool(tf.bert.any())):
            return torch.zeros(width, n)
        if tf.bert.shape[0] != width:
            raise CheckpointError(f"the BERT model gives {tf.bert.shape[0]}-wide features but the GPT weights "
                                  f"expect {width} (bert_base_path and the GPT model do not belong together)")
        return tf.bert.float()

    # ---- synthesis ---------------------------------------------------------------------
    def __call__(self, text: str, text_lang: str, reference: Reference,
                 options: SynthesisOptions = SynthesisOptions(),
                 on_progress: ProgressCallback | None = None) -> Iterator[Result]:
        """Synthesise ``text`` (language ``text_lang``) in the voice of ``reference``.

        Validation (text, language, reference, options) happens before the first result. Yields
        :class:`Result` objects in order; the last has ``is_last=True``.
        """
        if not isinstance(options, SynthesisOptions):
            raise OptionsError(f"options must be SynthesisOptions, got {type(options).__name__}")
        self._check_text(text, text_lang)
        plan = resolve_plan(options, self.models.version)
        for note in plan.notes:
            log.info("synthesis mode: %s", note)
        t0 = time.perf_counter()
        sentences = self.split(text, text_lang, options)
        if not sentences:
            raise TextError("text has nothing to say: it holds only punctuation or blanks")
        t1 = time.perf_counter()
        prepared, hit = self._prepare(reference)
        if self._account is not None:
            self._account("split", t1 - t0)
            self._account("reference", time.perf_counter() - t1)
        log.debug("reference %s", "from cache" if hit else "prepared")
        seed = options.seed if options.seed != -1 else random.randrange(0, MAX_SEED + 1)
        flow = self._serve if self.scheduler is not None else self._run
        return flow(sentences, text_lang, prepared, options, plan, seed, on_progress)

    def _sampling(self, opts: SynthesisOptions) -> tuple[SamplingParams, StopRules]:
        m = self.models
        params = SamplingParams(top_k=opts.top_k, top_p=float(opts.top_p), temperature=float(opts.temperature),
                                repetition_penalty=float(opts.repetition_penalty))
        rules = StopRules(early_stop_num=opts.early_stop_num if opts.early_stop_num is not None else m.early_stop_num)
        return params, rules

    def _results(self, pieces: Iterator[tuple[Piece, bool]], seed: int, total: int,
                 on_progress: ProgressCallback | None) -> Iterator[Result]:
        """Number the pieces into Results (``last`` marks the final one) and report progress per sentence."""
        m = self.models
        index = done = 0
        try:
            for piece, last in pieces:
                s = piece.sentence
                if piece.ends_sentence:  # reported as soon as the sentence is made, before it is read
                    done += 1
                    if on_progress is not None:
                        on_progress(done, total)
                yield Result(audio=piece.audio, sample_rate=m.output_sample_rate, text=s.norm_text, phones=s.phones,
                             index=index, sentence=s.index, is_last=last, seed=seed, tokens=piece.tokens,
                             kind=piece.kind)
                index += 1
            if not index:
                raise TextError("no sentence of the text could be read (no phones): check the text and text_lang")
        finally:
            close = getattr(pieces, "close", None)
            if close is not None:
                close()  # a reader that stops early frees the request's state now

    # ---- the scheduled flow (engine.serving) ---------------------------------------------------
    def _serve(self, texts: list[str], lang: str, ref: PreparedReference, opts: SynthesisOptions,
               plan: SynthesisPlan, seed: int, on_progress: ProgressCallback | None) -> Iterator[Result]:
        """Hand the request to the scheduler (BusyError when it is full); results come as they are voiced."""
        from engine.serving.requests import Request
        from engine.serving.scheduler import Context

        m = self.models

        def featurise(index: int, text: str) -> _Sentence | None:
            return self._features(index, text, lang)

        if m.device.type == "cpu":  # the caller's thread, then the text thread, fit their thread counts before each
            featurise = cpu_job(featurise)  # sentence and release their OpenMP teams after it (engine.openmp)
        t0 = time.perf_counter()
        first = next((s for i, t in enumerate(texts) if (s := featurise(i, t)) is not None), None)
        if self._account is not None:
            self._account("first_sentence", time.perf_counter() - t0)
        if first is None:
            raise TextError("no sentence of the text could be read (no phones): check the text and text_lang")
        params, rules = self._sampling(opts)
        # official: the streaming gap is counted at the output rate, the whole-sentence one at the SoVITS rate
        gap = silence(opts.fragment_interval, m.output_sample_rate if plan.streaming else m.sovits_sample_rate)
        ctx = Context(cloner=self, ref=ref, options=opts, plan=plan, seed=seed, params=params, rules=rules,
                      stream=plan.streaming, gap=gap)
        request = self._submit(lambda sched: Request(texts, featurise, first, sched.text_executor, ctx))

        def pieces() -> Iterator[tuple[Piece, bool]]:
            for piece in request.pieces():
                yield piece, piece.ends_sentence and not request.has_more_after(piece.sentence.index)

        return self._results(pieces(), seed, len(texts), on_progress)

    def _submit(self, make_request: Callable[[Any], Any]):
        """Submit a request to the scheduler; when it was closed since this cloner was made (evicted, or idle
        under memory pressure), to the one that serves these models now."""
        from engine.serving.scheduler import SchedulerClosedError

        sched = self.scheduler
        try:
            request = make_request(sched)
            sched.submit(request)
        except SchedulerClosedError:
            if self._reopen is None:
                raise
            self.scheduler = sched = self._reopen()
            request = make_request(sched)
            sched.submit(request)
        return request

    # ---- the official flow: one request on its caller's thread ------------------------------------
    def _run(self, texts: list[str], lang: str, ref: PreparedReference, opts: SynthesisOptions, plan: SynthesisPlan,
             seed: int, on_progress: ProgressCallback | None) -> Iterator[Result]:
        m = self.models
        if m.device.type == "cpu":
            fit_threads()  # the cores other processes leave free (engine.openmp); Studio releases the team after
        gen = torch.Generator(device=m.device).manual_seed(seed)  # one RNG stream per request
        # FastT2S serves one request at a time and, when streaming, stays held while the chunks are voiced;
        # streaming requests use the reference loop so that they never wait for each other.
        use_fast = m.t2s_fast is not None and not plan.streaming
        decoder = _FastDecoder(m.t2s_fast, gen) if use_fast else T2SDecoder(m.t2s, generator=gen)
        params, rules = self._sampling(opts)
        flow = (self._stream_flow if plan.streaming else self._fragment_flow if plan.return_fragment
                else self._whole_flow)
        pieces = flow(texts, lang, ref, opts, plan, _Decoding(decoder, params, rules, gen))
        return self._results(pieces, seed, len(texts), on_progress)

    def _lazy_groups(self, texts: list[str], lang: str, size: int) -> Iterator[tuple[list[_Sentence], bool]]:
        """Official streaming/fragment order: sentences featurised ``size`` at a time in text order, each
        group with whether another follows (known once the next group is featurised)."""
        groups = ([s for i in range(start, min(start + size, len(texts)))
                   if (s := self._features(i, texts[i], lang)) is not None]
                  for start in range(0, len(texts), size))
        return _with_lookahead(g for g in groups if g)

    def _stream_flow(self, texts: list[str], lang: str, ref: PreparedReference, opts: SynthesisOptions,
                     plan: SynthesisPlan, d: "_Decoding") -> Iterator[tuple[Piece, bool]]:
        for items, more in self._lazy_groups(texts, lang, opts.batch_size):
            for k, s in enumerate(items):
                final_sentence = not more and k == len(items) - 1
                for audio, toks, kind, end in self._stream_sentence(s, ref, opts, d.decoder, d.params, d.rules,
                                                                   d.gen):
                    yield Piece(audio, s, toks, kind, end), final_sentence and end

    def _fragment_flow(self, texts: list[str], lang: str, ref: PreparedReference, opts: SynthesisOptions,
                       plan: SynthesisPlan, d: "_Decoding") -> Iterator[tuple[Piece, bool]]:
        gap = silence(opts.fragment_interval, self.models.sovits_sample_rate)  # official quirk: the SoVITS rate
        for items, more in self._lazy_groups(texts, lang, opts.batch_size):
            outs = self._decode_batch(items, ref, plan, d.decoder, d.params, d.rules)
            audios = self._acoustic(items, outs, ref, opts, plan, d.gen)
            for k, (s, out, audio) in enumerate(zip(items, outs, audios)):
                yield _sentence_piece(s, out, audio, gap), not more and k == len(items) - 1

    def _whole_flow(self, texts: list[str], lang: str, ref: PreparedReference, opts: SynthesisOptions,
                    plan: SynthesisPlan, d: "_Decoding") -> Iterator[tuple[Piece, bool]]:
        """Official whole-file flow: every sentence featurised, bucketed by length, released in text order."""
        feats = [s for i, t in enumerate(texts) if (s := self._features(i, t, lang)) is not None]
        if not feats:
            raise TextError("no sentence of the text could be read (no phones): check the text and text_lang")
        buckets = bucket_batches([len(s.norm_text) for s in feats], opts.batch_size, opts.batch_threshold,
                                 plan.split_bucket)
        gap = silence(opts.fragment_interval, self.models.sovits_sample_rate)  # official quirk: the SoVITS rate
        pending: dict[int, Piece] = {}
        order = [s.index for s in feats]
        for bucket in buckets:
            items = [feats[j] for j in bucket]
            outs = self._decode_batch(items, ref, plan, d.decoder, d.params, d.rules)
            for s, out, audio in zip(items, outs, self._acoustic(items, outs, ref, opts, plan, d.gen)):
                pending[s.index] = _sentence_piece(s, out, audio, gap)
            while order and order[0] in pending:
                piece = pending.pop(order.pop(0))
                yield piece, not order

    # ---- stages ------------------------------------------------------------------------
    def _t2s_input(self, s: _Sentence, ref: PreparedReference) -> T2SInput:
        dev = self.models.device
        if ref.prompt_semantic is not None:
            phones = torch.tensor(ref.prompt_phones + s.phones, dtype=torch.long, device=dev)
            bert = torch.cat([ref.prompt_bert, s.bert.to(dev)], dim=1)
        else:
            phones = torch.tensor(s.phones, dtype=torch.long, device=dev)
            bert = s.bert.to(dev)
        return T2SInput(phones, bert)

    def _decode_batch(self, items: list[_Sentence], ref: PreparedReference, plan: SynthesisPlan,
                      decoder: T2SDecoder, params: SamplingParams, rules: StopRules) -> list[T2SOutput]:
        inputs = [self._t2s_input(s, ref) for s in items]
        if isinstance(decoder, T2SDecoder):  # FastT2S runs on CUDA only, where nothing falls back
            return self._stage("t2s", self.models.t2s, _t2s_decode, inputs, ref.prompt_semantic, params, rules,
                               plan.t2s_loop, generator=decoder.generator)
        if plan.t2s_loop == "batch":
            return decoder.decode_batch(inputs, ref.prompt_semantic, params, rules)
        return [decoder.decode_naive(x, ref.prompt_semantic, params, rules) for x in inputs]

    @torch.no_grad()
    def _acoustic(self, items: list[_Sentence], outs: list[T2SOutput], ref: PreparedReference,
                  opts: SynthesisOptions, plan: SynthesisPlan, gen: torch.Generator) -> list[torch.Tensor]:
        m = self.models
        dev = m.device
        phones = [torch.tensor(s.phones, dtype=torch.long, device=dev) for s in items]
        tokens = [o.tokens.to(dev) for o in outs]  # a decoder may hand tokens back on the host
        if m.uses_vocoder:
            from engine.acoustic.cfm import (
                synthesize_batched,
                synthesize_sequential,
            )

            voc_dtype = (next(m.vocoder.parameters()).dtype if isinstance(m.vocoder, torch.nn.Module)
                         else torch.float32)  # a Core ML wrapper takes float32

            def vocoder(mel: torch.Tensor) -> torch.Tensor:
                return self._stage("vocoder", m.vocoder, _vocode, mel.to(voc_dtype), out_dtype=torch.float32
                                   ).to(mel.device)

            noise = _noise_from(gen)
            if plan.parallel_infer:
                pieces, _ = self._stage("cfm", m.sovits, synthesize_batched, vocoder, ref.voice_prompt,
                                        list(zip(tokens, phones)), speed=opts.speed_factor,
                                        sample_steps=opts.sample_steps, noise=noise, out_dtype=torch.float32)
                return pieces
            return [self._stage("cfm", m.sovits, synthesize_sequential, vocoder, ref.voice_prompt, t, p,
                                speed=opts.speed_factor, sample_steps=opts.sample_steps, noise=noise,
                                out_dtype=torch.float32)[0]
                    for t, p in zip(tokens, phones)]
        sv = list(ref.sv) if ref.sv is not None else None
        if opts.speed_factor == 1.0:
            # official: the whole batch in one decode (MRTE sees every sentence), cut at token boundaries
            up = math.prod(m.sovits.dims.upsample_rates) * (2 if m.sovits.dims.semantic_frame_rate == "25hz" else 1)
            codes = torch.cat(tokens).view(1, 1, -1)
            wav = self._stage("sovits", m.sovits, _decode, codes, torch.cat(phones).unsqueeze(0), list(ref.specs),
                              speed=1.0, sv_emb=sv, generator=gen, out_dtype=torch.float32)[0, 0]
            ends = np.cumsum([0] + [t.shape[0] * up for t in tokens])
            return [wav[ends[i]:ends[i + 1]] for i in range(len(tokens))]
        return [self._stage("sovits", m.sovits, _decode, t.view(1, 1, -1), p.unsqueeze(0), list(ref.specs),
                            speed=opts.speed_factor, sv_emb=sv, generator=gen, out_dtype=torch.float32)[0, 0]
                for t, p in zip(tokens, phones)]

    @torch.no_grad()
    def _stream_sentence(self, s: _Sentence, ref: PreparedReference, opts: SynthesisOptions, decoder: T2SDecoder,
                         params: SamplingParams, rules: StopRules, gen: torch.Generator,
                         ) -> Iterator[tuple[np.ndarray, tuple[int, ...], str, bool]]:
        """Official token-chunk streaming of one sentence (the streaming branch of ``TTS.run``): chunks at mute tokens, each voiced
        by a :class:`SentenceStream`. Yields ``(audio, tokens, kind, ends_sentence)`` as soon as each
        chunk is decoded."""
        from engine.acoustic.streaming import chunk_tokens

        steps = decoder.naive_steps(self._t2s_input(s, ref), ref.prompt_semantic, params, rules)
        sim = None if opts.fixed_length_chunk else self.models.mute_similarity
        voice = self.sentence_stream(s.phones, ref, opts, gen)
        gap = silence(opts.fragment_interval, self.models.output_sample_rate)  # official: output rate here
        for toks, final in chunk_tokens(steps, opts.min_chunk_length, sim):
            if toks is None:
                tail = voice.tail()
                if tail is not None:
                    yield postprocess(tail), (), "speech", not gap.size
                break
            # with toks None next, the tail still follows: a non-final chunk never ends the sentence
            yield postprocess(voice.voice(toks, final)), tuple(toks), "speech", final and not gap.size
        if gap.size:
            yield gap, (), "silence", True

    def sentence_stream(self, phones: Sequence[int], ref: PreparedReference, opts: SynthesisOptions,
                        gen: torch.Generator | None):
        """The streaming SoVITS state of one sentence (v1/v2/v2Pro*)."""
        from engine.acoustic.streaming import SentenceStream

        m = self.models
        return SentenceStream(m.sovits, torch.tensor(phones, dtype=torch.long), ref.specs,
                              list(ref.sv) if ref.sv is not None else None, opts.speed_factor,
                              opts.overlap_length, gen, fallback=self.fallback, context=self.stream_context)
