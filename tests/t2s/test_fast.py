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
        for H, HD in ((4, 8), (3, 24), (2, 40), (5, 5)):  # head widths padded to a power of two and masked
            B, CAP = 2, 300; D = H * HD
            qkv = torch.randn(B, 3 * D); kc = torch.randn(B, H, CAP, HD); vc = torch.randn(B, H, CAP, HD)
            valid = torch.zeros(B, CAP, dtype=torch.bool); valid[0, :150] = True; valid[1, 10:150] = True
            pos = torch.tensor([149]); k2, v2 = kc.clone(), vc.clone()
            out = decode_attention(qkv, k2, v2, valid, pos)
            q, k, v = qkv.view(B, 3, H, HD).unbind(1)
            kc[:, :, 149] = k; vc[:, :, 149] = v
            ref = F.scaled_dot_product_attention(q.unsqueeze(2), kc, vc, attn_mask=valid[:, None, None, :])
            assert (out - ref.squeeze(2).reshape(B, D)).abs().max() < 1e-5, HD
            assert torch.equal(k2, kc) and torch.equal(v2, vc), HD
        D = 40
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


def test_attention_choice_per_model(caplog: pytest.LogCaptureFixture) -> None:
    from engine.t2s.kernels import choose_attention, triton_shape_problem

    assert triton_shape_problem(384, 16, 1536) is None  # head width 24: padded, not refused
    assert triton_shape_problem(576, 12, 2304) is None
    assert "head width 640" in triton_shape_problem(1280, 2, 5120)
    assert "input width 32768" in triton_shape_problem(8192, 64, 32768)  # the FFN input
    cpu = torch.device("cpu")
    assert choose_attention("sdpa", cpu, 1280, 2, 5120) == "sdpa"
    with pytest.raises(ValueError, match="head width 640"):
        choose_attention("triton", cpu, 1280, 2, 5120)
    with pytest.raises(ValueError, match="attention must be"):
        choose_attention("flash", cpu, 32, 2, 128)
    if HAS_TRITON:
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            with caplog.at_level("INFO", logger="engine.t2s.kernels"):
                assert choose_attention("auto", cpu, 1280, 2, 5120) == "sdpa"  # does not fit: stock path, logged
                assert choose_attention("auto", cpu, 384, 16, 1536) == "triton"
        finally:
            del os.environ["TRITON_INTERPRET"]
        assert [r.message for r in caplog.records].count(
            "T2S decode: stock PyTorch step instead of the Triton kernels (head width 640 pads to 1024 > 256)") == 1


# Non-power-of-two widths: (model width, heads) -> head width 24 and 40; FFN 4 x width; an odd vocabulary.
# Narrow models keep the interpreter fast; the masks do not depend on how many heads there are.
ODD_SHAPES = [(72, 3), (120, 3)]


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("width, heads", ODD_SHAPES, ids=[f"w{w}h{h}" for w, h in ODD_SHAPES])
def test_triton_decoder_odd_shapes_match_the_reference_loop(tmp_path: Path, width: int, heads: int) -> None:
    ckpt = write_t2s(tmp_path / "t.ckpt", seed=width,
                     shape={"hidden_dim": width, "head": heads, "n_layer": 1, "vocab_size": 771})
    code = textwrap.dedent(f"""
        import torch
        from engine.loading.t2s import load_t2s
        from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput
        from engine.t2s.fast import FastT2S
        model, _ = load_t2s({str(ckpt)!r})
        assert model.dims.head_dim == {width // heads} and next(model.parameters()).dtype == torch.float32
        g = torch.Generator().manual_seed(0)
        items = [T2SInput(torch.randint(1, 732, (n,), generator=g), torch.randn({TINY_BERT_DIM}, n, generator=g))
                 for n in (6, 9)]
        prompt = torch.randint(0, 770, (5,), generator=g)
        params, rules = SamplingParams(top_k=1, repetition_penalty=1.35), StopRules(max_steps=12)
        fast = FastT2S(model, attention="triton", sync_every=4)
        assert fast.attention == "triton"
        ref = T2SDecoder(model).decode_batch(items, prompt, params, rules)
        got = fast.decode_batch(items, prompt, params, rules)
        assert [(o.stop, o.steps) for o in got] == [(o.stop, o.steps) for o in ref]
        assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(got, ref)), [o.tokens for o in got]
        one = fast.decode_naive(items[0], prompt, params, rules)
        assert torch.equal(one.tokens, T2SDecoder(model).decode_naive(items[0], prompt, params, rules).tokens)
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
