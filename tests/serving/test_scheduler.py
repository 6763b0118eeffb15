"""The continuous-batching scheduler on the CPU (tiny random v2 weights, float32): a request's tokens and
audio do not depend on who shares the batch, a closed request frees its slot within a step, admission
is bounded, rows join and leave mid-decode, and sampling parameters apply per row."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest
import torch

import tests.support.synth as sup
from engine.errors import BusyError
from engine.options import EngineSettings, SynthesisOptions
from engine.cloner import VoiceCloner
from engine.reference import Reference
from engine.results import join
from engine.studio import Studio
from engine.reference_cache import ReferenceCache
from engine.serving.sampling import RowParams, race_noise, sample_rows
from engine.t2s.decoding import SamplingParams, filter_logits, penalize_repeats

TEXTS = ["The quick brown fox jumps over the lazy dog. It was a bright cold day.",
         "Hello there, how are you today?", "One two three four five six seven."]


def _reference() -> Reference:
    return Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")


def _studio(**settings) -> Studio:
    shared = sup.studio("v2")
    return Studio(shared.default_weights, shared.runtime, EngineSettings(**settings), pool=shared.pool)


def _run(studio: Studio, text: str, seed: int, stream: bool, **options):
    opts = SynthesisOptions(**{"streaming_mode": stream, "seed": seed, "text_split_method": "cut5", "early_stop_num": 80,
                               **options})
    results = list(studio.synthesize(text, "en", _reference(), opts))
    return [r.tokens for r in results], join(results)[1], results


def _until(condition, seconds: float) -> None:
    """Wait until ``condition()`` holds, at most ``seconds`` (the assertions after it say what was expected)."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        threading.Event().wait(0.01)


def _concurrently(work, n: int) -> list:
    """``[work(0), ..., work(n - 1)]``, each called on a thread of its own, all at once."""
    out: list = [None] * n

    def call(i: int) -> None:
        out[i] = work(i)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("stream", [True, False])
def test_a_request_is_the_same_alone_and_beside_others(stream) -> None:
    studio = _studio(scheduler_slots=4)
    try:
        alone = [_run(studio, t, 7 + i, stream, top_k=20, temperature=0.8 + 0.1 * i) for i, t in enumerate(TEXTS)]
        together = _concurrently(
            lambda i: _run(studio, TEXTS[i], 7 + i, stream, top_k=20, temperature=0.8 + 0.1 * i), len(TEXTS))
        for (tokens_a, audio_a, results), (tokens_b, audio_b, _) in zip(alone, together):
            assert tokens_a == tokens_b
            assert np.array_equal(audio_a, audio_b)
            assert results[-1].is_last and not any(r.is_last for r in results[:-1])
            assert [r.index for r in results] == list(range(len(results)))
    finally:
        studio.close()


@pytest.mark.parametrize("pipelined", [False, True])
def test_streams_voiced_in_bucketed_batches_get_their_audio_alone(monkeypatch, pipelined) -> None:
    """What the scheduler does on CUDA (the chunks of every stream voiced in one padded batch of bucketed
    shapes, a lone chunk too), forced on the CPU: each stream's audio is what it gets alone (chunk by chunk),
    up to float32 rounding. ``pipelined``: a round is queued before the previous round's audio is delivered
    (the SOLA lags cut on the host), as on CUDA: the pieces keep their order and numbers."""
    import engine.acoustic.streaming as streaming

    batches: list[tuple[int, bool]] = []
    decode = streaming.decode_streaming_batch

    def spy(sovits, rows, *args, **kwargs):
        batches.append((len(rows), kwargs.get("buckets", False)))
        return decode(sovits, rows, *args, **kwargs)

    studio = _studio(scheduler_slots=4)
    try:
        alone = [_run(studio, t, 7 + i, True, top_k=20) for i, t in enumerate(TEXTS)]
        assert not batches  # the CPU voices chunk by chunk
        monkeypatch.setattr(streaming, "decode_streaming_batch", spy)
        sched = studio.scheduler(studio.cloner().models)
        sched.batch_acoustic, sched.pipeline_rounds = True, pipelined
        together = _concurrently(lambda i: _run(studio, TEXTS[i], 7 + i, True, top_k=20), len(TEXTS))
        assert (sched.acoustic_overlapped > 0) == pipelined  # rounds were queued behind unfinished ones
        assert batches and all(bucketed for _, bucketed in batches)
        assert max(n for n, _ in batches) > 1  # streams shared a decode
        for (tokens_a, audio_a, _), (tokens_b, audio_b, _) in zip(alone, together):
            assert tokens_a == tokens_b
            assert audio_a.shape == audio_b.shape
            np.testing.assert_allclose(audio_b.astype(np.float64), audio_a.astype(np.float64), rtol=0, atol=2e-5)
    finally:
        studio.close()


