"""The static-shape fast decoder computes the same function as the reference loops.

On the CPU the torch path runs directly; the Triton kernels run under TRITON_INTERPRET=1 in a
subprocess (the interpreter must be chosen before triton is imported).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.loading.t2s import load_t2s
from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
from engine.t2s.fast import FastT2S
from engine.testweights.t2s import TINY_BERT_DIM, write_t2s
from tests.support.paths import REPO, folder_params

FOLDERS = folder_params("t2s", "expected_meta.json")
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _fixture(folder: Path):
    model, _ = load_t2s(next(folder.glob("*.ckpt")))
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    expected = torch.load(folder / "expected.pt", weights_only=True)
    meta = json.loads((folder / "expected_meta.json").read_text())
    return model, inputs, expected, meta


def _item(inputs: dict, t: str) -> T2SInput:
    return T2SInput(torch.cat([inputs["prompt_phones"], inputs[f"target_phones_{t}"]]),
                    torch.cat([inputs["prompt_bert"], inputs[f"target_bert_{t}"]], dim=1))


@pytest.mark.parametrize("folder", FOLDERS)
def test_fast_decoder_matches_every_fixture_run(folder: Path) -> None:
    model, inputs, expected, meta = _fixture(folder)
    fast = FastT2S(model, sync_every=3, attention="sdpa")
    for name, run in meta["runs"].items():
        params = SamplingParams(top_k=run["top_k"], repetition_penalty=run["repetition_penalty"])
        rules = StopRules(early_stop_num=run["early_stop_num"])
        items = [_item(inputs, t) for t in "ab"[: run["n_items"]]]
        prompt = None if run["ref_free"] else inputs["prompt_semantic"]
        if run["function"] == "infer_panel_batch_infer":
            outs = fast.decode_batch(items, prompt, params, rules)
        else:
            outs = [fast.decode_naive(it, prompt, params, rules) for it in items]
        assert [o.steps for o in outs] == expected[name]["idx_list"].tolist(), name
        for o, gen, seq in zip(outs, expected[name]["generated"], expected[name]["y_list"]):
            assert torch.equal(o.tokens, gen.long()) and torch.equal(o.sequence, seq.long()), name


def test_fast_matches_reference_with_sampling_rules(tmp_path: Path) -> None:
    model, _ = load_t2s(write_t2s(tmp_path / "t.ckpt", seed=5))
    g = torch.Generator().manual_seed(0)
    items = [T2SInput(torch.randint(1, 732, (n,), generator=g), torch.randn(TINY_BERT_DIM, n, generator=g)) for n in (7, 12, 4)]
    prompt = torch.randint(0, 1024, (9,), generator=g)
    rules = StopRules(early_stop_num=40, max_steps=60)
    for params in (SamplingParams(top_k=1, repetition_penalty=1.35), SamplingParams(top_k=1, top_p=0.5),
                   SamplingParams(top_k=1, temperature=0.3, repetition_penalty=2.0)):
        ref = T2SDecoder(model).decode_batch(items, prompt, params, rules)
        got = FastT2S(model, attention="matmul", sync_every=5).decode_batch(items, prompt, params, rules)
        assert [(o.stop, o.steps) for o in got] == [(o.stop, o.steps) for o in ref]
        assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(got, ref))


def test_fast_graphs_are_bounded_and_shared(tmp_path: Path) -> None:
    model, _ = load_t2s(write_t2s(tmp_path / "t.ckpt", seed=6))
    fast = FastT2S(model, max_graphs=2)
    item = T2SInput(torch.arange(1, 6), torch.zeros(TINY_BERT_DIM, 5))
    for k in (1, 2, 3):
        fast.decode_naive(item, torch.tensor([1, 2]), SamplingParams(top_k=k), StopRules(max_steps=20))
    assert len(fast._graphs) == 2


def test_bad_attention_choice() -> None:
    with pytest.raises(ValueError, match="attention"):
        FastT2S(torch.nn.Linear(1, 1), attention="flash")  # type: ignore[arg-type]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_kernels_under_the_interpreter() -> None:
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F
        from engine.t2s.kernels.triton_step import decode_attention, add_layer_norm, gemv
        torch.manual_seed(0)
        B, H, CAP, HD = 2, 4, 300, 8; D = H * HD
        qkv = torch.randn(B, 3 * D); kc = torch.randn(B, H, CAP, HD); vc = torch.randn(B, H, CAP, HD)
        valid = torch.zeros(B, CAP, dtype=torch.bool); valid[0, :150] = True; valid[1, 10:150] = True
        pos = torch.tensor([149]); k2, v2 = kc.clone(), vc.clone()
        out = decode_attention(qkv, k2, v2, valid, pos)
        q, k, v = qkv.view(B, 3, H, HD).unbind(1)
        kc[:, :, 149] = k; vc[:, :, 149] = v
        ref = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, attn_mask=valid[:, None, None, :]).squeeze(2).reshape(B, D)
        assert (out - ref).abs().max() < 1e-5 and torch.equal(k2, kc) and torch.equal(v2, vc)
        ln = torch.nn.LayerNorm(D); ln.weight.data.normal_(); ln.bias.data.normal_()
        x, r = torch.randn(3, D), torch.randn(3, D)
        with torch.no_grad():
            assert (add_layer_norm(x, r, ln) - ln(x + r)).abs().max() < 1e-5
            W, bias = torch.randn(70, D), torch.randn(70)
            y, used = gemv(x, W, bias, relu=True, residual=r, norm=ln)
            assert (y - torch.relu(F.linear(ln(x + r), W, bias))).abs().max() < 1e-4
            assert (used - ln(x + r)).abs().max() < 1e-5
            W2, x2 = torch.randn(20, 1000), torch.randn(2, 1000)
            assert (gemv(x2, W2)[0] - x2 @ W2.t()).abs().max() < 1e-3
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("folder", FOLDERS)
def test_triton_decoder_matches_a_fixture_run(folder: Path) -> None:
    code = textwrap.dedent(f"""
        import json, torch
        from pathlib import Path
        from engine.loading.t2s import load_t2s
        from engine.t2s.decoding import SamplingParams, StopRules, T2SInput
        from engine.t2s.fast import FastT2S
        folder = Path({str(folder)!r})
        model, _ = load_t2s(next(folder.glob("*.ckpt")))
        inp = torch.load(folder / "inputs.pt", weights_only=True)
        exp = torch.load(folder / "expected.pt", weights_only=True)
        runs = json.loads((folder / "expected_meta.json").read_text())["runs"]
        name, run = next((k, r) for k, r in runs.items()
                         if r["function"] != "infer_panel_batch_infer" and r["n_items"] == 1 and not r["ref_free"])
        item = T2SInput(torch.cat([inp["prompt_phones"], inp["target_phones_a"]]),
                        torch.cat([inp["prompt_bert"], inp["target_bert_a"]], 1))
        out = FastT2S(model, attention="triton", sync_every=8).decode_naive(
            item, inp["prompt_semantic"], SamplingParams(top_k=1, repetition_penalty=run["repetition_penalty"]),
            StopRules(early_stop_num=run["early_stop_num"]))
        assert torch.equal(out.tokens, exp[name]["generated"][0].long()), out.tokens
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_streamed_tokens_match_the_reference_stream(tmp_path: Path) -> None:
    model, _ = load_t2s(write_t2s(tmp_path / "t.ckpt", seed=7))
    item = T2SInput(torch.arange(1, 9), torch.randn(TINY_BERT_DIM, 8, generator=torch.Generator().manual_seed(1)))
    prompt = torch.tensor([4, 8, 15, 16, 23, 42])
    for rules in (StopRules(max_steps=40), StopRules(early_stop_num=13)):
        ref_gen = T2SDecoder(model).naive_steps(item, prompt, SamplingParams(top_k=1), rules)
        fast_gen = FastT2S(model, sync_every=4).naive_steps(item, prompt, SamplingParams(top_k=1), rules)
        ref_tokens, fast_tokens = [], []
        ref_out = fast_out = None
        for gen, sink in ((ref_gen, ref_tokens), (fast_gen, fast_tokens)):
            while True:
                try:
                    sink.append(next(gen))
                except StopIteration as done:
                    if gen is ref_gen:
                        ref_out = done.value
                    else:
                        fast_out = done.value
                    break
        assert fast_tokens == ref_tokens and torch.equal(fast_out.tokens, ref_out.tokens)
