"""Each stage on the accelerator (CUDA or MPS) against the CPU in float32, on the conformance fixtures.

Skipped without an accelerator (set ``SOVITS_TEST_DEVICE=cuda:1`` or ``mps`` to choose one, ``none``
to skip). Per stage the same inputs run on the CPU in float32 (the reference) and on the device in
float32 and in float16; the error is measured the way the conformance tests measure theirs:

* T2S: first-step logits, max |Δ| (fixture tolerance 1e-5), plus the greedy tokens of 8 steps in fp32;
* SoVITS (v1/v2/v2Pro* ``decode``, the fixture's noise-free runs): audio max |Δ| (fixture 6e-6);
* CFM (v3/v4 ``synthesize_sequential`` with a shared noise): mel max |Δ| / peak (fixture 1e-5);
* vocoders (BigVGAN, the v4 HiFi-GAN): audio max |Δ| / peak (fixture 1e-4).

float32 must meet the fixture tolerances. float16 meets the documented ones in ``FP16_TOLERANCE``
(docs/apple-silicon.md records the measured values). With ``SOVITS_DEVICE_REPORT=path.json`` the
measured errors are written there.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import pytest
import torch

from tests.devices.accelerator import ACCELERATOR, record
from tests.support.paths import conformance_root, fixture_folders

pytestmark = pytest.mark.skipif(ACCELERATOR is None, reason="no accelerator (CUDA or a usable MPS) here")

FP32_TOLERANCE = {"t2s_logits": 1e-5, "sovits_audio": 6e-6, "cfm_mel": 1e-5, "vocoder_audio": 1e-4}
# float16 against CPU float32, of the peak: about 3-10x what an H200 gave (docs/apple-silicon.md §7 lists the
# measurements). The vocoders lose most in fp16 (BigVGAN 3.2%), which is why the auto policy keeps them fp32.
FP16_TOLERANCE = {"t2s_logits": 5e-3, "sovits_audio": 2e-2, "cfm_mel": 1e-2, "vocoder_audio": 1e-1}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _tolerance(metric: str, precision: str) -> float:
    return (FP32_TOLERANCE if precision == "fp32" else FP16_TOLERANCE)[metric]


def _folders(kind: str, marker: str) -> list:
    found = fixture_folders(kind, marker)
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no {kind} fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in found]


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    assert tuple(a.shape) == tuple(b.shape), f"shape {tuple(a.shape)} != {tuple(b.shape)}"
    return float((a.detach().double().cpu() - b.detach().double().cpu()).abs().max())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return _max_abs(a, b) / float(b.detach().double().abs().max().clamp_min(1e-12))


@pytest.fixture(autouse=True)
def _exact_float32():
    """cuDNN may use TF32 for float32 convolutions; the comparison wants real float32."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# ---- T2S ----------------------------------------------------------------------------------------


@lru_cache(maxsize=2)
def _t2s_fixture(folder: Path):
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    return next(folder.glob("*.ckpt")), inputs


def _t2s_logits(folder: Path, device: str, dtype: torch.dtype, steps: int):
    from engine.loading.t2s import load_t2s
    from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput

    ckpt, inputs = _t2s_fixture(folder)
    model, _ = load_t2s(ckpt, device, dtype)
    item = T2SInput(phones=torch.cat([inputs["prompt_phones"], inputs["target_phones_a"]]).to(device),
                    bert=torch.cat([inputs["prompt_bert"], inputs["target_bert_a"]], dim=1).to(device))
    logits: list[torch.Tensor] = []
    decoder = T2SDecoder(model, on_logits=lambda step, x: logits.append(x.float().cpu()))
    out = decoder.decode_naive(item, inputs["prompt_semantic"].to(device),
                               SamplingParams(top_k=1, repetition_penalty=1.0),
                               StopRules(early_stop_num=steps, min_steps=steps))
    return logits, out.tokens.cpu()


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("folder", _folders("t2s", "inputs.pt"))
def test_t2s_logits(folder: Path, precision: str) -> None:
    ref_logits, ref_tokens = _t2s_logits(folder, "cpu", torch.float32, 8)
    got_logits, got_tokens = _t2s_logits(folder, ACCELERATOR, DTYPES[precision], 8)
    err = _max_abs(got_logits[0], ref_logits[0])
    if precision == "fp16":  # half logits: compare against the logit range
        err /= float(ref_logits[0].abs().max())
    record("t2s_logits", precision, folder.name, err, _tolerance("t2s_logits", precision))
    assert err <= _tolerance("t2s_logits", precision)
    if precision == "fp32":
        assert torch.equal(got_tokens, ref_tokens), "greedy tokens differ between the device and the CPU"


# ---- SoVITS (v1/v2/v2Pro*) ----------------------------------------------------------------------


def _sovits_folders() -> list:
    found = [f for f in fixture_folders("", "expected_meta.json")
             if "decode_runs" in json.loads((f / "expected_meta.json").read_text()) and any(f.glob("*.pth"))]
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no SoVITS fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in found]