def test_streams_voiced_through_acoustic_graphs_get_their_audio_alone() -> None:
    """On CUDA the bucketed acoustic batches replay CUDA graphs of the shapes met, captured by the acoustic thread
    under the device gate between rounds. With graph semantics on the CPU (tests/acoustic/test_graphs.py), each
    stream's audio is what it gets alone, and the captures went through the gate."""
    from engine.acoustic.streaming import AcousticGraphs
    from tests.acoustic.test_graphs import fake_capture

    studio = _studio(scheduler_slots=4)
    try:
        alone = [_run(studio, t, 7 + i, True, top_k=20) for i, t in enumerate(TEXTS)]
        sched = studio.scheduler(studio.cloner().models)
        sched.batch_acoustic = sched.pipeline_rounds = True
        graphs = sched.acoustic_graphs = AcousticGraphs(sched.models.sovits, capture=fake_capture, devices=("cpu",))
        gate_before = sched.gate.captures
        for _ in range(2):  # the second time, shapes met the first time replay
            together = _concurrently(lambda i: _run(studio, TEXTS[i], 7 + i, True, top_k=20), len(TEXTS))
            for (tokens_a, audio_a, _), (tokens_b, audio_b, _) in zip(alone, together):
                assert tokens_a == tokens_b
                assert audio_a.shape == audio_b.shape
                np.testing.assert_allclose(audio_b.astype(np.float64), audio_a.astype(np.float64), rtol=0, atol=2e-5)
        assert graphs.captures > 0 and graphs.voices.replays > 0
        assert sched.gate.captures > gate_before  # every capture had the device to itself
        events = studio.serving_events()
        assert sum(v for k, v in events.items() if k.startswith("acoustic_graphs_captured")) == graphs.captures
    finally:
        studio.close()


def test_whole_sentences_voiced_in_batches_get_their_audio_alone(monkeypatch) -> None:
    """On CUDA whole sentences join the round's batched decodes (sub-batches of similar width); forced on the
    CPU, each whole file is what it is alone (the official decode of each sentence), up to float32 rounding."""
    import engine.acoustic.streaming as streaming

    batches: list[int] = []
    decode = streaming.decode_streaming_batch

    def spy(sovits, rows, *args, **kwargs):
        batches.append(sum(r["result_length"] is None and r["overlap_frames"] is None for r in rows))
        return decode(sovits, rows, *args, **kwargs)

    studio = _studio(scheduler_slots=4)
    try:
        alone = [_run(studio, t, 7 + i, False, top_k=20) for i, t in enumerate(TEXTS)]
        monkeypatch.setattr(streaming, "decode_streaming_batch", spy)
        studio.scheduler(studio.cloner().models).batch_acoustic = True
        together = _concurrently(lambda i: _run(studio, TEXTS[i], 7 + i, False, top_k=20), len(TEXTS))
        assert batches and max(batches) > 1  # sentences shared a decode
        for (tokens_a, audio_a, _), (tokens_b, audio_b, _) in zip(alone, together):
            assert tokens_a == tokens_b
            assert audio_a.shape == audio_b.shape
            np.testing.assert_allclose(audio_b.astype(np.float64), audio_a.astype(np.float64), rtol=0, atol=2e-5)
    finally:
        studio.close()


def test_greedy_tokens_match_the_reference_decoder() -> None:
    """top_k=1 leaves no randomness: the slot decoder must give the official naive loop's tokens."""
    studio = _studio(scheduler_slots=2)
    try:
        opts = SynthesisOptions(top_k=1, parallel_infer=False, text_split_method="cut5", early_stop_num=60, seed=3)
        served = list(studio.synthesize(TEXTS[0], "en", _reference(), opts))
        official = VoiceCloner(studio.cloner().models, ReferenceCache())
        reference = list(official(TEXTS[0], "en", _reference(), opts))
        assert [r.tokens for r in served] == [r.tokens for r in reference]
        assert len(served) == len(reference) >= 2
    finally:
        studio.close()


