"""The synthesis pipeline end to end on tiny random weights of every version: order, lengths, sample
rates, seeds, caching, streaming, bad input. Decoding is bounded with ``early_stop_num`` to stay fast.

Expected lengths come from the official relations (TTS.run, TTS.audio_postprocess): v1/v2/v2Pro* give
``2 * prod(upsample_rates)`` samples per semantic token (1280 with the official dims), v3
``floor(2N * 1.875) * 256``, v4 ``2N * 2 * 480``; every sentence is followed by
``int(32000 * fragment_interval)`` zeros (the SoVITS rate, even for v3/v4).
"""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tests.support.synth as sup
from engine.acoustic.streaming import chunk_tokens
from engine.errors import (
    EngineError,
    OptionsError,
    ReferenceAudioError,
    TextError,
    UnsupportedLanguageError,
)
from engine.options import SynthesisOptions
from engine.cloner import VoiceCloner, bucket_batches
from engine.reference import Reference
from engine.results import Result, join
from engine.reference_cache import ReferenceCache
from engine.t2s.decoding import T2SOutput

FAST = SynthesisOptions(seed=11, early_stop_num=12, sample_steps=2, text_split_method="cut5")
TWO_SENTENCES = "Good morning my friend. See you again soon."


def reference(pitch: float = 140.0, seed: int = 0, text: str = sup.REF_TEXT) -> Reference:
    return Reference(sup.wav_bytes(sup.clip(pitch=pitch, seed=seed)), text, "en")


def expected_samples(models, n_tokens: int, speed: float = 1.0) -> int:
    """Samples SoVITS/vocoder produce for n tokens (official relations, see the module docstring)."""
    if models.version == "v3":
        return math.floor(2 * n_tokens * 1.875) * 256
    if models.version == "v4":
        return 2 * n_tokens * 2 * 480
    up = math.prod(models.sovits.dims.upsample_rates)
    frames = 2 * n_tokens if speed == 1.0 else int(2 * n_tokens / speed) + 1
    return frames * up


def check_order(results: list[Result]) -> None:
    assert [r.index for r in results] == list(range(len(results)))
    assert [r.is_last for r in results] == [False] * (len(results) - 1) + [True]
    assert [r.sentence for r in results] == sorted(r.sentence for r in results)


@pytest.mark.parametrize("version", sup.VERSIONS)
def test_every_version_end_to_end(version):
    cloner = sup.studio(version).cloner()
    # v3/v4: the sequential CFM path here (the batched one pads every window to ~500 frames, slow on
    # a CPU); test_v3_v4_streaming_falls_back_to_whole_sentences runs the batched path.
    opts = FAST.replace(batch_size=2, parallel_infer=version not in ("v3", "v4"))
    results = list(cloner(TWO_SENTENCES, "en", reference(), opts))
    check_order(results)
    assert len(results) == 2 and [r.sentence for r in results] == [0, 1]
    gap = int(32000 * opts.fragment_interval)
    for r in results:
        assert r.sample_rate == sup.OUTPUT_RATE[version] == cloner.models.output_sample_rate
        assert r.audio.dtype == np.float32 and r.audio.ndim == 1 and np.abs(r.audio).max() <= 1.0
        assert len(r.tokens) >= 1 and r.seed == 11 and r.phones
        assert r.audio.shape[0] == expected_samples(cloner.models, len(r.tokens)) + gap
        assert not r.audio[-gap:].any()  # the fragment interval is silence
        assert r.audio[:-gap].any()
    again = list(cloner(TWO_SENTENCES, "en", reference(), opts))
    for a, b in zip(results, again):  # same seed, same audio
        np.testing.assert_array_equal(a.audio, b.audio)
        assert a.tokens == b.tokens
    rate, audio = join(results)
    assert rate == sup.OUTPUT_RATE[version] and audio.shape[0] == sum(r.audio.shape[0] for r in results)


