"""Token-chunk streaming for SoVITS v1/v2/v2Pro* (official ``Text2SemanticDecoder.infer_panel_naive`` with
``streaming_mode=True`` and the streaming branch of ``TTS.run``): chunking of the T2S token stream
at mute-like tokens, and the official ``decode_streaming`` (decode only the newest latent frames,
cross-faded with the previous chunk's latent).

Responsibilities: pure functions over a shared, unmodified ``SynthesizerTrn``; no state between
calls other than what the caller passes in.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.profiler import record_function

from engine.models.sovits_modules import sequence_mask
from engine.runtime import host_to_device

CHECK_TOKEN_NUM = 2  # official check_token_num: the mute search starts this many tokens past chunk_length
SPLIT_THRESHOLD = 0.0  # official chunk_split_thershold passed by TTS.run


class ChunkTracker:
    """The official streaming chunker for many token streams at once (one row each, numpy state).

    Tokens are pushed one step at a time for any set of rows; a row's chunk is decided one token
    late, as the official loop decides after each step whether decoding stopped. Modes per row:
    ``MUTE`` splits at the best pair of mute-like tokens at position >= chunk_length once
    ``chunk_length + 2`` tokens are pending (the chunk is *all* pending tokens; only those up to the
    split point are consumed, the rest come again in the next chunk, as officially); ``FIXED`` yields
    every ``chunk_length`` tokens (fixed_length_chunk); ``WHOLE`` never splits (the sentence is one
    chunk). The running best pair is kept incrementally, so a step costs a few vector operations
    whatever the number of rows.
    """

    WHOLE, MUTE, FIXED = 0, 1, 2

    def __init__(self, rows: int, capacity: int, mute_similarity: torch.Tensor | None) -> None:
        sim = mute_similarity.detach().float().cpu().numpy() if mute_similarity is not None else None
        self._score = None if sim is None else np.where(sim - np.float32(SPLIT_THRESHOLD) < 0, np.float32(-1),
                                                        sim - np.float32(SPLIT_THRESHOLD)).astype(np.float32)
        self.tokens = np.zeros((rows, capacity), dtype=np.int64)
        self._s = np.zeros((rows, capacity), dtype=np.float32)  # score of each token (-1 below the threshold)
        self.n = np.zeros(rows, dtype=np.int64)  # tokens pushed
        self.ptr = np.zeros(rows, dtype=np.int64)  # official curr_ptr
        self._best_val = np.full(rows, -np.inf, dtype=np.float32)  # best pair score in the window
        self._best_idx = np.zeros(rows, dtype=np.int64)
        self._pending = np.zeros(rows, dtype=bool)  # the last token awaits its check
        self.chunk_length = np.ones(rows, dtype=np.int64)
        self.mode = np.zeros(rows, dtype=np.int8)

    def start(self, row: int, mode: int, chunk_length: int) -> None:
        if mode == self.MUTE and self._score is None:
            raise ValueError("mute-token chunking needs the mute similarity table")
        self.n[row] = self.ptr[row] = 0
        self._best_val[row] = -np.inf
        self._pending[row] = False
        self.mode[row], self.chunk_length[row] = mode, chunk_length

    def grow(self) -> None:
        """Double the token capacity (a tracker of streams of unknown length)."""
        self.tokens = np.concatenate([self.tokens, np.zeros_like(self.tokens)], axis=1)
        self._s = np.concatenate([self._s, np.zeros_like(self._s)], axis=1)

    def move(self, src: int, dst: int) -> None:
        """Move a row's state to another row (the scheduler compacts its slots)."""
        for a in (self.tokens, self._s, self.n, self.ptr, self._best_val, self._best_idx, self._pending,
                  self.chunk_length, self.mode):
            a[dst] = a[src]

    def push(self, rows: np.ndarray, tokens: np.ndarray) -> list[tuple[int, list[int]]]:
        """Append one token per row; returns the chunks that became due, as ``(row, tokens)``."""
        due = self._check(rows[self._pending[rows]])
        j = self.n[rows]
        self.tokens[rows, j] = tokens
        if self._score is not None:
            sc = self._score[tokens]
            self._s[rows, j] = sc
            has_pair = j - self.ptr[rows] >= 1
            pair = self._s[rows, np.maximum(j - 1, 0)] + sc  # float32, as the official tensor
            better = has_pair & (pair > self._best_val[rows])
            self._best_val[rows[better]] = pair[better]
            self._best_idx[rows[better]] = j[better] - 1
        self.n[rows] += 1
        self._pending[rows] = True
        return due

    def finish(self, row: int, eos: bool) -> tuple[list[tuple[int, list[int]]], list[int] | None]:
        """The row stopped (``eos``: on an EOS step, which checks the last token): due chunks and the
        final chunk (None when nothing is pending)."""
        rows = np.array([row]) if eos and self._pending[row] else np.zeros(0, dtype=np.int64)
        due = self._check(rows)
        self._pending[row] = False
        n, ptr = int(self.n[row]), int(self.ptr[row])
        return due, (self.tokens[row, ptr:n].tolist() if ptr < n else None)

    def _check(self, rows: np.ndarray) -> list[tuple[int, list[int]]]:
        out: list[tuple[int, list[int]]] = []
        if rows.size == 0:
            return out
        n, ptr, length, mode = self.n[rows], self.ptr[rows], self.chunk_length[rows], self.mode[rows]
        count = n - ptr
        fixed = rows[(mode == self.FIXED) & (count >= length)]
        for r in fixed.tolist():
            out.append((r, self.tokens[r, self.ptr[r]:self.n[r]].tolist()))
            self.ptr[r] = self.n[r]
        ready = (mode == self.MUTE) & (count >= length + CHECK_TOKEN_NUM)
        if not ready.any():
            return out
        rows, n, ptr, length = rows[ready], n[ready], ptr[ready], length[ready]
        last = self._s[rows, n - 1]
        use_pair = self._best_val[rows] >= last  # ties go to the earlier position, as argmax does
        best = np.where(use_pair, self._best_idx[rows] - ptr, n - 1 - ptr)
        value = np.where(use_pair, self._best_val[rows], last)
        for r, b in zip(rows[(value >= 0) & (best + 1 >= length)].tolist(),
                        best[(value >= 0) & (best + 1 >= length)].tolist()):
            out.append((r, self.tokens[r, self.ptr[r]:self.n[r]].tolist()))
            self.ptr[r] += b + 1
            self._rescan(r)
        return out

    def _rescan(self, row: int) -> None:
        """The best pair of the row's window after its pointer moved."""
        s = self._s[row, self.ptr[row]:self.n[row]]
        if s.size < 2:
            self._best_val[row] = -np.inf
            return
        pairs = s[:-1] + s[1:]
        i = int(pairs.argmax())
        self._best_val[row], self._best_idx[row] = pairs[i], self.ptr[row] + i