def test_closing_the_results_frees_the_slot_within_one_step() -> None:
    studio = _studio(scheduler_slots=2)
    try:
        sched = studio.scheduler(studio.cloner().models)
        opts = SynthesisOptions(streaming_mode=True, seed=1, early_stop_num=1000, min_chunk_length=4)
        results = studio.synthesize(" ".join(TEXTS * 3), "en", _reference(), opts)
        next(results)
        assert sched.load["decoding"] == 1
        steps = sched.steps
        results.close()
        _until(lambda: sched.load["decoding"] == 0 and sched.load["requests"] == 0, seconds=2)
        assert sched.load == {"slots": 2, "decoding": 0, "waiting": 0, "queued": 0, "requests": 0}
        assert sched.steps - steps <= 1
    finally:
        studio.close()


def test_admission_waits_in_a_bounded_queue_then_refuses() -> None:
    studio = _studio(scheduler_slots=1, scheduler_queue=1)
    try:
        sched = studio.scheduler(studio.cloner().models)
        opts = SynthesisOptions(seed=1, early_stop_num=20)
        with sched._cv:  # hold the decode loop still: nothing leaves while we fill the pool and the queue
            first = studio.synthesize(TEXTS[1], "en", _reference(), opts)
            second = studio.synthesize(TEXTS[2], "en", _reference(), opts)
            with pytest.raises(BusyError, match="busy") as busy:
                studio.synthesize(TEXTS[0], "en", _reference(), opts)
            assert busy.value.retry_after > 0
        assert join(first)[1].size and join(second)[1].size  # the admitted ones complete
        assert join(studio.synthesize(TEXTS[1], "en", _reference(), opts))[1].size  # and there is room again
    finally:
        studio.close()


def test_drain_fails_the_queued_requests_and_lets_the_decoding_ones_finish() -> None:
    studio = _studio(scheduler_slots=1)
    try:
        sched = studio.scheduler(studio.cloner().models)
        opts = SynthesisOptions(streaming_mode=True, seed=1, early_stop_num=40, min_chunk_length=4)
        running = studio.synthesize(TEXTS[1], "en", _reference(), opts)
        got = [next(running)]  # it holds the one slot
        with sched._cv:  # hold the decode loop still: the second request cannot take the slot meanwhile
            queued = studio.synthesize(TEXTS[2], "en", _reference(), opts)
            assert sched.load["queued"] == 1 and studio.load()["queued"] == 1
            assert studio.drain("shutting down here") == 1
        got += list(running)
        assert got[-1].is_last and join(got)[1].size
        with pytest.raises(BusyError, match="shutting down here"):
            next(queued)
        assert studio.load()["queued"] == 0
        assert join(studio.synthesize(TEXTS[0], "en", _reference(), opts))[1].size  # the studio itself goes on
    finally:
        studio.close()


def test_requests_join_and_leave_mid_decode() -> None:
    studio = _studio(scheduler_slots=3)
    try:
        alone_long = _run(studio, TEXTS[0], 5, True)
        alone_short = _run(studio, TEXTS[1], 6, True)
        opts = SynthesisOptions(streaming_mode=True, seed=5, text_split_method="cut5", early_stop_num=80)
        long_iter = studio.synthesize(TEXTS[0], "en", _reference(), opts)
        got = [next(long_iter)]  # the long request is decoding; the short one joins now and leaves first
        short = _run(studio, TEXTS[1], 6, True)
        got += list(long_iter)
        assert [r.tokens for r in got] == alone_long[0] and np.array_equal(join(got)[1], alone_long[1])
        assert short[0] == alone_short[0] and np.array_equal(short[1], alone_short[1])
    finally:
        studio.close()