def test_random_seed_is_reported_and_reproduces():
    cloner = sup.studio("v2").cloner()
    first = list(cloner("Nice to meet you.", "en", reference(), FAST.replace(seed=-1)))
    seed = first[0].seed
    assert 0 <= seed <= 2**32 - 1
    again = list(cloner("Nice to meet you.", "en", reference(), FAST.replace(seed=seed)))
    np.testing.assert_array_equal(join(first)[1], join(again)[1])
    other = list(cloner("Nice to meet you.", "en", reference(), FAST.replace(seed=seed + 1)))
    assert not np.array_equal(join(first)[1], join(other)[1])


def test_bucketing_restores_the_sentence_order():
    cloner = sup.studio("v2").cloner()
    text = ("A very long first sentence, with many many words in it. Hi there. Short one. "
            "Another rather long sentence here.")
    opts = FAST.replace(batch_size=3, split_bucket=True, early_stop_num=11)
    sentences = cloner.split(text, "en", opts)
    results = list(cloner(text, "en", reference(), opts))
    check_order(results)
    assert [r.sentence for r in results] == list(range(len(sentences))) and len(sentences) == 5
    lens = [len(r.text) for r in results]
    assert bucket_batches(lens, 3, 0.75, True) != [[0, 1, 2], [3]]  # the buckets really were reordered


def test_bucket_batches_matches_the_official_grouping():
    # hand-worked from the official to_batch: sort by length, shrink a window from the right until
    # len[middle] / mean >= threshold
    assert bucket_batches([5, 50, 6, 48], 2, 0.75, True) == [[0, 2], [3, 1]]
    assert bucket_batches([1, 10, 10], 3, 0.75, True) == [[0, 1, 2]]  # 10 / 7 >= 0.75
    assert bucket_batches([10, 1, 1], 3, 0.75, True) == [[1, 2], [0]]  # 1 / 4 < 0.75 -> shrink
    assert bucket_batches([3, 2, 1, 4], 2, 0.75, False) == [[0, 1], [2, 3]]


def test_speed_factor_stretches_each_sentence():
    cloner = sup.studio("v2").cloner()
    opts = FAST.replace(speed_factor=1.5)
    results = list(cloner("Nice to meet you.", "en", reference(), opts))
    gap = int(32000 * 0.3)
    for r in results:
        assert r.audio.shape[0] == expected_samples(cloner.models, len(r.tokens), 1.5) + gap


def test_streaming_chunks_in_order_and_reproducible():
    cloner = sup.studio("v2").cloner()
    opts = FAST.replace(streaming_mode=True, min_chunk_length=4, early_stop_num=16, fixed_length_chunk=True)
    results = list(cloner("Nice to meet you.", "en", reference(), opts))
    check_order(results)
    speech = [r for r in results if r.kind == "speech"]
    assert len(speech) >= 3 and results[-1].kind == "silence"
    assert results[-1].audio.shape[0] == int(32000 * 0.3) and not results[-1].audio.any()
    assert all(len(r.tokens) == 4 for r in speech[:-1])  # fixed-length chunks of min_chunk_length tokens
    assert all(r.audio.shape[0] > 0 for r in speech)
    again = list(cloner("Nice to meet you.", "en", reference(), opts))
    np.testing.assert_array_equal(join(results)[1], join(again)[1])
    mute = list(cloner("Nice to meet you.", "en", reference(), opts.replace(fixed_length_chunk=False)))
    check_order(mute)
    assert mute[-1].kind == "silence"


def test_v3_v4_streaming_falls_back_to_whole_sentences():
    cloner = sup.studio("v4").cloner()
    results = list(cloner("Nice to meet you.", "en", reference(), FAST.replace(streaming_mode=True)))
    assert len(results) == 1 and results[0].kind == "speech"


