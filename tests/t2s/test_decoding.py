"""Sampling rules, decoder isolation and the T2S test-weights factory (random weights, no fixtures)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from engine.errors import OptionsError
from engine.loading.t2s import load_t2s
from engine.models.t2s import T2SDims, Text2SemanticModel
from engine.t2s.decoding import (
    SamplingParams,
    StopRules,
    T2SDecoder,
    T2SInput,
    filter_logits,
    penalize_repeats,
)
from engine.testweights.t2s import TINY_BERT_DIM, official_config, write_t2s
from tests.support.paths import conformance_root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Text2SemanticModel:
    path = write_t2s(tmp_path_factory.mktemp("t2s") / "tiny.ckpt", seed=3)
    return load_t2s(path)[0]


def _item(seed: int, n: int = 12) -> T2SInput:
    g = torch.Generator().manual_seed(seed)
    return T2SInput(torch.randint(1, 732, (n,), generator=g), torch.randn(TINY_BERT_DIM, n, generator=g))


def test_top_p_has_no_shift_and_top_k_keeps_ties() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    kept = filter_logits(logits, SamplingParams(top_k=3, top_p=0.7))
    assert torch.isfinite(kept).tolist() == [[True, False, False]]  # 0.5+0.3 crosses 0.7: dropped too
    ties = filter_logits(torch.tensor([[1.0, 2.0, 2.0, 0.5]]), SamplingParams(top_k=1, top_p=1.0))
    assert torch.isfinite(ties).tolist() == [[False, True, True, False]]


def test_repetition_penalty_once_per_distinct_id() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = penalize_repeats(logits, torch.tensor([[0, 0, 0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]
    assert logits.tolist() == [[2.0, -2.0, 1.0]]  # the caller's tensor is left alone


@pytest.mark.parametrize("bad", [dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5), dict(temperature=-1.0),
                                 dict(repetition_penalty=0.0), dict(top_k=2.5)])
def test_bad_sampling_params_name_the_option(bad: dict) -> None:
    with pytest.raises(OptionsError, match=next(iter(bad))):
        SamplingParams(**bad)


def test_input_shape_errors() -> None:
    with pytest.raises(OptionsError, match="agree"):
        T2SInput(torch.ones(3, dtype=torch.long), torch.zeros(1024, 4))
    with pytest.raises(OptionsError, match="at least one phone"):
        T2SInput(torch.ones(0, dtype=torch.long), torch.zeros(1024, 0))


def test_eos_is_banned_for_the_first_steps(tiny: Text2SemanticModel) -> None:
    # make EOS overwhelmingly likely: decoding must still run min_steps tokens
    class EosLover(Text2SemanticModel):
        def logits(self, h_last: torch.Tensor) -> torch.Tensor:
            out = super().logits(h_last)
            out[:, -1] += 1e4
            return out

    model = EosLover(tiny.dims)
    model.load_state_dict(tiny.state_dict())
    out = T2SDecoder(model).decode_naive(_item(0), torch.tensor([5, 6, 7]), SamplingParams(top_k=1),
                                         StopRules(min_steps=11))
    assert out.stop == "eos" and out.steps == 11 and len(out.tokens) == 11
    assert int(out.tokens.max()) < tiny.dims.eos


def test_batch_matches_one_by_one_greedy(tiny: Text2SemanticModel) -> None:
    """Left padding and the key mask must not change any row (float32, greedy, no early stop)."""
    items = [_item(1, 9), _item(2, 15), _item(3, 4)]
    prompt = torch.tensor([3, 9, 27, 81, 243])
    params, rules = SamplingParams(top_k=1, repetition_penalty=1.35), StopRules(early_stop_num=-1, max_steps=80)
    batched = T2SDecoder(tiny).decode_batch(items, prompt, params, rules)
    for item, b in zip(items, batched):
        single = T2SDecoder(tiny).decode_batch([item], prompt, params, rules)[0]
        assert torch.equal(b.tokens, single.tokens) and b.stop == single.stop
        if b.stop == "eos":  # on EOS the naive and batched loops agree exactly
            naive = T2SDecoder(tiny).decode_naive(item, prompt, params, rules)
            assert torch.equal(naive.tokens, b.tokens)


def test_seeded_sampling_is_reproducible_and_streaming_matches(tiny: Text2SemanticModel) -> None:
    item, prompt = _item(4), torch.tensor([1, 2, 3, 4])
    params, rules = SamplingParams(top_k=20, top_p=0.9, temperature=0.8), StopRules(max_steps=60)
    run = lambda seed: T2SDecoder(tiny, torch.Generator().manual_seed(seed)).decode_naive(item, prompt, params, rules)  # noqa: E731
    a, b, c = run(7), run(7), run(8)
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.sequence, c.sequence) or len(a.sequence) != len(c.sequence)
    streamed = list(T2SDecoder(tiny, torch.Generator().manual_seed(7)).naive_steps(item, prompt, params, rules))
    kept = a.sequence[len(prompt):].tolist()
    assert streamed == kept  # every kept token is streamed, in order


def test_reference_free_returns_everything(tiny: Text2SemanticModel) -> None:
    out = T2SDecoder(tiny).decode_naive(_item(5), None, SamplingParams(top_k=1), StopRules(max_steps=40))
    assert out.steps == 0 and torch.equal(out.tokens, out.sequence) and len(out.tokens) >= 1
    batch = T2SDecoder(tiny).decode_batch([_item(5)], None, SamplingParams(top_k=1), StopRules(max_steps=40))
    assert torch.equal(batch[0].tokens, out.tokens)


def test_decoders_never_mutate_the_shared_model_and_run_concurrently(tiny: Text2SemanticModel) -> None:
    before = {k: v.clone() for k, v in tiny.state_dict().items()}
    items = [_item(s) for s in range(4)]
    prompt = torch.tensor([10, 20, 30])
    params, rules = SamplingParams(top_k=1), StopRules(max_steps=50)
    sequential = [T2SDecoder(tiny).decode_naive(it, prompt, params, rules).tokens for it in items]
    results: list[torch.Tensor | None] = [None] * len(items)

    def work(i: int) -> None:
        results[i] = T2SDecoder(tiny).decode_naive(items[i], prompt, params, rules).tokens

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(a, b) for a, b in zip(sequential, results))
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())


@pytest.mark.parametrize("version, manifest", [("v1", "s1_gpt_v1.json"), ("v2", "s1_gpt_v2plus.json")])
def test_full_size_factory_dims_match_the_official_manifest(version: str, manifest: str) -> None:
    path = conformance_root() / "manifest" / manifest
    if not path.exists():
        pytest.skip(f"no manifest {path}")
    official = json.loads(path.read_text())
    with torch.device("meta"):
        model = Text2SemanticModel(T2SDims.from_config(official_config(version)["model"]))
    ours = {"model." + k: list(v.shape) for k, v in model.state_dict().items()}
    theirs = {k: official["state_dict"][k]["shape"] for k in official["keys_in_official_weight_file"]}
    assert ours == theirs
    assert sum(p.numel() for p in model.parameters()) == official["n_parameters"]


def test_tiny_factory_file_is_official_layout(tmp_path: Path) -> None:
    path = write_t2s(tmp_path / "g.ckpt", version="v1")
    obj = torch.load(path, weights_only=True)
    assert set(obj) == {"weight", "config", "info"}
    assert all(k.startswith("model.") and v.dtype == torch.float16 for k, v in obj["weight"].items())
    assert obj["config"]["model"]["phoneme_vocab_size"] == 512
    model, ckpt = load_t2s(path)
    assert ckpt.symbol_version == "v1" and ckpt.early_stop_num == 2700