def chunk_tokens(steps: Iterator[int], chunk_length: int, mute_similarity: torch.Tensor | None,
                 ) -> Iterator[tuple[list[int] | None, bool]]:
    """Group the kept tokens of ``T2SDecoder.naive_steps`` into the official streaming chunks.

    Yields ``(tokens, is_final)``: the chunks of a one-row :class:`ChunkTracker` (mute-token splits
    with ``mute_similarity``, fixed-length chunks without it), then the final chunk, ``None`` when
    nothing is pending.
    """
    tracker = ChunkTracker(1, 64, mute_similarity)
    tracker.start(0, ChunkTracker.MUTE if mute_similarity is not None else ChunkTracker.FIXED, chunk_length)
    row = np.zeros(1, dtype=np.int64)
    it = iter(steps)
    while True:
        try:
            tok = next(it)
        except StopIteration as done:
            stop = done.value
            break
        if tracker.n[0] == tracker.tokens.shape[1]:
            tracker.grow()
        for _, chunk in tracker.push(row, np.array([tok], dtype=np.int64)):
            yield chunk, False
    due, final = tracker.finish(0, eos=stop is not None and stop.stop == "eos")
    for _, chunk in due:
        yield chunk, False
    if tracker.n[0] == 0 and stop is not None:
        final = [int(t) for t in stop.tokens.tolist()]  # the official "bad zero prediction" token
    yield final, True