def _steps(tokens, stop):
    """A fake ``naive_steps``: yields kept tokens, returns the T2SOutput."""
    yield from tokens
    return T2SOutput(tokens=torch.tensor(tokens), steps=len(tokens), stop=stop, sequence=torch.tensor(tokens))


def test_chunk_tokens_splits_at_mute_pairs_like_the_official_loop():
    sim = torch.full((1025,), -0.5)
    sim[486] = 1.0
    toks = [1, 2, 3, 4, 486, 486, 5, 6, 7, 8]
    chunks = list(chunk_tokens(_steps(toks, "eos"), 4, sim))
    # after 6 tokens (chunk_length + 2): scores [-1,-1,-1,-1,1,1] -> pairs [-2,-2,-2,0,2,1]; best pair
    # starts at 4 (>= chunk_length - 1): all 6 pending tokens go out, 5 are consumed, 486 is pending again.
    assert chunks[0] == ([1, 2, 3, 4, 486, 486], False)
    # nothing scores >= 0 at a split point >= 4 later on; the rest comes with the final chunk
    assert chunks[-1] == ([486, 5, 6, 7, 8], True) and len(chunks) == 2


def test_chunk_tokens_fixed_length_and_final_none():
    chunks = list(chunk_tokens(_steps(list(range(8)), "eos"), 4, None))
    assert chunks == [([0, 1, 2, 3], False), ([4, 5, 6, 7], False), (None, True)]
    # a token on the early-stop step is not checked for a chunk: it goes out with the final one
    chunks = list(chunk_tokens(_steps(list(range(8)), "early_stop"), 4, None))
    assert chunks == [([0, 1, 2, 3], False), ([4, 5, 6, 7], True)]


def test_reference_cache_hits_and_evictions():
    models = sup.studio("v2").cloner().models
    cache = ReferenceCache(max_entries=1, max_bytes=1 << 30)
    cloner = VoiceCloner(models, cache)
    a, b = reference(140.0, 0), reference(190.0, 1)
    list(cloner("Hello.", "en", a, FAST))
    list(cloner("Bye now.", "en", a, FAST))
    assert (cache.stats().misses, cache.stats().hits) == (1, 1)
    list(cloner("Hello.", "en", b, FAST))
    assert (cache.stats().misses, cache.stats().evictions, len(cache)) == (2, 1, 1)
    list(cloner("Hello.", "en", Reference(a.audio, "Another transcript.", "en"), FAST))
    assert cache.stats().misses == 3  # the transcript is part of the key
    assert cache.nbytes > 0


def test_prepared_reference_does_not_depend_on_how_the_clip_is_given(tmp_path):
    cloner = VoiceCloner(sup.studio("v2").cloner().models, ReferenceCache())
    path = tmp_path / "ref.wav"
    data = sup.wav_bytes(sup.clip())
    path.write_bytes(data)
    p1 = cloner.prepare(Reference(str(path), sup.REF_TEXT, "en"))
    p2 = cloner.prepare(Reference(data, sup.REF_TEXT, "en"))
    assert p1 is p2  # same bytes, same key


def test_reference_free_and_aux_references():
    cloner = sup.studio("v2").cloner()
    free = list(cloner("Nice to meet you.", "en", Reference(sup.wav_bytes(sup.clip())), FAST))
    assert free and free[-1].is_last
    plain = join(cloner("Nice to meet you.", "en", reference(), FAST))[1]
    aux_ref = Reference(reference().audio, sup.REF_TEXT, "en", (sup.wav_bytes(sup.clip(pitch=220.0, seed=4)),))
    mixed = join(cloner("Nice to meet you.", "en", aux_ref, FAST))[1]
    assert not np.array_equal(plain, mixed)  # the aux style vector is averaged in
    with pytest.raises(OptionsError, match="transcript is required") as info:
        list(sup.studio("v3").cloner()("Nice to meet you.", "en", Reference(sup.wav_bytes(sup.clip())), FAST))
    assert info.value.field == "reference.text"


