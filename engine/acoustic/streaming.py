"""Token-chunk streaming for SoVITS v1/v2/v2Pro* (official ``Text2SemanticDecoder.infer_panel_naive`` with
``streaming_mode=True`` and the streaming branch of ``TTS.run``): chunking of the T2S token stream
at mute-like tokens, and the official ``decode_streaming`` (decode only the newest latent frames,
cross-faded with the previous chunk's latent).

Responsibilities: pure functions over a shared, unmodified ``SynthesizerTrn``; no state between
calls other than what the caller passes in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F

from engine.models.sovits_modules import sequence_mask

CHECK_TOKEN_NUM = 2  # official check_token_num: the mute search starts this many tokens past chunk_length
SPLIT_THRESHOLD = 0.0  # official chunk_split_thershold passed by TTS.run


def chunk_tokens(steps: Iterator[int], chunk_length: int, mute_similarity: torch.Tensor | None,
                 ) -> Iterator[tuple[list[int] | None, bool]]:
    """Group the kept tokens of ``T2SDecoder.naive_steps`` into the official streaming chunks.

    Yields ``(tokens, is_final)``. With ``mute_similarity`` (cosine similarity of every token to the
    mute token), once ``chunk_length + 2`` tokens are pending the split point is the best pair of
    mute-like tokens at position >= chunk_length; the chunk yielded is *all* pending tokens and only
    those up to the split point are consumed (the rest come again in the next chunk, as officially).
    Without it (fixed_length_chunk), every ``chunk_length`` tokens are yielded. The final chunk is
    ``None`` when nothing is pending.
    """
    y: list[int] = []
    ptr = 0  # official curr_ptr, relative to the first generated token
    counter = 0
    stop = None
    it = iter(steps)
    try:
        tok = next(it)
    except StopIteration as done:
        stop = done.value
        tok = None
    while tok is not None:
        try:
            nxt = next(it)
        except StopIteration as done:
            nxt, stop = None, done.value
        y.append(tok)
        counter += 1
        # the official loop checks for a chunk after every step except the one that stops decoding;
        # a token followed by an EOS step was not on the stopping step.
        checked = nxt is not None or (stop is not None and stop.stop == "eos")
        if checked:
            if mute_similarity is not None and counter >= chunk_length + CHECK_TOKEN_NUM:
                score = mute_similarity[torch.tensor(y[ptr:])] - SPLIT_THRESHOLD
                score[score < 0] = -1
                score[:-1] = score[:-1] + score[1:]  # pairs of consecutive tokens
                best = int(score.argmax())
                if float(score[best]) >= 0 and best + 1 >= chunk_length:
                    yield list(y[ptr:]), False
                    counter -= best + 1
                    ptr += best + 1
            elif mute_similarity is None and counter >= chunk_length:
                yield list(y[len(y) - counter:]), False
                ptr += counter
                counter = 0
        tok = nxt
    if not y and stop is not None:
        y = [int(t) for t in stop.tokens.tolist()]  # the official "bad zero prediction" token
    yield (list(y[ptr:]) if ptr < len(y) else None), True


@torch.no_grad()
def decode_streaming(sovits, codes: torch.Tensor, text: torch.Tensor, refer: Sequence[torch.Tensor],
                     sv_emb: Sequence[torch.Tensor] | None, speed: float = 1.0, result_length: int | None = None,
                     overlap_frames: torch.Tensor | None = None, noise_scale: float = 0.5,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Official ``SynthesizerTrn.decode_streaming`` (padding_length 0).

    codes (1, 1, N) all tokens so far; text (1, P); ``result_length`` tokens to synthesise from the
    end (None: all); ``overlap_frames`` (1, hidden, 2*ov) latent of the previous chunk's tail.
    Returns (audio (1, 1, samples), latent y_ (1, hidden, frames) before the speed change).
    """
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
    t = enc.text_embedding(text).transpose(1, 2)
    t = enc.encoder_text(t * text_mask, text_mask)
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