@torch.no_grad()
def decode_streaming(sovits, codes: torch.Tensor, text: torch.Tensor, refer: Sequence[torch.Tensor],
                     sv_emb: Sequence[torch.Tensor] | None, speed: float = 1.0, result_length: int | None = None,
                     overlap_frames: torch.Tensor | None = None, noise_scale: float = 0.5,
                     generator: torch.Generator | None = None, ge: torch.Tensor | None = None,
                     text_encoded: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Official ``SynthesizerTrn.decode_streaming`` (padding_length 0).

    codes (1, 1, N) all tokens so far; text (1, P); ``result_length`` tokens to synthesise from the
    end (None: all); ``overlap_frames`` (1, hidden, 2*ov) latent of the previous chunk's tail.
    Returns (audio (1, 1, samples), latent y_ (1, hidden, frames) before the speed change).
    ``ge`` (the style vector of ``refer``) and ``text_encoded`` (:func:`encode_text` of ``text``) may be
    given when they are known from an earlier chunk of the same sentence (the same numbers, computed once).
    """
    if ge is None:
        ge = sovits.style_vector(refer, sv_emb)
    enc = sovits.enc_p
    y_lengths = torch.tensor([codes.size(2) * 2], device=codes.device)
    text_lengths = torch.tensor([text.size(-1)], device=text.device)
    quantized = sovits.quantizer.decode(codes)  # (1, 768, N)
    if sovits.dims.semantic_frame_rate == "25hz":
        quantized = F.interpolate(quantized, size=int(quantized.shape[-1] * 2), mode="nearest")
        result_length = 2 * result_length if result_length is not None else None
    ge_enc = sovits.ge_to512(ge.transpose(2, 1)).transpose(2, 1) if sovits.dims.is_pro else ge
    # enc_p forward with the streaming crop (TextEncoder.forward + result_length/overlap_frames)
    y = quantized
    y_mask = sequence_mask(y_lengths, y.size(2)).unsqueeze(1).to(y.dtype)  # (1, 1, T)
    y = enc.ssl_proj(y * y_mask) * y_mask
    y = enc.encoder_ssl(y * y_mask, y_mask)
    text_mask = sequence_mask(text_lengths, text.size(1)).unsqueeze(1).to(y.dtype)
    t = text_encoded if text_encoded is not None else encode_text(sovits, text, y.dtype)
    y = enc.mrte(y, y_mask, t, text_mask, ge_enc)
    y = enc.encoder2(y * y_mask, y_mask)
    if result_length is not None:
        y, y_mask = y[:, :, -result_length:], y_mask[:, :, -result_length:]
    if overlap_frames is not None:
        ov = overlap_frames.shape[-1]
        window = torch.sin(torch.arange(ov * 2, device=y.device) * math.pi / (ov * 2)).to(y.dtype)
        y = y.clone()
        y[:, :, :ov] = window[:ov].view(1, 1, -1) * y[:, :, :ov] + window[ov:].view(1, 1, -1) * overlap_frames
    latent = y
    if speed != 1:
        y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
        y_mask = F.interpolate(y_mask, size=y.shape[-1], mode="nearest")
    stats = enc.proj(y) * y_mask
    m_p, logs_p = torch.split(stats, enc.out_channels, dim=1)
    noise = torch.randn(m_p.shape, generator=generator, device=m_p.device, dtype=m_p.dtype)
    z_p = m_p + noise * torch.exp(logs_p) * noise_scale
    z = sovits.flow.reverse(z_p, y_mask, g=ge)
    return sovits.dec(z * y_mask, g=ge), latent



def encode_text(sovits, text: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The phones (1, P) through the text encoder of ``enc_p`` -> (1, hidden, P): the same for every chunk
    of a sentence."""
    enc = sovits.enc_p
    text_mask = sequence_mask(torch.tensor([text.size(-1)], device=text.device), text.size(1)).unsqueeze(1).to(dtype)
    t = enc.text_embedding(text).transpose(1, 2)
    return enc.encoder_text(t * text_mask, text_mask)


# batch sizes of a bucketed acoustic round: few, so that a CUDA graph of each voicing shape is captured up front
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def width_bucket(n: int) -> int:
    """``n`` frames rounded up to a shape bucket: a multiple of 16 up to 64, then four buckets per octave (at
    most 25% padding). Bucketed decodes repeat a few shapes, so the convolution plans (cuDNN builds one for
    every new input shape, tens of milliseconds for a decode) are built once and reused."""
    if n <= 64:
        return max(16, -(-n // 16) * 16)
    step = (1 << ((n - 1).bit_length() - 1)) // 4
    return -(-n // step) * step


def batch_bucket(n: int) -> int:
    """``n`` rows rounded up to :data:`BATCH_BUCKETS` (beyond its end: ``n``)."""
    return next((b for b in BATCH_BUCKETS if b >= n), n)


# The fixed cost of one more sub-batch (its kernel launches), in padded output frame-rows: on an H200 a chunk
# decode costs about 20 ms whatever its size, and a padded frame-row about 0.04 ms (benchmarks/acoustic_shapes.py)
GROUP_OVERHEAD_FRAMES = 512
# the most padded output frame-rows decoded at once (rows x width): bounds the decoder's activations (at fp16 about
# 1 GB for its last upsampling stage), so a round of long whole sentences is split instead of running out of memory
MAX_BATCH_FRAMES = 128 * 256


@functools.lru_cache(maxsize=4096)  # a pure function of a few hundred (rows, width) pairs met in rounds
def batch_split(rows: int, width: int, overhead: int = GROUP_OVERHEAD_FRAMES) -> tuple[float, tuple[int, ...]]:
    """``rows`` rows padded to ``width`` frames as the sub-batch sizes that minimise the padded work,
    ``batch_bucket(size) * width`` plus ``overhead`` each: 37 rows as 32 + 5 (padded to 6) instead of one batch of
    48 that decodes 11 dummy rows. A sub-batch holds at most ``MAX_BATCH_FRAMES // width`` padded rows (one row
    always fits). Returns (cost, sizes)."""
    limit = max(1, MAX_BATCH_FRAMES // width)
    best, take = [0.0] + [math.inf] * rows, [0] * (rows + 1)
    for m in range(1, rows + 1):
        # a size padded to a bucket b is never better than b real rows, so buckets and m itself are enough
        for k in {b for b in BATCH_BUCKETS if b <= m} | {m}:
            if k > 1 and batch_bucket(k) > limit:
                continue
            cost = best[m - k] + batch_bucket(k) * width + overhead
            if cost < best[m]:
                best[m], take[m] = cost, k
    sizes, m = [], rows
    while m:
        sizes.append(take[m])
        m -= take[m]
    return best[rows], tuple(sorted(sizes, reverse=True))


def width_groups(widths: Sequence[int], overhead: int = GROUP_OVERHEAD_FRAMES) -> list[list[int]]:
    """Split rows of ``widths`` output frames into groups of similar width, as lists of row indices.

    The rows sorted by :func:`width_bucket` are cut into runs that minimise the padded work (each run decoded in
    the sub-batches of :func:`batch_split` at its widest bucket): one long row (a sentence's last chunk, a whole
    sentence) no longer pads every short chunk of the round to its width."""
    if not widths:
        return []
    bucket = [width_bucket(w) for w in widths]
    sizes = sorted(set(bucket))
    count = [bucket.count(b) for b in sizes]
    best, cut = [0.0] + [math.inf] * len(sizes), [0] * (len(sizes) + 1)
    for j in range(1, len(sizes) + 1):  # best[j]: the cheapest split of the j narrowest buckets
        rows = 0
        for i in range(j, 0, -1):  # the last group holds buckets i-1 .. j-1
            rows += count[i - 1]
            cost = best[i - 1] + batch_split(rows, sizes[j - 1], overhead)[0]
            if cost < best[j]:
                best[j], cut[j] = cost, i - 1
    groups, j = [], len(sizes)
    while j:
        members = set(sizes[cut[j]:j])
        groups.append([k for k in range(len(widths)) if bucket[k] in members])
        j = cut[j]
    return groups[::-1]


def out_frames(sovits, row: dict) -> int:
    """The latent frames a :func:`decode_streaming_batch` row voices (its crop)."""
    n = row["codes"].numel()
    frame = 2 if sovits.dims.semantic_frame_rate == "25hz" else 1
    return frame * (n if row["result_length"] is None else min(n, row["result_length"]))


def prefix_bucket(n: int) -> int:
    """The padded frames of the prefix encoders' input in a bucketed batch: a multiple of 64. Coarser than
    :func:`width_bucket`: the encoders are cheap on the device, and few shapes mean few graphs."""
    return max(64, -(-n // 64) * 64)


def phone_bucket(n: int) -> int:
    """The padded phones of a bucketed batch: at least 128 (a sentence rarely has more), then multiples of 64,
    so that the encoder shapes vary in frames and rows only."""
    return max(128, -(-n // 64) * 64)


def voice_batches(widths: Sequence[int], buckets: bool) -> list[tuple[list[int], int]]:
    """The sub-batches that voice rows of ``widths`` output frames: (row indices, padded width) each. Bucketed:
    groups of similar width (:func:`width_groups`), each in the sizes of :func:`batch_split`, widths rounded to
    :func:`width_bucket`; else one batch at the widest row."""
    if not widths:
        return []
    if not buckets:
        return [(list(range(len(widths))), max(widths))]
    out = []
    for group in width_groups(widths):
        width = width_bucket(max(widths[i] for i in group))
        start = 0
        for size in batch_split(len(group), width)[1]:
            out.append((group[start:start + size], width))
            start += size
    return out


def sentence_row(sovits, codes: torch.Tensor, phones: torch.Tensor, ge: torch.Tensor,
                 generator: torch.Generator | None) -> dict:
    """A :func:`decode_streaming_batch` row that voices a whole sentence (``codes`` (N,), ``phones`` (P,)) with
    ``sovits``: the official ``SynthesizerTrn.decode`` at speed 1, its noise drawn from ``generator``."""
    return {"sovits": sovits, "codes": codes.view(-1), "text": phones.view(-1), "ge": ge, "result_length": None,
            "overlap_frames": None, "generator": generator}


def encode_prefixes(sovits, codes: torch.Tensor, text: torch.Tensor, lengths: torch.Tensor,
                    text_lengths: torch.Tensor, ge: torch.Tensor) -> tuple[torch.Tensor]:
    """The prefix encoders of ``enc_p`` (``TextEncoder.forward`` up to its projection) over right-padded rows:
    codes (B, N) tokens, text (B, P) phones, their valid lengths (B,) (frames, phones), ge (B, gin, 1) ->
    (y (B, hidden, frames),). Device work only, of fixed shapes (a CUDA graph can hold it)."""
    enc = sovits.enc_p
    quantized = sovits.quantizer.decode(codes.unsqueeze(0))  # (B, 768, N)
    if sovits.dims.semantic_frame_rate == "25hz":
        quantized = F.interpolate(quantized, size=int(quantized.shape[-1] * 2), mode="nearest")
    y = quantized
    y_mask = sequence_mask(lengths, y.shape[-1]).unsqueeze(1).to(y.dtype)
    text_mask = sequence_mask(text_lengths, text.shape[-1]).unsqueeze(1).to(y.dtype)
    ge_enc = sovits.ge_to512(ge.transpose(2, 1)).transpose(2, 1) if sovits.dims.is_pro else ge
    y = enc.ssl_proj(y * y_mask) * y_mask
    y = enc.encoder_ssl(y * y_mask, y_mask)
    t = enc.text_embedding(text).transpose(1, 2)  # one batched text encoder (faster than per-row caches here)
    t = enc.encoder_text(t * text_mask, text_mask)
    y = enc.mrte(y, y_mask, t, text_mask, ge_enc)
    return (enc.encoder2(y * y_mask, y_mask),)


def voice_latents(sovits, y: torch.Tensor, lengths: torch.Tensor, noise: torch.Tensor, ge: torch.Tensor,
                  noise_scale: float) -> tuple[torch.Tensor]:
    """Latent frames to audio (``enc_p.proj``, the prior's sample, the flow reversed, the masked HiFi-GAN) over
    right-padded rows: y (B, hidden, W), lengths (B,), noise (B, hidden, W), ge (B, gin, 1) -> (audio (B,
    W * upsampling),). Device work only, of fixed shapes (a CUDA graph can hold it)."""
    enc = sovits.enc_p
    with record_function("acoustic.prior_flow"):
        mask = sequence_mask(lengths, y.shape[-1]).unsqueeze(1).to(y.dtype)
        stats = enc.proj(y) * mask
        m_p, logs_p = torch.split(stats, enc.out_channels, dim=1)
        z_p = m_p + noise * torch.exp(logs_p) * noise_scale
        z = sovits.flow.reverse(z_p, mask, g=ge)
    with record_function("acoustic.hifigan"):
        return (sovits.dec(z * mask, g=ge, mask=mask)[:, 0],)


def compiled_voicing(sovits) -> Callable[..., tuple[torch.Tensor]]:
    """:func:`voice_latents` of ``sovits`` through ``torch.compile`` (Inductor, dynamic shapes: one compile
    serves every bucketed batch and width), after the convolutions it runs (``enc_p.proj``, the flow, the
    HiFi-GAN decoder) are made channels-last (:func:`engine.models.conv_layout.nwc_convolutions`, in place).

    Measured on an H100 (benchmarks/acoustic_levers.py, 64 streamed chunks of 64 frames, fp16): 37 ms a call
    against 78 ms for the eager graph, SNR 54 dB to the eager fp32 decode (eager fp16: 51 dB). Compiling takes
    tens of seconds, on the first call (the first capture); the Inductor cache makes later starts shorter."""
    from engine.models.conv_layout import nwc_convolutions

    nwc_convolutions(sovits.enc_p.proj, sovits.flow, sovits.dec)
    return torch.compile(functools.partial(voice_latents, sovits), dynamic=True)


class AcousticGraphs:
    """The CUDA graphs of one SoVITS model's batched decode (:func:`decode_streaming_batch` with buckets): the
    prefix encoders per (rows, frames, phones) and the voicing per (rows, output frames), each for the shapes
    met, up to a size (larger batches run eagerly) and a count. Owned by the acoustic stage's one thread;
    captured only when it holds the device to itself (:meth:`capture_wanted`)."""

    ENCODER_FRAMES = 64 * 512  # rows x frames of an encoder graph at most
    VOICE_FRAMES = 32 * 160  # rows x output frames of a voicing graph at most (its pool: ~2 GB at fp16)
    VOICE_WIDTH = 256  # output frames of the voicing graphs captured up front (a chunk is ~50); wider ones (whole
    # sentences at low load) are captured when met

    MEMORY_FRACTION = 0.25  # of the device's memory, the most the captures of both banks may take together (at
    # 256 streams on an H100, unbounded captures held 47 GB and later ones failed out of memory): a quarter for
    # the encoders, the rest for the voicing

    def __init__(self, sovits, limit: int = 160, compile: bool = False, max_bytes: int | None = None,
                 **bank) -> None:
        """``compile``: the voicing graphs hold :func:`compiled_voicing` (channels-last convolutions and
        Inductor's fused kernels: 2.1x on an H100); it converts ``sovits``'s voicing convolutions to NWC in
        place (the same numbers, so the model's other users are unaffected). ``max_bytes``: the device memory
        the captures may take (None: :attr:`MEMORY_FRACTION` of a CUDA device's; unbounded elsewhere)."""
        from engine.acoustic.graphs import GraphBank

        self.sovits = sovits
        self.compiled = compile
        device = next(sovits.parameters()).device
        if max_bytes is None and device.type == "cuda":
            max_bytes = int(torch.cuda.get_device_properties(device).total_memory * self.MEMORY_FRACTION)
        encoder_bytes = None if max_bytes is None else max_bytes // 4
        voice_bytes = None if max_bytes is None else max_bytes - encoder_bytes
        self.encoders = GraphBank(functools.partial(encode_prefixes, sovits), limit, max_bytes=encoder_bytes, **bank)
        voice = functools.partial(voice_latents, sovits)
        self.voices = GraphBank(voice, limit, captured=compiled_voicing(sovits) if compile else None,
                                max_bytes=voice_bytes, **bank)

    @property
    def bytes(self) -> int:
        """Device memory the captures took (both banks)."""
        return self.encoders.bytes + self.voices.bytes

    @property
    def wanted(self) -> int:
        return self.encoders.wanted + self.voices.wanted

    @property
    def captures(self) -> int:
        return self.encoders.captures + self.voices.captures

    def want_voices(self, noise_scale: float = 0.5) -> int:
        """Note every voicing shape a bucketed decode can meet within the graph size (each batch bucket at each
        width bucket), for a capture before serving; returns how many are wanted. Only the encoders' shapes,
        which also depend on the prefixes and phones, are left to be met."""
        p = next(self.sovits.parameters())
        hidden, channels = self.sovits.enc_p.proj.in_channels, self.sovits.enc_p.out_channels
        gin = self.sovits.dims.gin_channels
        widths = sorted({width_bucket(n) for n in range(1, self.VOICE_WIDTH + 1)})
        for b in BATCH_BUCKETS:
            for w in (w for w in widths if b * w <= self.VOICE_FRAMES):
                self.voices.want(torch.zeros(b, hidden, w, device=p.device, dtype=p.dtype),
                                 torch.full((b,), w, device=p.device, dtype=torch.long),
                                 torch.zeros(b, channels, w, device=p.device, dtype=p.dtype),
                                 torch.zeros(b, gin, 1, device=p.device, dtype=p.dtype), static=(noise_scale,))
        return self.voices.wanted

    ENCODER_WIDTH = 512  # frames of the encoder graphs captured up front (a 256-token sentence at 25 Hz)

    def want_encoders(self) -> int:
        """Note the encoder shapes of prefixes up to :attr:`ENCODER_WIDTH` frames and 128 phones, at every batch
        bucket within the graph size, for a capture before serving; returns how many are wanted."""
        p = next(self.sovits.parameters())
        frame = 2 if self.sovits.dims.semantic_frame_rate == "25hz" else 1
        gin = self.sovits.dims.gin_channels
        for b in BATCH_BUCKETS:
            for t in range(64, self.ENCODER_WIDTH + 1, 64):
                if b * t > self.ENCODER_FRAMES:
                    continue
                n = t // frame
                self.encoders.want(torch.zeros(b, n, device=p.device, dtype=torch.long),
                                   torch.ones(b, phone_bucket(1), device=p.device, dtype=torch.long),
                                   torch.full((b,), n * frame, device=p.device, dtype=torch.long),
                                   torch.full((b,), phone_bucket(1), device=p.device, dtype=torch.long),
                                   torch.zeros(b, gin, 1, device=p.device, dtype=p.dtype))
        return self.encoders.wanted

    def capture_wanted(self, limit: int | None = None) -> int:
        done = self.voices.capture_wanted(limit)
        return done + self.encoders.capture_wanted(None if limit is None else max(0, limit - done))

    def encode(self, *inputs: torch.Tensor) -> torch.Tensor:
        codes = inputs[0]
        frame = 2 if self.sovits.dims.semantic_frame_rate == "25hz" else 1
        if codes.numel() * frame > self.ENCODER_FRAMES:
            return encode_prefixes(self.sovits, *inputs)[0]
        return self.encoders(*inputs)[0]

    def voice(self, *inputs: torch.Tensor, noise_scale: float) -> torch.Tensor:
        """The audio of a voicing batch; a graph's output is copied (the next replay reuses its memory)."""
        y = inputs[0]
        if y.shape[0] * y.shape[-1] > self.VOICE_FRAMES:
            return voice_latents(self.sovits, *inputs, noise_scale)[0]
        return self.voices(*inputs, static=(noise_scale,))[0].clone()


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().view(-1).cpu().numpy()


def _fade_index(overlaps: Sequence[torch.Tensor | None], w: int) -> tuple[list[int], np.ndarray]:
    """Host side of :func:`_cross_fade`: the distinct overlap sizes and, per row and frame, where its two
    weights are in the table ``[1, 0, window(ov) for each size]`` (1 and 0 past its overlap), and where its
    previous frame is in the rows' overlaps side by side (0 past its overlap)."""
    sizes = sorted({o.shape[-1] for o in overlaps if o is not None})
    offset, at = {}, 2
    for ov in sizes:
        offset[ov], at = at, at + 2 * ov
    index = np.zeros((3, len(overlaps), w), dtype=np.int64)
    index[1] = 1
    placed = 0
    for i, o in enumerate(overlaps):
        if o is not None:
            ov = o.shape[-1]
            index[0, i, :ov] = offset[ov] + np.arange(ov)
            index[1, i, :ov] = offset[ov] + ov + np.arange(ov)
            index[2, i, :ov] = placed + np.arange(ov)
            placed += ov
    return sizes, index


def _cross_fade(crop: torch.Tensor, overlaps: Sequence[torch.Tensor | None], sizes: list[int],
                index: torch.Tensor) -> torch.Tensor:
    """Rows of ``crop`` (B, hidden, W) cross-faded over their first ``ov`` frames with their previous latent
    (``overlaps``: (1, hidden, ov) or None each), as officially: ``window[:ov] * new + window[ov:] * previous``,
    ``window`` the official sine of ``2 * ov`` points computed as it is (on the device, once per size);
    ``sizes``, ``index``: :func:`_fade_index` (the index on the device)."""
    dev = crop.device
    windows = [torch.sin(torch.arange(ov * 2, device=dev) * math.pi / (ov * 2)).to(crop.dtype) for ov in sizes]
    table = torch.cat([crop.new_ones(1), crop.new_zeros(1), *windows])
    weights = table[index[:2]].unsqueeze(2)  # (2, B, 1, W)
    side_by_side = torch.cat([o[0] for o in overlaps if o is not None], dim=1).to(crop.dtype)  # (hidden, sum ov)
    previous = torch.where((index[1] != 1).unsqueeze(1), side_by_side[:, index[2]].transpose(0, 1), 0)
    return weights[0] * crop + weights[1] * previous


@torch.no_grad()
def decode_streaming_batch(sovits, rows: Sequence[dict], noise_scale: float = 0.5, buckets: bool = False,
                           graphs: AcousticGraphs | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`decode_streaming` for several independent streams at once (speed 1), right-padded with masks.

    Each row: ``codes`` (N,) all tokens so far, ``text`` (P,), ``ge`` (1, gin, 1) of its sentence,
    ``result_length`` (tokens from the end, or None), ``overlap_frames`` (1, hidden, 2*ov) or None,
    ``generator``. Returns per row (audio (samples,), latent (1, hidden, frames)). Every stage is masked
    (the encoders and flow as officially, the HiFi-GAN decoder through its ``mask``), so a row's numbers are
    those of :func:`decode_streaming` on it alone, up to rounding.

    The prefix encoders run once for all rows; each row's newest frames are cropped and cross-faded with its
    previous latent; the crops are voiced in :func:`voice_batches`. ``buckets``: pad to a few repeating shapes
    (:func:`prefix_bucket` and :func:`phone_bucket` for the encoders, :func:`width_bucket` and
    :data:`BATCH_BUCKETS` for the voicing;
    extra rows repeat a real one and are dropped), in sub-batches of similar width, so that convolution plans
    and ``graphs`` (:class:`AcousticGraphs`, CUDA) are reused. Codes and phones on the host are best: every
    host number goes to the device in one copy, before any device work is queued (a copy from pageable memory
    waits for the stream).
    """
    if not rows:
        return []
    with record_function("acoustic.host_numbers"):
        batch = _batch_inputs(sovits, rows, buckets)
    with record_function("acoustic.encoders"):
        y = graphs.encode(*batch.inputs) if graphs is not None else encode_prefixes(sovits, *batch.inputs)[0]
    with record_function("acoustic.crop_noise"):
        crop, noise = _crop_and_noise(sovits, rows, batch, y)
    out: list = [None] * len(rows)
    ge, out_lengths = batch.inputs[4], batch.out_lengths
    for (rows_in, w), idx in zip(batch.batches, batch.picks):
        with record_function("acoustic.voice"):
            sub = (crop.index_select(0, idx)[:, :, :w], out_lengths.index_select(0, idx),
                   noise.index_select(0, idx)[:, :, :w], ge.index_select(0, idx))
            audio = (graphs.voice(*sub, noise_scale=noise_scale) if graphs is not None
                     else voice_latents(sovits, *sub, noise_scale)[0])
        up = audio.shape[-1] // w
        for k, i in enumerate(rows_in):
            out[i] = (audio[k, : batch.n_out[i] * up], crop[i : i + 1, :, : batch.n_out[i]])
    return out


@dataclass(frozen=True)
class _Batch:
    """A batched decode's inputs on the device (from one host-to-device copy) and its plan."""

    inputs: tuple  # (codes (b, N), text (b, P), lengths (b,), text lengths (b,), ge (b, gin, 1)): the encoders'
    out_lengths: torch.Tensor  # (b,) output frames of each row's crop
    starts: torch.Tensor  # (b,) where each row's crop starts in its encoded frames
    n_out: list[int]  # output frames of each real row
    w_out: int  # output frames of the widest (bucketed) crop
    batches: list[tuple[list[int], int]]  # voice_batches: (row indices, padded width)
    picks: list[torch.Tensor]  # each sub-batch's rows (padded with repeats of its first), on the device
    fade: tuple[list[int], torch.Tensor] | None  # _fade_index's sizes and index (on the device), when any overlap
    drawn: torch.Tensor  # (real, w_out) where each row's noise is in the rows' draws side by side


def _batch_inputs(sovits, rows: Sequence[dict], buckets: bool) -> _Batch:
    """The host side of :func:`decode_streaming_batch`: shapes, buckets and every host number of the round, sent to
    the device in one copy."""
    dev = sovits.enc_p.proj.weight.device
    dtype = sovits.enc_p.proj.weight.dtype
    frame = 2 if sovits.dims.semantic_frame_rate == "25hz" else 1
    real = len(rows)
    n_codes = [r["codes"].numel() for r in rows]
    n_text = [r["text"].numel() for r in rows]
    n_out = [frame * (n if r["result_length"] is None else min(n, r["result_length"])) for r, n in zip(rows, n_codes)]
    fit = prefix_bucket if buckets else (lambda n: n)
    n_tok = -(-fit(frame * max(n_codes)) // frame)  # encoder tokens (frames / frame)
    p = phone_bucket(max(n_text)) if buckets else max(n_text)
    b = batch_bucket(real) if buckets else real
    w_out = width_bucket(max(n_out)) if buckets else max(n_out)
    batches = voice_batches(n_out, buckets)
    members = [m + m[:1] * ((batch_bucket(len(m)) if buckets else len(m)) - len(m)) for m, _ in batches]
    overlaps = [r["overlap_frames"] for r in rows]
    faded = any(o is not None for o in overlaps)
    sizes, fade = _fade_index(overlaps, w_out) if faded else ([], np.zeros((3, 0, w_out), dtype=np.int64))
    # the host numbers, one copy: per row (row 0 again past ``real``) codes, phones, lengths, crop start; then
    # the sub-batches' rows, the cross-fade's weight index, and where each row's noise is in the rows' draws
    grid = np.zeros((b, n_tok + p + 4), dtype=np.int64)
    for i in range(b):
        k = i if i < real else 0
        grid[i, :n_codes[k]] = _host(rows[k]["codes"])
        grid[i, n_tok:n_tok + n_text[k]] = _host(rows[k]["text"])
        grid[i, -4:] = (frame * n_codes[k], n_text[k], n_out[k], frame * n_codes[k] - n_out[k])
    starts_at = np.cumsum([0, *n_out[:-1]])
    drawn = np.minimum(starts_at[:, None] + np.arange(w_out), max(sum(n_out) - 1, 0))  # past a row's end: masked
    flat = host_to_device(np.concatenate([grid.ravel(), *map(np.asarray, members), fade.ravel(), drawn.ravel()]), dev)
    grid, at = flat[: grid.size].view(grid.shape), grid.size
    picks = []
    for m in members:
        picks.append(flat[at:at + len(m)])
        at += len(m)
    fade, drawn = flat[at:at + fade.size].view(fade.shape), flat[at + fade.size:].view(drawn.shape)
    codes, text = grid[:, :n_tok], grid[:, n_tok:n_tok + p]
    lengths, text_lengths, out_lengths, starts = grid[:, -4], grid[:, -3], grid[:, -2], grid[:, -1]
    ges = [r["ge"].to(dtype) for r in rows]
    ge = torch.cat(ges + ges[:1] * (b - real))  # (b, gin, 1)
    return _Batch((codes, text, lengths, text_lengths, ge), out_lengths, starts, n_out, w_out, batches, picks,
                  (sizes, fade) if faded else None, drawn)


def _crop_and_noise(sovits, rows: Sequence[dict], batch: _Batch, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each real row's newest frames of the encoded prefixes ``y`` (b, hidden, T), cross-faded with its previous
    latent, and its noise draws (its generator, as alone), both (real, channels, w_out), zero past a row's crop."""
    dev, dtype = y.device, sovits.enc_p.proj.weight.dtype
    real, w_out = len(rows), batch.w_out
    lengths, out_lengths, starts = batch.inputs[2], batch.out_lengths, batch.starts
    # each row's newest frames: w_out frames gathered from its crop start, those past its crop zeroed
    hidden = y.shape[1]
    j = torch.arange(w_out, device=dev)
    inside = (j.unsqueeze(0) < out_lengths[:real].unsqueeze(1)).unsqueeze(1)  # (B, 1, W)
    keep = inside.to(y.dtype)
    index = torch.minimum(starts[:real].unsqueeze(1) + j.unsqueeze(0), lengths[:real].unsqueeze(1) - 1)
    crop = torch.gather(y[:real], 2, index.unsqueeze(1).expand(real, hidden, w_out)) * keep
    if batch.fade is not None:
        crop = _cross_fade(crop, [r["overlap_frames"] for r in rows], *batch.fade)
    channels = sovits.enc_p.out_channels
    # each row's own draws (its generator, as alone), side by side in time, then gathered into the padded batch
    draws = torch.cat([torch.randn((1, channels, batch.n_out[i]), generator=rows[i]["generator"], device=dev,
                                   dtype=dtype)[0] for i in range(real)], dim=1)  # (channels, sum of n_out)
    noise = torch.where(inside, draws[:, batch.drawn].transpose(0, 1), 0)  # (B, channels, W), zero past a row's end
    return crop, noise


STREAM_MIN_CHUNK = 10  # official: a non-first streaming chunk shorter than this gets extra overlap


class SentenceStream:
    """The SoVITS side of one sentence's token-chunk streaming (the streaming branch of the official TTS.run): each chunk decodes the
    newest frames cross-faded with the previous chunk's latent, and the audio is SOLA-joined.

    Feed the chunks in order with :meth:`voice`; after the final chunk (or a final ``None`` chunk,
    then :meth:`tail`) the sentence's audio is complete. Holds only this sentence's state.
    """

    def __init__(self, sovits, phones: torch.Tensor, refer: Sequence[torch.Tensor],
                 sv_emb: Sequence[torch.Tensor] | None, speed: float, overlap_length: int,
                 generator: torch.Generator | None, fallback=None, context: int = 0) -> None:
        self.sovits, self.refer, self.sv_emb, self.speed = sovits, list(refer), sv_emb, speed
        # tokens before the chunk (and its overlap) that its prefix encoders see: 0, the whole sentence so far (the
        # official decode); N, at most N (each chunk then costs the same however far into its sentence: not the
        # official numbers, see docs/benchmarks.md "bounded context")
        self.context = context
        self.fallback = fallback  # engine.runtime.DeviceFallback: the "sovits" stage on the CPU when MPS lacks an op
        self.phones = phones.view(1, -1).to(next(sovits.parameters()).device)  # (1, P)
        self.phones_host = phones.view(-1).cpu()  # for batched decodes (host numbers go over in one copy)
        self.overlap_length, self.generator = overlap_length, generator
        self.frames_per_token = 2 if sovits.dims.semantic_frame_rate == "25hz" else 1
        self.up = math.prod(sovits.dims.upsample_rates) * (self.frames_per_token / speed)  # samples per token
        self.overlap_size = math.ceil(overlap_length * self.up)
        self.previous: list[int] = []
        self.last_audio: torch.Tensor | None = None
        self.last_latent: torch.Tensor | None = None
        self._ge: torch.Tensor | None = None
        self._text: torch.Tensor | None = None

    def _plan(self, tokens: Sequence[int], final: bool) -> dict:
        """The decode of one chunk: what :func:`decode_streaming` (or its batch form) needs."""
        first = self.last_audio is None
        self.previous.extend(tokens)
        n = len(tokens)
        ov = self.overlap_length
        if not first and n < STREAM_MIN_CHUNK:  # official: a short chunk gets a longer overlap
            ov += STREAM_MIN_CHUNK - n
        seen = self.previous if not self.context or first else self.previous[-(self.context + n + ov):]
        return {"codes": torch.tensor(seen, dtype=torch.long), "text": self.phones_host,
                "result_length": None if first else n + ov, "generator": self.generator,
                "overlap_frames": None if self.last_latent is None else self.last_latent[:, :, -ov * self.frames_per_token:],
                "n": n, "ov": ov, "first": first, "final": final}

    def _crop(self, plan: dict, audio: torch.Tensor) -> torch.Tensor:
        """A decoded chunk's audio without the extra overlap a short chunk was decoded with."""
        if plan["ov"] > self.overlap_length:
            return audio[-int((self.overlap_length + plan["n"]) * self.up):]
        return audio

    def _finish(self, plan: dict, audio: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """Crop and SOLA-join one decoded chunk (audio (samples,)) -> the audio ready to play."""
        return finish_together([self], [plan], [(audio, latent)])[0]

    def _run(self, fn, *args, **kwargs):
        """``fn(sovits, *args, **kwargs)``, through the device fallback when there is one."""
        if self.fallback is None:
            return fn(self.sovits, *args, **kwargs)
        return self.fallback.run("sovits", self.sovits, fn, *args, **kwargs)

    @torch.no_grad()
    def voice(self, tokens: Sequence[int], final: bool) -> torch.Tensor:
        """The audio (samples,) of one chunk, ready to play."""
        plan = self._plan(tokens, final)
        codes = plan["codes"].to(self.phones.device).view(1, 1, -1)
        audio, latent = self._run(
            decode_streaming, codes, self.phones, self.refer, self.sv_emb, speed=self.speed,
            result_length=plan["result_length"], overlap_frames=plan["overlap_frames"], generator=self.generator,
            ge=self.style, text_encoded=self.text_encoded)
        return self._finish(plan, audio[0, 0], latent)

    @property
    def text_encoded(self) -> torch.Tensor:
        """The sentence's phones through the text encoder (1, hidden, P) (computed once)."""
        if self._text is None:
            self._text = self._run(encode_text, self.phones, next(self.sovits.parameters()).dtype)
        return self._text

    @property
    def style(self) -> torch.Tensor:
        """The style vector ge (1, gin, 1) of this sentence's reference (computed once)."""
        if self._ge is None:
            self._ge = self._run(lambda sovits, refer, sv: sovits.style_vector(refer, sv), self.refer, self.sv_emb)
        return self._ge

    def tail(self) -> torch.Tensor | None:
        """After a final ``None`` chunk: the held-back end of the last chunk (None if nothing was voiced)."""
        return None if self.last_audio is None else self.last_audio[-self.overlap_size:]


@torch.no_grad()
def voice_together(streams: Sequence[SentenceStream], chunks: Sequence[tuple[Sequence[int], bool]],
                   buckets: bool = False, sentences: Sequence[dict] = (), graphs: AcousticGraphs | None = None,
                   lazy: bool = False) -> list:
    """One chunk for each of several different sentence streams, decoded in one batch where they share
    a model and speed 1 (else one by one). Returns each stream's audio, as :meth:`SentenceStream.voice`.
    ``buckets``: decode in bucketed shapes, in sub-batches of similar width (:func:`decode_streaming_batch`),
    a single stream too. ``sentences``: :func:`sentence_row` rows of whole sentences (same model, speed 1)
    decoded in the same batches; their audio (samples,) follows the streams' in the result. ``graphs``: the
    model's :class:`AcousticGraphs` (CUDA, with buckets). ``lazy``: a batched chunk's SOLA join may come back as
    :class:`engine.acoustic.sola.Lagged` (its lag not read: nothing here waits for the device), for
    :class:`engine.acoustic.delivery.Delivery` to cut on the host."""
    sovits = streams[0].sovits if streams else sentences[0]["sovits"] if sentences else None
    if any(r["sovits"] is not sovits for r in sentences):
        raise ValueError("voice_together decodes the sentences of one model at once")
    if not sentences and (len(streams) == 1 and not buckets):
        return [s.voice(t, f) for s, (t, f) in zip(streams, chunks)]
    alone = {i for i, s in enumerate(streams) if s.speed != 1.0 or s.sovits is not sovits}
    together = [i for i in range(len(streams)) if i not in alone]
    out: list = [None] * len(streams)
    for i in alone:
        out[i] = streams[i].voice(*chunks[i])
    plans = [streams[i]._plan(*chunks[i]) for i in together]
    rows = [{**p, "ge": streams[i].style} for i, p in zip(together, plans)]
    if graphs is not None and graphs.sovits is not sovits:
        graphs = None
    decoded = decode_streaming_batch(sovits, [*rows, *sentences], buckets=buckets, graphs=graphs) \
        if rows or sentences else []
    for i, audio in zip(together, finish_together([streams[i] for i in together], plans, decoded, lazy=lazy)):
        out[i] = audio
    return out + [audio for audio, _ in decoded[len(rows):]]


def finish_together(streams: Sequence[SentenceStream], plans: Sequence[dict],
                    decoded: Sequence[tuple[torch.Tensor, torch.Tensor]], lazy: bool = False) -> list:
    """Crop and SOLA-join the decoded chunks (audio (samples,), latent) of several streams, one each -> the
    audio each plays. A first chunk holds back its last ``overlap_size`` samples, a final one is played whole,
    any other is joined to the stream's previous chunk: the joins of chunks with one overlap, dtype and device
    search their lags together (:func:`engine.acoustic.sola.sola_chunks`: one wait for the device for all, none
    with ``lazy``, which may return :class:`engine.acoustic.sola.Lagged` joins)."""
    from engine.acoustic.sola import sola_chunks

    crops = [s._crop(p, audio) for s, p, (audio, _) in zip(streams, plans, decoded)]
    out: list = [None] * len(streams)
    joins: dict[tuple, list[int]] = {}
    for k, (stream, plan, crop) in enumerate(zip(streams, plans, crops)):
        if plan["final"]:
            out[k] = crop
        elif plan["first"]:
            out[k] = crop[:-stream.overlap_size]
        else:
            joins.setdefault((stream.overlap_size, crop.dtype, crop.device), []).append(k)
    for (size, _, _), ks in joins.items():
        with record_function("acoustic.sola"):
            played = sola_chunks([streams[k].last_audio for k in ks], [crops[k] for k in ks], size, lazy=lazy)
        for k, audio in zip(ks, played):
            out[k] = audio
    for stream, crop, (_, latent) in zip(streams, crops, decoded):
        stream.last_latent, stream.last_audio = latent, crop
    return out
