"""SoVITS v1/v2/v2Pro* against the official golden fixtures: every folder under the conformance root
whose ``expected_meta.json`` records ``decode_runs`` (sovits_v2, sovits_v2Pro, and any other set of
the same layout).

Tolerances (fixture README: float64 recomputation differs from float32 by at most ~2.5e-5 on the
spectrogram and ~1.5e-6 on decoded audio). A correct float32 implementation whose reductions run
in another order may differ from the official float32 result by about twice that floor, so we allow
4x: 1e-4 absolute on spectrogram magnitudes and 6e-6 on audio. Intermediates (prior statistics,
flow output, style vectors) have no published floor; they feed the audio linearly-ish at similar
magnitudes, so they get the audio bound scaled by their own magnitude (rtol 1e-5, atol 6e-6).
VQ codes must be identical (the smallest nearest/second-nearest distance gap is >= 0.07).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.audio import linear_spectrogram, read_audio
from engine.loading.checkpoints import read_header
from engine.loading.sovits import load_sovits
from engine.models.sovits_modules import unfold_weight_norm, weight_norm_prefixes
from engine.reference import read_reference, reference_audio_32k, reference_spectrogram
from tests.support.paths import conformance_root, fixture_folders

SPEC_ATOL = 1e-4  # 4 x the 2.5e-5 float64 floor
AUDIO_ATOL = 6e-6  # 4 x the 1.5e-6 float64 floor
INTER_RTOL, INTER_ATOL = 1e-5, 6e-6


def _sovits_folders() -> list:
    found = []
    for folder in fixture_folders("", "expected_meta.json"):
        meta = json.loads((folder / "expected_meta.json").read_text())
        if "decode_runs" in meta and any(folder.glob("*.pth")):
            found.append(folder)
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no SoVITS fixtures under {conformance_root()}"))]
    return [pytest.param(f, id=f.relative_to(conformance_root()).as_posix()) for f in found]


FOLDERS = _sovits_folders()


@lru_cache(maxsize=2)
def _load(folder: Path):
    pth = next(folder.glob("*.pth"))
    loaded = load_sovits(pth)
    inputs = torch.load(folder / "inputs.pt", weights_only=True)
    expected = torch.load(folder / "expected.pt", weights_only=True)
    meta = json.loads((folder / "expected_meta.json").read_text())
    return pth, loaded, inputs, expected, meta


def _close(got: torch.Tensor, want: torch.Tensor, name: str, rtol: float = INTER_RTOL, atol: float = INTER_ATOL) -> None:
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err = (got - want).abs().max().item()
    assert torch.allclose(got, want, rtol=rtol, atol=atol), f"{name}: max |diff| {err:.3g}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_file_format_and_version(folder: Path) -> None:
    pth, loaded, _, _, meta = _load(folder)
    assert read_header(pth).decode("latin-1") == meta["file_header_2bytes"]
    assert loaded.model_version == meta["tts_model_version_after_load"]
    assert loaded.unexpected_keys == ()
    # our module, written back in the official layout, has exactly the file's keys and shapes
    module = loaded.module
    ours = unfold_weight_norm(module.state_dict(), weight_norm_prefixes(module))
    in_file = meta["state_dict_in_file"]
    assert list(ours) == list(in_file)
    assert all(list(ours[k].shape) == in_file[k][0] for k in in_file)
    # and what the official non-strict load reports missing is exactly the training-only enc_q
    assert all(k.startswith("enc_q.") for k in meta["missing_keys_on_load_strict_false"])


@pytest.mark.parametrize("folder", FOLDERS)
def test_reference_spectrograms(folder: Path) -> None:
    _, _, inputs, expected, meta = _load(folder)
    args = meta["spectrogram_args"]
    for i in (0, 1):
        spec = linear_spectrogram(inputs[f"ref{i}_wav"], args["n_fft"], args["hop_size"], args["win_size"])
        _close(spec, expected[f"ref{i}_spec"], f"ref{i}_spec", rtol=0, atol=SPEC_ATOL)
        wav = folder / f"ref{i}_32k.wav"
        if wav.exists():  # the wav file decodes to exactly what torchaudio.load gave the official code
            decoded = read_audio(wav)
            assert decoded.sample_rate == args["sampling_rate"]
            np.testing.assert_array_equal(decoded.samples, inputs[f"ref{i}_wav"].numpy())
    # the whole reference path (read, validate 3-10 s, 32 kHz, peak rule) on the main reference
    clip = read_reference(folder / "ref0_32k.wav")
    _close(reference_spectrogram(reference_audio_32k(clip)), expected["ref0_spec"], "ref0 via reference path",
           rtol=0, atol=SPEC_ATOL)


@pytest.mark.parametrize("folder", FOLDERS)
def test_extract_latent_codes_identical(folder: Path) -> None:
    _, loaded, inputs, expected, _ = _load(folder)
    with torch.no_grad():
        proj = loaded.module.ssl_proj(inputs["ssl_features"])
        codes = loaded.module.extract_latent(inputs["ssl_features"])
    _close(proj, expected["extract_latent_ssl_proj"], "ssl_proj")
    assert codes.dtype == torch.int64
    assert torch.equal(codes, expected["extract_latent_codes"])


@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_runs(folder: Path) -> None:
    _, loaded, inputs, expected, meta = _load(folder)
    model = loaded.module
    assert meta["decode_runs"], "fixture has no decode runs"
    for name, run in meta["decode_runs"].items():
        want = expected[f"decode_{name}"]
        refs = [expected[k] for k in run["refer_specs"]]
        sv = [inputs[f"sv_emb{i}"] for i in range(len(refs))] if model.dims.is_pro else None
        with torch.no_grad():
            for i, spec in enumerate(refs):
                mask = torch.ones(1, 1, spec.shape[2])
                _close(model.ref_enc(spec[:, : model.dims.ref_bins] * mask, mask), want["ge_per_ref"][i],
                       f"{name} ref_enc[{i}]")
                if model.dims.is_pro:
                    _close(model.reference_style(spec, sv[i]), want["prelu_out"][i], f"{name} prelu[{i}]")
            # the steps of decode() one by one, to compare every recorded intermediate
            ge = model.style_vector(refs, sv)
            x, m_p, logs_p, y_mask = model.prior(inputs["decode_codes"], inputs["decode_phones"], ge, run["speed"])
            z_p = m_p + want["noise"] * torch.exp(logs_p) * run["noise_scale"]
            z = model.flow.reverse(z_p, y_mask, g=ge)
            audio = model.dec(z * y_mask, g=ge)
            if name == next(iter(meta["decode_runs"])):  # decode() itself is exactly those steps
                whole = model.decode(inputs["decode_codes"], inputs["decode_phones"], refs,
                                     noise_scale=run["noise_scale"], speed=run["speed"], sv_emb=sv, noise=want["noise"])
                assert torch.equal(whole, audio)
        for key, got in (("enc_p_x", x), ("m_p", m_p), ("logs_p", logs_p), ("y_mask", y_mask), ("flow_out_z", z)):
            _close(got, want[key], f"{name} {key}")
        assert list(audio.shape) == run["audio_shape"], name
        _close(audio, want["audio"], f"{name} audio", rtol=0, atol=AUDIO_ATOL)


@pytest.mark.parametrize("folder", FOLDERS)
def test_decode_noise_is_drawn_when_not_given(folder: Path) -> None:
    _, loaded, inputs, expected, _ = _load(folder)
    model = loaded.module
    sv = [inputs["sv_emb0"]] if model.dims.is_pro else None
    args = (inputs["decode_codes"][..., :10], inputs["decode_phones"], [expected["ref0_spec"]])
    with torch.no_grad():
        a = model.decode(*args, sv_emb=sv, generator=torch.Generator().manual_seed(1))
        b = model.decode(*args, sv_emb=sv, generator=torch.Generator().manual_seed(1))
        c = model.decode(*args, sv_emb=sv, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == (1, 1, 10 * 1280)