def test_progress_callback():
    cloner = sup.studio("v2").cloner()
    calls = []
    list(cloner(TWO_SENTENCES, "en", reference(), FAST, on_progress=lambda d, t: calls.append((d, t))))
    assert calls == [(1, 2), (2, 2)]


def test_concurrent_requests_match_sequential_ones():
    cloner = sup.studio("v2").cloner()
    jobs = [(reference(120.0 + 30 * i, i), FAST.replace(seed=100 + i)) for i in range(3)]
    alone = [join(cloner("Nice to meet you.", "en", ref, opts))[1] for ref, opts in jobs]
    got: dict[int, np.ndarray] = {}

    def work(i):
        ref, opts = jobs[i]
        got[i] = join(cloner("Nice to meet you.", "en", ref, opts))[1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, audio in enumerate(alone):
        np.testing.assert_array_equal(got[i], audio)


def test_memory_pressure_degrades_to_cpu():
    from engine.memory import MemoryReading
    from engine.studio import Studio
    from engine.runtime import Runtime

    shared = sup.studio("v2")
    gpu_like = Runtime(device=torch.device("cuda", 0))  # never used: the guard sends the request to the CPU
    studio = Studio(shared.default_weights, gpu_like, pool=shared.pool,
                    memory_reader=lambda device: MemoryReading(99, 100))
    results = list(studio.synthesize("Nice to meet you.", "en", reference(), FAST))
    assert results and studio.memory.decisions["cpu"] == 1


def test_memory_pressure_closes_idle_schedulers_and_the_next_request_makes_a_new_one():
    from engine.memory import MemoryReading
    from engine.studio import Studio

    shared = sup.studio("v2")
    pressure = [False]
    studio = Studio(shared.default_weights, shared.runtime,  # its own pool: the degrade steps empty it
                    memory_reader=lambda device: MemoryReading(99 if pressure[0] and studio.load()["slots"] else 50,
                                                               100))
    try:
        first = join(studio.synthesize("Nice to meet you.", "en", reference(), FAST))[1]
        sched = studio.scheduler(studio.cloner().models)
        assert sched.idle and sched.kv_bytes > 0
        pressure[0] = True  # above the watermark until no scheduler holds a KV pool
        again = join(studio.synthesize("Nice to meet you.", "en", reference(), FAST))[1]
        assert studio.memory.counts()["step:idle schedulers"] == 1
        assert studio.scheduler(studio.cloner().models) is not sched  # a new one took its place
        assert np.array_equal(first, again)
        held = studio.cloner()  # made before its scheduler closes, used after: it finds the new one
        assert studio._close_idle_schedulers() > 0
        assert np.array_equal(join(held("Nice to meet you.", "en", reference(), FAST))[1], first)
    finally:
        studio.close()


def test_pcm16_and_join():
    r = Result(audio=np.array([0.5, -1.0, 1.0, 0.0], dtype=np.float32), sample_rate=32000, text="", phones=(),
               index=0, sentence=0, is_last=True, seed=0)
    assert r.pcm16().tolist() == [16384, -32768, 32767, 0]  # +1.0 is clipped (the official cast wraps)
    with pytest.raises(EngineError):
        join([])


# ---- bad input -------------------------------------------------------------------------------


def short_clip() -> bytes:
    return sup.wav_bytes(sup.clip(seconds=1.0))


BAD_INPUT = [
    ("text_lang", dict(text_lang="xx"), UnsupportedLanguageError, "'xx'"),
    ("prompt_lang", dict(ref=Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "xx")), UnsupportedLanguageError,
     "'xx'"),
    ("empty text", dict(text=""), TextError, "text is empty"),
    ("blank text", dict(text="  \n "), TextError, "text is empty"),
    ("huge text", dict(text="word " * 3000), TextError, "at most"),
    ("only punctuation", dict(text="。。。!!!"), TextError, "nothing to say"),
    ("missing file", dict(ref=Reference("/nonexistent/ref.wav", sup.REF_TEXT, "en")), ReferenceAudioError,
     "not found"),
    ("unreadable", dict(ref=Reference(b"RIFF not really a wav", sup.REF_TEXT, "en")), ReferenceAudioError, "read"),
    ("too short", dict(ref=Reference(short_clip(), sup.REF_TEXT, "en")), ReferenceAudioError, "too short"),
    ("silent", dict(ref=Reference(sup.wav_bytes(np.zeros(24000 * 4, np.float32)), sup.REF_TEXT, "en")),
     ReferenceAudioError, "silent"),
    ("options type", dict(options={"top_k": 5}), OptionsError, "SynthesisOptions"),
    ("text type", dict(text=b"bytes"), TextError, "string"),
]