def test_sampling_parameters_apply_per_row() -> None:
    torch.manual_seed(0)
    vocab, rows = 40, 5
    logits = torch.randn(rows, vocab) * 3
    seen = torch.rand(rows, vocab) < 0.2
    settings = [SamplingParams(top_k=k, top_p=p, temperature=t, repetition_penalty=r)
                for k, p, t, r in [(1, 1.0, 1.0, 1.0), (5, 1.0, 0.7, 1.35), (15, 0.8, 1.0, 1.35),
                                   (40, 0.5, 2.0, 2.0), (3, 0.9, 0.0, 1.0)]]
    params = RowParams(
        top_k=torch.tensor([s.top_k for s in settings]), top_p=torch.tensor([s.top_p for s in settings]),
        temperature=torch.tensor([s.temperature for s in settings]),
        penalty=torch.tensor([s.repetition_penalty for s in settings]),
        min_steps=torch.tensor([0, 0, 0, 100, 0]), key=torch.tensor([11, 12, 13, 14, 15]))
    steps = torch.tensor([3, 3, 4, 5, 6])
    tokens, _ = sample_rows(logits, seen, steps, params)
    noise = race_noise(params.key, steps, vocab)
    for r, s in enumerate(settings):  # the oracle: the reference decoder's filters, row by row
        row = logits[r : r + 1]
        if r == 3:  # EOS banned before min_steps
            row = row.clone()
            row[:, -1] = float("-inf")
        history = seen[r].nonzero().view(1, -1)
        probs = torch.softmax(filter_logits(penalize_repeats(row, history, s.repetition_penalty), s), dim=-1)
        assert int(tokens[r]) == int(torch.argmax(probs[0] / noise[r]))
        alone, _ = sample_rows(logits[r : r + 1], seen[r : r + 1], steps[r : r + 1], params.rows(5).select(r))
        assert int(alone[0]) == int(tokens[r])  # the same alone as in the batch
    assert int(tokens[0]) == int(torch.argmax(torch.where(seen[0], logits[0], logits[0])))  # top_k 1: greedy


def test_noise_depends_only_on_key_and_step() -> None:
    a = race_noise(torch.tensor([5, 6]), torch.tensor([0, 9]), 64)
    b = race_noise(torch.tensor([6, 7, 5]), torch.tensor([9, 1, 0]), 64)
    assert torch.equal(a[0], b[2]) and torch.equal(a[1], b[0])
    assert not torch.equal(a[0], race_noise(torch.tensor([5]), torch.tensor([1]), 64)[0])
    u = torch.exp(-race_noise(torch.arange(200), torch.zeros(200, dtype=torch.long), 1025))
    assert 0.45 < float(u.mean()) < 0.55 and float(u.min()) > 0 and float(u.max()) < 1  # uniform in (0, 1)


def test_a_sentence_too_long_for_a_slot_fails_alone() -> None:
    studio = _studio(scheduler_slots=2, scheduler_context=64)
    try:
        with pytest.raises(Exception, match="scheduler_context"):
            _run(studio, TEXTS[0], 1, True)  # the prompt alone needs more than 64 positions
        sched = studio.scheduler(studio.cloner().models)
        assert sched.load["requests"] == 0 and sched.load["decoding"] == 0
    finally:
        studio.close()


WHOLE_TEXT = "One two three. Four five six. Seven eight nine. Ten eleven twelve. Red green blue. Up and down."


def test_a_whole_file_decodes_its_sentences_side_by_side() -> None:
    """A whole file's sentences take slots at once (official parallel_infer), at most half the slots per request:
    fewer decode steps than one after another, and the same tokens and audio, in text order."""
    studio = _studio(scheduler_slots=4)
    try:
        sched = studio.scheduler(studio.cloner().models)
        widths: list[int] = []
        step = sched._decode_step

        def spy() -> None:
            widths.append(sched._n)
            step()

        sched._decode_step = spy
        runs = {}
        for parallel in (False, True):
            before, widths[:] = sched.steps, []
            tokens, audio, results = _run(studio, WHOLE_TEXT, 11, False, parallel_infer=parallel, early_stop_num=25)
            runs[parallel] = (tokens, audio, results, sched.steps - before, max(widths))
        (tok_seq, audio_seq, res_seq, steps_seq, width_seq), (tok_par, audio_par, res_par, steps_par, width_par) = (
            runs[False], runs[True])
        assert len(res_par) == len(res_seq) >= 6
        assert tok_par == tok_seq and np.array_equal(audio_par, audio_seq)
        assert [r.sentence for r in res_par] == [r.sentence for r in res_seq]  # text order
        assert res_par[-1].is_last and not any(r.is_last for r in res_par[:-1])
        assert width_seq == 1 and width_par == 2  # side by side, capped at half the slots
        assert steps_par < 0.7 * steps_seq
        assert sched.load["requests"] == 0 and sched.load["decoding"] == 0
    finally:
        studio.close()


