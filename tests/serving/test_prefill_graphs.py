"""Captured prefills (CUDA) pad their rows to a bucket: more rows, each left-padded to a rounder width, the spare
rows writing to a scratch row. The tokens, the cache's real positions and the masks must be those of the
exact-width prefill. On the CPU the graph is faked: its replay runs the same layers over the static inputs."""

from __future__ import annotations

import torch

import engine.serving.scheduler as scheduler_module
import tests.support.synth as sup
from engine.models.t2s import T2SDims
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.studio import Studio
from engine.serving.slots import PREFILL_GRAPH_POSITIONS, PREFILL_WIDTH_STEP, SlotDecoder, _PrefillGraph
from engine.t2s.decoding import SamplingParams, T2SInput
from engine.testweights.t2s import random_t2s_model

DIMS = T2SDims(embedding_dim=64, hidden_dim=64, n_head=4, n_layer=2, bert_dim=32)
SAMPLED = SamplingParams(top_k=5, temperature=0.9, repetition_penalty=1.35)


class _Replay:
    """A "graph" whose replay runs the layers over the decoder's static prefill inputs into fixed outputs."""

    def __init__(self, decoder: SlotDecoder, rows: int, width: int) -> None:
        self.decoder, self.rows, self.width, self.replays = decoder, rows, width, 0
        self.out: _PrefillGraph | None = None

    def replay(self) -> None:
        d, r, w = self.decoder, self.rows, self.width
        logits, key_ok = d._prefix_layers(d._pf_x[:r * w].view(r, w, -1), d._pf_ints[:3 * r + w])
        self.out.logits.copy_(logits)
        self.out.key_ok.copy_(key_ok)
        self.replays += 1


class FakePrefillGraphs(SlotDecoder):
    def __init__(self, model, slots: int, capacity: int) -> None:
        super().__init__(model, slots, capacity, use_graph=False, prefill_graphs=True)

    def _capture_prefill(self, rows: int, width: int) -> _PrefillGraph:
        replay = _Replay(self, rows, width)
        vocab = self.model.dims.vocab_size
        replay.out = _PrefillGraph(replay, torch.full((rows, vocab), float("nan")), torch.ones(rows, width, dtype=torch.bool))
        return replay.out


def _rows(seed: int, shapes=((12, 9), (30, 21), (7, 0))) -> tuple[list[T2SInput], list[torch.Tensor | None]]:
    g = torch.Generator().manual_seed(seed)
    items, prompts = [], []
    for phones, prompt in shapes:  # by default widths 21, 51, 7: one bucket of 4 rows x 64
        items.append(T2SInput(torch.randint(1, 100, (phones,), generator=g),
                              torch.randn(DIMS.bert_dim, phones, generator=g)))
        prompts.append(torch.randint(0, 1000, (prompt,), generator=g) if prompt else None)
    return items, prompts


def _run(pool: SlotDecoder, rows: list[int], seed: int, steps: int, shapes=((12, 9), (30, 21), (7, 0))
         ) -> list[list[int]]:
    items, prompts = _rows(seed, shapes)
    n = len(rows)
    tok, _ = pool.prefill(rows, items, prompts, [SAMPLED] * n, [10**9] * n, [11 + r for r in rows])
    out = [[int(t)] for t in tok]
    for _ in range(steps):
        pool.window = pool.capacity
        toks, _ = pool.step(max(rows) + 1)
        for i, r in enumerate(rows):
            out[i].append(int(toks[r]))
    return out