FIELDS = {"text_lang": "text_lang", "prompt_lang": "reference.language", "empty text": "text", "huge text": "text",
          "missing file": "reference.audio", "unreadable": "reference.audio", "too short": "reference.audio",
          "silent": "reference.audio"}


@pytest.mark.parametrize("case,change,error,match", BAD_INPUT, ids=[c[0] for c in BAD_INPUT])
def test_bad_input_is_refused_with_the_field_named(case, change, error, match):
    cloner = VoiceCloner(sup.studio("v2").cloner().models, ReferenceCache())
    kwargs = dict(text="Nice to meet you.", text_lang="en", ref=reference(), options=FAST)
    kwargs.update(change)
    with pytest.raises(error, match=match) as info:
        list(cloner(kwargs["text"], kwargs["text_lang"], kwargs["ref"], kwargs["options"]))
    assert info.value.field == FIELDS.get(case, info.value.field)  # the input at fault, in the engine's words
    assert len(cloner.cache) == 0  # nothing half-prepared is kept


def test_reference_needs_prompt_lang_with_text():
    with pytest.raises(OptionsError, match="language is required") as info:
        Reference(b"x", "some transcript", "")
    assert info.value.field == "reference.language"  # the engine's name; a front door says its own
    with pytest.raises(ReferenceAudioError, match="reference clip is required") as info:
        Reference("")
    assert info.value.field == "reference.audio"


def test_results_are_released_as_soon_as_they_are_made():
    cloner = sup.studio("v2").cloner()
    calls = []
    stream = cloner("Nice to meet you.", "en", reference(),
                    FAST.replace(streaming_mode=True, min_chunk_length=4, early_stop_num=16, fixed_length_chunk=True),
                    on_progress=lambda d, t: calls.append(d))
    first = next(stream)
    assert first.kind == "speech" and not first.is_last and calls == []  # the sentence is still being decoded
    rest = list(stream)
    assert rest[-1].is_last and calls == [1]
    calls.clear()
    fragments = cloner(TWO_SENTENCES, "en", reference(), FAST.replace(return_fragment=True),
                       on_progress=lambda d, t: calls.append(d))
    assert next(fragments).sentence == 0 and calls == [1]  # sentence 1 not synthesised yet
    assert [r.is_last for r in fragments] == [True]


def test_streaming_without_fragment_silence_marks_the_last_chunk():
    cloner = sup.studio("v2").cloner()
    results = list(cloner("Nice to meet you.", "en", reference(),
                          FAST.replace(streaming_mode=True, min_chunk_length=4, early_stop_num=16,
                                       fragment_interval=0.0)))
    check_order(results)
    assert all(r.kind == "speech" for r in results)