def test_cancelling_a_whole_file_frees_every_slot_of_its_sentences() -> None:
    studio = _studio(scheduler_slots=4)
    try:
        sched = studio.scheduler(studio.cloner().models)
        opts = SynthesisOptions(seed=1, early_stop_num=1000, text_split_method="cut5")
        studio.synthesize(WHOLE_TEXT, "en", _reference(), opts)  # submitted now (its results are never read)
        _until(lambda: sched.load["decoding"] == 2, seconds=10)
        assert sched.load["decoding"] == 2  # two sentences side by side
        (request,) = sched._active
        steps = sched.steps
        request.cancel()  # what closing its results does (the HTTP layer, when a client goes away)
        _until(lambda: sched.load["decoding"] == 0 and sched.load["requests"] == 0, seconds=2)
        assert sched.load == {"slots": 4, "decoding": 0, "waiting": 0, "queued": 0, "requests": 0}
        assert sched.steps - steps <= 2
        assert join(studio.synthesize(TEXTS[1], "en", _reference(), opts.replace(early_stop_num=20)))[1].size
    finally:
        studio.close()


def test_arrivals_wait_a_little_to_share_a_prefill_and_keep_their_numbers() -> None:
    """``prefill_wait_s`` (on by default on CUDA, forced here on the CPU): while rows decode, sentences that arrive
    may wait for others to share one prefill; each request's tokens and audio stay what it gets alone."""
    studio = _studio(scheduler_slots=4)
    try:
        alone = [_run(studio, t, 7 + i, True, top_k=20) for i, t in enumerate(TEXTS)]
        sched = studio.scheduler(studio.cloner().models)
        assert sched.prefill_wait_s == 0.0  # the CPU prefills row by row: nothing to share
        sched.prefill_wait_s = 1.0
        together = _concurrently(lambda i: _run(studio, TEXTS[i], 7 + i, True, top_k=20), len(TEXTS))
        for (tokens_a, audio_a, _), (tokens_b, audio_b, _) in zip(alone, together):
            assert tokens_a == tokens_b
            assert np.array_equal(audio_a, audio_b)
    finally:
        studio.close()


def test_arrivals_are_held_back_only_while_rows_decode_and_only_so_long() -> None:
    """The decode loop's choice of what to prefill: at once when no row decodes or PREFILL_BATCH sentences wait;
    else only once the first of them has waited ``prefill_wait_s``."""
    from types import SimpleNamespace

    from engine.serving.scheduler import PREFILL_BATCH, Scheduler

    ref = SimpleNamespace(prompt_phones=[1, 2], prompt_semantic=None)
    request = SimpleNamespace(cancelled=False, finished=False, context=SimpleNamespace(ref=ref))
    sched = Scheduler.__new__(Scheduler)  # the fields _take_arrivals reads, without models
    sched.slots, sched._n, sched.prefill_wait_s, sched._capture_wanted = 64, 3, 0.2, False
    sched._arrivals, sched._arrivals_since = deque(), None

    def arrive(n: int) -> None:
        sched._arrivals.extend((request, SimpleNamespace(phones=[5] * 10)) for _ in range(n))

    arrive(2)
    assert sched._take_arrivals() == []  # rows decode: these wait for company
    time.sleep(0.25)
    assert len(sched._take_arrivals()) == 2  # waited long enough
    assert sched._arrivals_since is None
    arrive(1)
    assert sched._take_arrivals() == []
    arrive(PREFILL_BATCH - 1)
    assert len(sched._take_arrivals()) == PREFILL_BATCH  # enough of them: at once
    sched._n = 0
    arrive(1)
    assert len(sched._take_arrivals()) == 1  # nothing decodes: no reason to wait
