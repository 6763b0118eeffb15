"""Bounded-context token streaming (EngineSettings.stream_context_tokens): a chunk's prefix encoders see at most N
tokens before it. 0, or a bound the sentence never reaches, is the official decode exactly; a smaller bound feeds
the encoders the last tokens only, gives audio of the same lengths, and batches as it decodes alone."""

from __future__ import annotations

import torch

import tests.support.synth as sup
from engine.acoustic.streaming import SentenceStream, voice_together
from engine.cloner import VoiceCloner
from engine.options import EngineSettings
from engine.reference import Reference
from engine.reference_cache import ReferenceCache

CHUNKS = [6, 5, 7, 4, 6]  # tokens per chunk; the last is final


def _setup(version: str = "v2"):
    models = sup.studio(version).cloner().models
    ref = VoiceCloner(models, ReferenceCache()).prepare(Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"))
    phones = torch.randint(1, 300, (20,), generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(0, 1024, (sum(CHUNKS),), generator=torch.Generator().manual_seed(2)).tolist()
    return models, ref, phones, tokens


def _stream(models, ref, phones, context: int, seed: int = 5) -> SentenceStream:
    sv = list(ref.sv) if ref.sv is not None else None
    return SentenceStream(models.sovits, phones, ref.specs, sv, 1.0, 2, torch.Generator().manual_seed(seed),
                          context=context)


def _chunks(tokens: list[int]) -> list[tuple[list[int], bool]]:
    out, at = [], 0
    for i, n in enumerate(CHUNKS):
        out.append((tokens[at:at + n], i == len(CHUNKS) - 1))
        at += n
    return out


def test_no_bound_and_an_unreached_bound_are_the_official_decode() -> None:
    models, ref, phones, tokens = _setup()
    official, unreached = _stream(models, ref, phones, 0), _stream(models, ref, phones, 10_000)
    for chunk, final in _chunks(tokens):
        torch.testing.assert_close(unreached.voice(chunk, final), official.voice(chunk, final), rtol=0, atol=0)


def test_a_bound_feeds_the_encoders_the_last_tokens_and_keeps_every_length() -> None:
    models, ref, phones, tokens = _setup()
    official, bounded = _stream(models, ref, phones, 0), _stream(models, ref, phones, 4)
    differs = False
    seen = []
    for i, (chunk, final) in enumerate(_chunks(tokens)):
        seen += chunk
        plan = bounded._plan(chunk, final)
        bounded.previous = bounded.previous[:-len(chunk)]  # _plan records the chunk; voice() records it again
        if i == 0:
            assert plan["codes"].tolist() == seen  # the first chunk has nothing before it
        else:
            assert plan["codes"].tolist() == seen[-(4 + plan["n"] + plan["ov"]):]
        want, got = official.voice(chunk, final), bounded.voice(chunk, final)
        assert got.shape == want.shape
        differs |= i > 0 and not torch.equal(got, want)
    assert differs  # the encoders see less: not the official numbers (docs/benchmarks.md gives the difference)


def test_bounded_streams_batched_get_their_numbers_alone() -> None:
    models, ref, phones, tokens = _setup()
    other = torch.randint(0, 1024, (sum(CHUNKS),), generator=torch.Generator().manual_seed(3)).tolist()
    alone = [_stream(models, ref, phones, 4, seed=5), _stream(models, ref, phones, 4, seed=6)]
    batched = [_stream(models, ref, phones, 4, seed=5), _stream(models, ref, phones, 4, seed=6)]
    for a, b in zip(_chunks(tokens), _chunks(other)):
        want = [alone[0].voice(*a), alone[1].voice(*b)]
        got = voice_together(batched, [a, b])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_the_setting_reaches_every_sentence_stream() -> None:
    from engine.config import load_config
    from engine.loading.model_pool import WeightSet
    from engine.options import SynthesisOptions
    from engine.runtime import resolve_runtime
    from engine.studio import Studio

    studio = Studio(WeightSet.from_config(load_config(sup.model_config("v2"))), resolve_runtime("cpu", "fp32"),
                    EngineSettings(stream_context_tokens=32))
    try:
        cloner = studio.cloner()
        ref = cloner.prepare(Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"))
        assert cloner.sentence_stream([1, 2, 3], ref, SynthesisOptions(), None).context == 32
    finally:
        studio.close()
    assert sup.studio("v2").cloner().sentence_stream([1, 2, 3], ref, SynthesisOptions(), None).context == 0