@pytest.mark.parametrize("version", ["v2", "v2Pro"])
@pytest.mark.parametrize("speed", [1.0, 1.3])
def test_decode_streaming_without_crop_equals_decode(version, speed):
    """decode_streaming re-runs enc_p with the streaming crop; uncropped it must be the model's own decode."""
    from engine.acoustic.streaming import decode_streaming

    models = sup.studio(version).cloner().models
    cloner = VoiceCloner(models, ReferenceCache())
    ref = cloner.prepare(reference())
    codes = torch.randint(0, 1024, (1, 1, 14), generator=torch.Generator().manual_seed(1))
    phones = torch.randint(1, 300, (1, 9), generator=torch.Generator().manual_seed(2))
    sv = list(ref.sv) if ref.sv is not None else None
    want = models.sovits.decode(codes, phones, list(ref.specs), speed=speed, sv_emb=sv,
                                generator=torch.Generator().manual_seed(5))
    got, latent = decode_streaming(models.sovits, codes, phones, list(ref.specs), sv, speed=speed,
                                   generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert latent.shape[-1] == 2 * 14  # the latent before the speed change, at 50 Hz
    # cropped: only the last frames are synthesised
    part, _ = decode_streaming(models.sovits, codes, phones, list(ref.specs), sv, result_length=4,
                               overlap_frames=latent[:, :, -4:], generator=torch.Generator().manual_seed(5))
    assert part.shape[-1] == 2 * 4 * math.prod(models.sovits.dims.upsample_rates)


def test_a_request_closed_early_frees_its_state():
    """A client that goes away closes the iterator: decoding stops there and the next request runs normally."""
    cloner = sup.studio("v2").cloner()
    opts = FAST.replace(streaming_mode=True, min_chunk_length=4, early_stop_num=40, fixed_length_chunk=True)
    calls = []
    stream = cloner("Nice to meet you.", "en", reference(), opts, on_progress=lambda d, t: calls.append(d))
    next(stream)
    stream.close()
    assert calls == []  # the sentence was never finished
    with pytest.raises(StopIteration):
        next(stream)
    full = list(cloner("Nice to meet you.", "en", reference(), opts))
    assert full[-1].is_last


def test_batch_is_voiced_in_one_decode_and_cut_at_token_boundaries():
    """Official TTS.run at speed 1: the batch's tokens and phones are concatenated, decoded once, and the
    waveform is cut back at len_i * 2 * prod(upsample_rates) samples."""
    from engine.options import resolve_plan
    from engine.cloner import _Sentence

    cloner = VoiceCloner(sup.studio("v2").cloner().models, ReferenceCache())
    m = cloner.models
    ref = cloner.prepare(reference())
    g = torch.Generator().manual_seed(0)
    items = [_Sentence(i, tuple(torch.randint(1, 300, (n,), generator=g).tolist()), torch.zeros(1, n), "x")
             for i, n in enumerate((7, 12))]
    outs = [T2SOutput(tokens=torch.randint(0, 1024, (n,), generator=g), steps=n, stop="eos",
                      sequence=torch.zeros(0)) for n in (9, 5)]
    opts = SynthesisOptions()
    pieces = cloner._acoustic(items, outs, ref, opts, resolve_plan(opts, m.version), torch.Generator().manual_seed(3))
    whole = m.sovits.decode(torch.cat([o.tokens for o in outs]).view(1, 1, -1),
                            torch.tensor(items[0].phones + items[1].phones).view(1, -1), list(ref.specs),
                            generator=torch.Generator().manual_seed(3))[0, 0]
    up = 2 * math.prod(m.sovits.dims.upsample_rates)
    assert [p.shape[0] for p in pieces] == [9 * up, 5 * up]
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=0, atol=0)