def _sovits_audio(folder: Path, device: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every noise-free decode run of the fixture (the noisy ones need the recorded noise of expected.pt and
    run the same networks); reference spectrograms computed on the CPU from the fixture's clips."""
    from engine.audio import linear_spectrogram
    from engine.loading.sovits import load_sovits

    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    meta = json.loads((folder / "expected_meta.json").read_text())
    args = meta["spectrogram_args"]
    specs = {f"ref{i}_spec": linear_spectrogram(inputs[f"ref{i}_wav"], args["n_fft"], args["hop_size"],
                                                args["win_size"]) for i in (0, 1) if f"ref{i}_wav" in inputs}
    model = load_sovits(next(folder.glob("*.pth")), device, dtype).module.to(device, dtype)
    out = {}
    with torch.no_grad():
        for name, run in meta["decode_runs"].items():
            if run["noise_scale"] != 0:
                continue
            refs = [specs[k].to(device, dtype) for k in run["refer_specs"]]
            sv = ([inputs[f"sv_emb{i}"].to(device, dtype) for i in range(len(refs))]
                  if model.dims.is_pro else None)
            audio = model.decode(inputs["decode_codes"].to(device), inputs["decode_phones"].to(device), refs,
                                 noise_scale=0.0, speed=run["speed"], sv_emb=sv)
            out[name] = audio.float().cpu()
    assert out, f"{folder}: no noise-free decode run"
    return out


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("folder", _sovits_folders())
def test_sovits_audio(folder: Path, precision: str) -> None:
    ref = _sovits_audio(folder, "cpu", torch.float32)
    got = _sovits_audio(folder, ACCELERATOR, DTYPES[precision])
    err = max(_max_abs(got[k], ref[k]) if precision == "fp32" else _rel(got[k], ref[k]) for k in ref)
    record("sovits_audio", precision, folder.name, err, _tolerance("sovits_audio", precision))
    assert err <= _tolerance("sovits_audio", precision)


# ---- v3/v4: CFM and vocoders ---------------------------------------------------------------------


def _seeded_noise(seed: int):
    """The same Gaussian noise on every device: drawn on the CPU, then moved."""
    gen = torch.Generator().manual_seed(seed)

    def draw(shape, dtype, device):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype)

    return draw


def _cfm_mel(folder: Path, version: str, device: str, dtype: torch.dtype) -> torch.Tensor:
    from engine.acoustic.cfm import prepare_prompt, synthesize_sequential
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.reference import reference_spectrogram

    inputs = torch.load(folder / "inputs.pt", weights_only=False)
    sovits = next(p for p in folder.glob("*.pth") if "vocoder" not in p.name)
    model = load_sovits_v3(sovits, version=version).to(device, dtype)
    spec = reference_spectrogram(inputs["ref_wav_32k"].float()).to(device, dtype)
    with torch.no_grad():
        prompt = prepare_prompt(model, inputs["prompt_semantic"].to(device), inputs["prompt_phones"].to(device), spec,
                                inputs["ref_wav_32k"], 32000)
        hop = 256 if version == "v3" else 480
        _, mel = synthesize_sequential(model, lambda m: m.new_zeros(1, 1, m.shape[-1] * hop), prompt,
                                       inputs["target_semantic_short"].to(device),
                                       inputs["target_phones_short"].to(device), 1.0, 8, noise=_seeded_noise(0))
    return mel.float().cpu()


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("version", ["v3", "v4"])
@pytest.mark.parametrize("folder", _folders("v3v4", "inputs.pt"))
def test_cfm_mel(folder: Path, version: str, precision: str) -> None:
    ref = _cfm_mel(folder, version, "cpu", torch.float32)
    got = _cfm_mel(folder, version, ACCELERATOR, DTYPES[precision])
    err = _rel(got, ref)
    record("cfm_mel", precision, f"{folder.name}-{version}", err, _tolerance("cfm_mel", precision))
    assert err <= _tolerance("cfm_mel", precision)


def _vocoders(folder: Path) -> list[tuple[str, object]]:
    from engine.loading.vocoder import load_bigvgan, load_v4_vocoder

    found = [(p.parent.name, lambda p=p: load_bigvgan(p.parent)) for p in sorted(folder.glob("*/bigvgan_generator.pt"))]
    found += [(p.stem, lambda p=p: load_v4_vocoder(p)) for p in sorted(folder.glob("v4_vocoder*.pth"))]
    return found


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("folder", _folders("v3v4", "inputs.pt"))
def test_vocoder_audio(folder: Path, precision: str) -> None:
    inputs = torch.load(folder / "inputs.pt", weights_only=False)
    mel = inputs["vocoder_mel"]
    vocoders = _vocoders(folder)
    assert vocoders, f"no vocoder in {folder}"
    errors = {}
    for name, load in vocoders:  # measure every vocoder before judging any
        with torch.inference_mode():
            ref = load()(mel)
            got = load().to(ACCELERATOR, DTYPES[precision])(mel.to(ACCELERATOR, DTYPES[precision])).float().cpu()
        errors[name] = _rel(got, ref)
        record("vocoder_audio", precision, name, errors[name], _tolerance("vocoder_audio", precision))
    assert max(errors.values()) <= _tolerance("vocoder_audio", precision), errors