def test_a_prefill_bucket_rounds_rows_and_width_up_and_gives_way_to_eager_when_too_big() -> None:
    pool = FakePrefillGraphs(random_t2s_model(DIMS, seed=1), slots=32, capacity=1024)
    assert pool.prefill_bucket(3, 51) == (4, PREFILL_WIDTH_STEP)
    assert pool.prefill_bucket(1, 64) == (1, 64) and pool.prefill_bucket(1, 65) == (1, 128)
    assert pool.prefill_bucket(17, 10) is None  # more rows than the largest bucket
    assert pool.prefill_bucket(1, 1000) is None  # its width would not fit a slot
    assert pool.prefill_bucket(16, PREFILL_GRAPH_POSITIONS // 16 + 1) is None  # too many positions
    assert SlotDecoder(random_t2s_model(DIMS, seed=1), slots=4, capacity=256).prefill_bucket(1, 10) is None  # CPU


@torch.inference_mode()
def test_a_replayed_prefill_bucket_gives_the_tokens_cache_and_masks_of_the_exact_prefill() -> None:
    model = random_t2s_model(DIMS, seed=2)
    exact = SlotDecoder(model, slots=6, capacity=256)
    padded = FakePrefillGraphs(model, slots=6, capacity=256)
    for pool in (exact, padded):
        pool.valid[5, 0] = True  # a live row elsewhere: both rings stay where they are
    first = _run(padded, [0, 1, 2], seed=3, steps=0)  # no graph yet: eager at the exact width, bucket noted
    assert padded.prefill_missing == {(4, 64)}
    assert padded.capture_prefills(sorted(padded.prefill_missing)) == 1 and not padded.prefill_missing
    assert first == _run(exact, [0, 1, 2], seed=3, steps=0)

    got = _run(padded, [1, 2, 3], seed=4, steps=12)  # rows taken again and a new one, through the bucket
    want = _run(exact, [1, 2, 3], seed=4, steps=12)
    replay = padded._prefills[(4, 64)].graph
    assert replay.replays == 1
    assert got == want
    assert torch.equal(padded.valid[:6], exact.valid)
    real = exact.valid[:4].view(1, 4, 1, -1, 1).expand(DIMS.n_layer, 4, DIMS.n_head, -1, DIMS.head_dim)
    for cache in ("k", "v"):
        a, b = getattr(exact, cache)[:, :4], getattr(padded, cache)[:, :4]
        assert torch.allclose(a[real], b[real], atol=1e-5)
    assert exact.k.shape[1] == 6 and padded.k.shape[1] == 7  # the scratch row
    assert padded.k[:, 6].abs().sum() > 0  # written by the bucket's spare row, never by a real one
    for t in ("token", "audio_pos", "step_index", "seen"):
        assert torch.equal(getattr(padded, t)[:6], getattr(exact, t)), t


@torch.inference_mode()
def test_a_reference_free_bucket_and_one_of_a_single_row_give_the_exact_prefills_tokens() -> None:
    model = random_t2s_model(DIMS, seed=5)
    for shapes, rows in ((((9, 0), (20, 0)), [0, 1]), (((70, 0),), [2])):  # no prompt at all; 1 row x 128
        exact = SlotDecoder(model, slots=4, capacity=512)
        padded = FakePrefillGraphs(model, slots=4, capacity=512)
        for pool in (exact, padded):
            pool.valid[3, 0] = True
        _run(padded, rows, seed=6, steps=0, shapes=shapes)
        padded.capture_prefills(sorted(padded.prefill_missing))
        assert _run(padded, rows, seed=7, steps=8, shapes=shapes) == _run(exact, rows, seed=7, steps=8, shapes=shapes)
        assert sum(g.graph.replays for g in padded._prefills.values()) == 1


class _SchedulerPool(FakePrefillGraphs):
    """What the scheduler makes instead of a SlotDecoder: each capture notes whether it had the device alone."""

    gate = None  # set by the test: the engine's DeviceGate
    log: list = []

    def __init__(self, model, slots, capacity, use_graph=None, attention="auto", prefill_graphs=None) -> None:
        super().__init__(model, slots, capacity)

    def _capture_prefill(self, rows: int, width: int) -> _PrefillGraph:
        gate = type(self).gate
        type(self).log.append((rows, width, gate._capturing, gate._working))
        return super()._capture_prefill(rows, width)


def _tokens(studio: Studio) -> list:
    ref = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    options = SynthesisOptions(seed=3, text_split_method="cut5", early_stop_num=30)
    return [r.tokens for r in studio.synthesize("The quick brown fox jumps over the lazy dog. It ran away.", "en",
                                                ref, options)]


def test_the_scheduler_captures_a_prefill_bucket_alone_on_the_device_and_replays_it_to_the_same_tokens(
        monkeypatch) -> None:
    shared = sup.studio("v2")

    def studio() -> Studio:
        return Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler_slots=4), pool=shared.pool)

    plain = studio()
    try:
        expected = _tokens(plain)
    finally:
        plain.close()
    monkeypatch.setattr(scheduler_module, "SlotDecoder", _SchedulerPool)
    _SchedulerPool.log = []
    engine = studio()
    _SchedulerPool.gate = engine.gate
    try:
        assert _tokens(engine) == expected  # each bucket's first prefill eager, then captured
        log = list(_SchedulerPool.log)
        assert log and all(exclusive and working == 0 for *_, exclusive, working in log)
        decoder = engine.scheduler(engine.cloner().models).decoder
        assert not decoder.prefill_missing and len(decoder._prefills) == len(log)
        assert _tokens(engine) == expected  # now replayed
        assert sum(g.graph.replays for g in decoder._prefills.values()) >= 2
        assert _SchedulerPool.log == log  # nothing captured again
        assert engine.serving_events().get("prefill_graphs_captured_serving") == len(log)
    finally:
        engine.close()


def test_warm_up_captures_every_prefill_bucket_to_1024_positions_and_serving_then_captures_none(monkeypatch) -> None:
    from engine.serving.slots import PREFILL_ROWS, PREFILL_WARM_WIDTH

    shared = sup.studio("v2")
    monkeypatch.setattr(scheduler_module, "SlotDecoder", _SchedulerPool)
    _SchedulerPool.log = []
    engine = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler_slots=4), pool=shared.pool)
    _SchedulerPool.gate = engine.gate
    try:
        decoder = engine.scheduler(engine.cloner().models).decoder
        want = {(r, w) for r in PREFILL_ROWS for w in range(64, PREFILL_WARM_WIDTH + 1, 64) if r * w <= 8192}
        assert engine.capture_graphs() == len(want) == 72
        assert set(decoder._prefills) == want and decoder.uncaptured_prefills() == []
        assert all(exclusive and working == 0 for *_, exclusive, working in _SchedulerPool.log)
        assert _tokens(engine) and len(_SchedulerPool.log) == len(want)  # served without a capture
        assert sum(g.graph.replays for g in decoder._prefills.values()) >= 2
    finally:
        engine.close()