@pytest.mark.parametrize("version", ["v2", "v2ProPlus"])
@pytest.mark.parametrize("buckets", [False, True])
def test_a_batched_streaming_decode_gives_each_row_its_numbers_alone(version, buckets):
    """Rows of different lengths (codes, phones, crops) decoded in one padded batch, bucketed or not, give
    each row what decode_streaming gives it alone, up to float32 rounding: every stage is masked, the
    HiFi-GAN decoder included (unmasked, its padding leaks into a row's last samples)."""
    from engine.acoustic.streaming import decode_streaming, decode_streaming_batch

    models = sup.studio(version).cloner().models
    sovits = models.sovits
    ref = VoiceCloner(models, ReferenceCache()).prepare(reference())
    sv = list(ref.sv) if ref.sv is not None else None
    ge = sovits.style_vector(list(ref.specs), sv)
    # tokens, phones, result_length (more than the tokens: the whole sentence, as y[..., -k:] takes), overlap
    shapes = [(14, 9, None, None), (23, 17, 6, 4), (9, 5, 3, 2), (5, 7, 12, 4)]
    rows, want = [], []
    for i, (n, p, keep, ov) in enumerate(shapes):
        codes = torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(10 + i))
        phones = torch.randint(1, 300, (p,), generator=torch.Generator().manual_seed(20 + i))
        overlap = None if ov is None else torch.randn(1, sovits.dims.hidden_channels, ov,
                                                      generator=torch.Generator().manual_seed(30 + i))
        audio, latent = decode_streaming(sovits, codes.view(1, 1, -1), phones.view(1, -1), list(ref.specs), sv,
                                         result_length=keep, overlap_frames=overlap,
                                         generator=torch.Generator().manual_seed(40 + i))
        want.append((audio[0, 0], latent))
        rows.append({"codes": codes, "text": phones, "ge": ge, "result_length": keep, "overlap_frames": overlap,
                     "generator": torch.Generator().manual_seed(40 + i)})
    got = decode_streaming_batch(sovits, rows, buckets=buckets)
    assert len(got) == len(rows)
    for (audio, latent), (want_audio, want_latent) in zip(got, want):
        assert audio.shape == want_audio.shape
        torch.testing.assert_close(latent, want_latent, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(audio, want_audio, rtol=1e-5, atol=1e-5)


def test_shape_buckets_bound_the_padding():
    from engine.acoustic.streaming import BATCH_BUCKETS, batch_bucket, width_bucket

    for n in range(1, 3000):
        b = width_bucket(n)
        assert b >= n and (b <= 64 or b <= 1.25 * n), n
        assert b % 16 == 0
    assert len({width_bucket(n) for n in range(1, 1025)}) <= 4 + 4 * 4  # 16..64, then four per octave
    assert [batch_bucket(n) for n in (1, 5, 7, 100, 128, 200)] == [1, 8, 8, 128, 128, 200]
    assert all(b2 <= 2 * b1 for b1, b2 in zip(BATCH_BUCKETS, BATCH_BUCKETS[1:]))


def test_a_round_splits_into_sub_batches_of_similar_width():
    """One long row (a sentence's last chunk, a whole sentence) must not pad every short chunk to its width."""
    from engine.acoustic.streaming import batch_split, width_bucket, width_groups

    def cost(groups, widths):
        return sum(batch_split(len(g), width_bucket(max(widths[i] for i in g)))[0] for g in groups)

    rng = np.random.default_rng(0)
    for widths in ([40] * 30 + [400], [48] * 3, [200], list(rng.integers(30, 450, 57)), [40, 41, 60, 90, 130, 200]):
        widths = [int(w) for w in widths]
        groups = width_groups(widths)
        assert sorted(i for g in groups for i in g) == list(range(len(widths)))  # every row once
        for a, b in zip(groups, groups[1:]):  # runs of widths: every row of a group is narrower than the next's
            assert max(width_bucket(widths[i]) for i in a) < min(width_bucket(widths[i]) for i in b)
        assert cost(groups, widths) <= cost([list(range(len(widths)))], widths)  # never worse than one batch
    assert len(width_groups([40] * 30 + [400])) == 2  # the long one alone
    assert len(width_groups([48, 40, 33])) == 1  # one bucket: one batch
    assert width_groups([]) == []


def test_a_batch_is_split_rather_than_padded_with_many_dummy_rows():
    from engine.acoustic.streaming import BATCH_BUCKETS, GROUP_OVERHEAD_FRAMES, batch_bucket, batch_split

    cost, sizes = batch_split(37, 128)
    assert sum(sizes) == 37 and sum(batch_bucket(k) for k in sizes) < 48  # not one batch of 48 (11 dummies)
    assert cost < batch_bucket(37) * 128 + GROUP_OVERHEAD_FRAMES
    for rows in range(1, 130):
        for width in (16, 64, 256, 1024, 4096):
            cost, sizes = batch_split(rows, width)
            assert sum(sizes) == rows and all(k >= 1 for k in sizes)
            assert cost <= batch_bucket(rows) * width + GROUP_OVERHEAD_FRAMES or batch_bucket(rows) * width > 128 * 256
            assert all(k == 1 or batch_bucket(k) * width <= 128 * 256 for k in sizes)  # memory bound
            assert sum(k not in BATCH_BUCKETS for k in sizes) <= 1  # dummy rows pad one sub-batch at most
    assert batch_split(64, 64)[1] == (64,)  # a bucket size stays one batch


def test_a_round_of_long_rows_is_split_to_bound_memory():
    from engine.acoustic import streaming

    widths = [3000] * 40 + [60] * 7  # 40 whole sentences of 1,500 tokens beside short chunks
    batches = streaming.voice_batches(widths, buckets=True)
    assert sorted(i for rows, _ in batches for i in rows) == list(range(len(widths)))  # every row once
    assert all(streaming.batch_bucket(len(rows)) * w <= streaming.MAX_BATCH_FRAMES or len(rows) == 1
               for rows, w in batches)
    assert all(w >= max(widths[i] for i in rows) for rows, w in batches)
    assert len(batches) > 2
    assert streaming.voice_batches(widths, buckets=False) == [(list(range(len(widths))), 3000)]


@pytest.mark.parametrize("version", ["v2", "v2ProPlus"])
def test_references_prepared_together_share_batches_and_get_their_features_alone(version):
    """What Studio gives its cloners on CUDA, on the CPU: concurrent references' clips meet in one HuBERT
    batch and one speaker-model batch (engine.batching.GroupRunner), and each gets its prompt tokens and
    speaker embedding alone (up to rounding)."""
    from engine.acoustic.hubert import ssl_features_groups
    from engine.batching import GroupRunner
    from engine.cloner import ReferenceBatches
    from engine.reference import sv_embedding_groups

    models = sup.studio(version).cloner().models
    clips = [reference(pitch=110.0 + 35 * i, seed=i) for i in range(3)]
    alone = [VoiceCloner(models, ReferenceCache()).prepare(c) for c in clips]
    started, release, sizes = threading.Barrier(3), threading.Event(), []

    def held(items):  # the first batch waits until every clip is in a batch or queued behind it
        sizes.append(len(items))
        release.wait(30)
        return ssl_features_groups(items)

    ssl, sv = GroupRunner(held, max_batch=8), GroupRunner(sv_embedding_groups, max_batch=8)
    cloner = VoiceCloner(models, ReferenceCache(), batches=ReferenceBatches(ssl, sv))
    together: list = [None] * 3

    def prepare(i: int) -> None:
        started.wait(30)
        together[i] = cloner.prepare(clips[i])

    threads = [threading.Thread(target=prepare, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    while sum(sizes) + len(ssl._queue) < 3 and any(t.is_alive() for t in threads):
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join()
    assert ssl.items == 3 and max(sizes) >= 2  # clips of different requests shared a batch
    assert sv.items == (3 if models.sv is not None else 0)
    for a, b in zip(alone, together):
        assert torch.equal(a.prompt_semantic, b.prompt_semantic)
        assert all(torch.equal(x, y) for x, y in zip(a.specs, b.specs))
        if a.sv is not None:
            torch.testing.assert_close(b.sv[0], a.sv[0], rtol=1e-5, atol=1e-5)
