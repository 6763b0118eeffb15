"""v3/v4 against the official fixtures (``conformance/v3v4``): mels, decode_encp, vocoders, full runs.

Tolerances. The fixture README asks for relative tolerances: a random DiT followed by a random
vocoder amplifies float differences. We measured the float32 noise floor of this chain by running
our implementation in float64 on the same inputs and comparing with the (float32) fixtures; as a
fraction of each tensor's peak:

* decode_encp features / CFM mels:       <= 6e-7   -> tolerance 1e-5 of the peak (about 20x)
* full-run audio (sequential, batched):  <= 4.6e-6 -> tolerance 1e-4 of the peak (about 20x)
* standalone vocoder forwards:           <= 2.6e-6 -> tolerance 1e-4 of the peak (about 40x)
* reference mel and resampling: computed in float32 by both sides with the same operations -> 1e-5.

On the reference machine every comparison is in fact bit-identical.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

from tests.support.paths import fixture_folders, folder_params

FEATURE_RTOL = 1e-5
AUDIO_RTOL = 1e-4
VOCODER_RTOL = 1e-4

FOLDERS = folder_params("v3v4", "expected_meta.json")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


@functools.lru_cache(maxsize=2)
def fixture(folder: Path):
    inputs = torch.load(folder / "inputs.pt", weights_only=False)
    expected = torch.load(folder / "expected.pt", weights_only=False)
    meta = json.loads((folder / "expected_meta.json").read_text())
    return inputs, expected, meta


def sovits_file(folder: Path) -> Path:
    files = [p for p in folder.glob("*.pth") if "vocoder" not in p.name]
    assert len(files) == 1, f"expected one SoVITS .pth in {folder}, found {files}"
    return files[0]


def bigvgan_folders(folder: Path) -> list[Path]:
    return sorted(p.parent for p in folder.glob("*/bigvgan_generator.pt"))


def v4_vocoder_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("v4_vocoder*.pth"))


@functools.lru_cache(maxsize=4)
def model(folder: Path, version: str):
    from engine.loading.sovits_v3 import load_sovits_v3

    return load_sovits_v3(sovits_file(folder), version=version)


@functools.lru_cache(maxsize=4)
def vocoder(folder: Path, version: str):
    from engine.loading.vocoder import load_bigvgan, load_v4_vocoder

    if version == "v3":
        folders = bigvgan_folders(folder)
        plain = [f for f in folders if f.name == "bigvgan_small"] or folders[:1]
        return load_bigvgan(plain[0])
    return load_v4_vocoder(v4_vocoder_files(folder)[0])


@functools.lru_cache(maxsize=4)
def prompt(folder: Path, version: str):
    from engine.acoustic.cfm import prepare_prompt

    inputs, expected, _ = fixture(folder)
    return prepare_prompt(model(folder, version), inputs["prompt_semantic"], inputs["prompt_phones"],
                          expected["refer_spec"], inputs["ref_wav_32k"], 32000)


def run_params() -> list:
    out = []
    for folder in fixture_folders("v3v4", "expected_meta.json"):
        meta = json.loads((folder / "expected_meta.json").read_text())
        for version in ("v3", "v4"):
            for name, run in meta.get(f"{version}_runs", {}).items():
                out.append(pytest.param(folder, version, name, run, id=f"{folder.name}-{version}_{name}"))
    return out or [pytest.param(None, None, None, None, marks=pytest.mark.skip(reason="no v3v4 fixtures"))]


# ---- front end ----------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("version", ["v3", "v4"])
def test_reference_mel(folder, version):
    from engine.acoustic.mel import MEL_PARAMS, mel_spectrogram, reference_mel
    from engine.audio import resample_sinc

    inputs, expected, _ = fixture(folder)
    inter = expected[f"{version}_intermediate"]
    ref = inputs["ref_wav_32k"]
    audio = resample_sinc(ref, 32000, MEL_PARAMS[version].sampling_rate)
    if version == "v3" and "v3_intermediate_ref_audio_resampled_24k" in expected:
        assert rel_err(audio, expected["v3_intermediate_ref_audio_resampled_24k"]) <= FEATURE_RTOL
    assert rel_err(mel_spectrogram(audio, MEL_PARAMS[version]), inter["mel2_raw"]) <= FEATURE_RTOL
    assert rel_err(reference_mel(ref, 32000, version), inter["mel2_norm"]) <= FEATURE_RTOL


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("version", ["v3", "v4"])
def test_decode_encp(folder, version):
    inputs, expected, _ = fixture(folder)
    inter = expected[f"{version}_intermediate"]
    m = model(folder, version)
    fea_ref, ge = m.decode_encp(inputs["prompt_semantic"][None, None], inputs["prompt_phones"][None],
                                expected["refer_spec"])
    assert rel_err(ge, inter["ge"]) <= FEATURE_RTOL
    assert rel_err(fea_ref, inter["fea_ref"]) <= FEATURE_RTOL
    for speed, key in ((1.0, "fea_todo_short_speed1"), (1.25, "fea_todo_short_speed125")):
        fea, _ = m.decode_encp(inputs["target_semantic_short"], inputs["target_phones_short"],
                               expected["refer_spec"], ge, speed)
        assert rel_err(fea, inter[key]) <= FEATURE_RTOL, key


@pytest.mark.parametrize("folder", FOLDERS)
def test_dims_read_from_the_file_match_the_fixture_constructors(folder):
    _, _, meta = fixture(folder)
    dit = model(folder, "v3").dims.dit
    want = meta["dit_constructor_args_used"]
    got = dataclasses.asdict(dit)
    assert {k: got[k] for k in want} == want
    w = meta["wns1_constructor_args_used"]
    dims = model(folder, "v3").dims
    assert (dims.wns1_hidden, dims.wns1_kernel, dims.wns1_layers) == (w[2], w[3], w[5])


# ---- vocoders -----------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", FOLDERS)
def test_bigvgan_forward(folder):
    from engine.loading.vocoder import load_bigvgan

    inputs, expected, _ = fixture(folder)
    folders = bigvgan_folders(folder)
    assert folders, f"no BigVGAN folder in {folder}"
    for sub in folders:
        with torch.inference_mode():
            out = load_bigvgan(sub)(inputs["vocoder_mel"])
        assert rel_err(out, expected[f"{sub.name}_out"]) <= VOCODER_RTOL, sub.name


@pytest.mark.parametrize("folder", FOLDERS)
def test_v4_vocoder_forward(folder):
    from engine.loading.vocoder import load_v4_vocoder

    inputs, expected, _ = fixture(folder)
    files = v4_vocoder_files(folder)
    assert files, f"no v4 vocoder in {folder}"
    for f in files:
        with torch.inference_mode():
            out = load_v4_vocoder(f)(inputs["vocoder_mel"])
        assert rel_err(out, expected[f"{f.stem}_out"]) <= VOCODER_RTOL, f.name


# ---- full runs with the recorded noise -------------------------------------------------------------


@pytest.mark.parametrize("folder,version,name,run", run_params())
def test_full_run(folder, version, name, run):
    from engine.acoustic.cfm import replay_noise, synthesize_batched, synthesize_sequential

    inputs, expected, _ = fixture(folder)
    want = expected[f"{version}_{name}"]
    noise = replay_noise(want["cfm_noise"])
    m, voc, pr = model(folder, version), vocoder(folder, version), prompt(folder, version)
    if run["function"].endswith("batched_infer"):
        sentences = [(tokens[-int(idx):], phones)
                     for tokens, idx, phones in zip(want["semantic_tokens_list"], want["idx_list"], want["phones_list"])]
        pieces, mel = synthesize_batched(m, voc, pr, sentences, run["speed"], run["sample_steps"], noise=noise)
        assert rel_err(mel, want["vocoder_input_mel"]) <= FEATURE_RTOL
        assert [p.shape[-1] for p in pieces] == run["fragment_lens"]
        for got, ref in zip(pieces, want["audio_fragments"]):
            assert rel_err(got, ref) <= AUDIO_RTOL
    else:
        tokens = inputs[run["target_semantic"]]
        phones = inputs[run["target_phones"]]
        audio, mel = synthesize_sequential(m, voc, pr, tokens, phones, run["speed"], run["sample_steps"], noise=noise)
        assert rel_err(mel, want["vocoder_input_mel"]) <= FEATURE_RTOL
        assert audio.shape[-1] == run["audio_len"]
        assert rel_err(audio, want["audio"]) <= AUDIO_RTOL


@pytest.mark.parametrize("folder", FOLDERS)
def test_rope_pairing_is_interleaved(folder):
    """The fixtures decide the RoPE convention: the half-split pairing must NOT reproduce them."""
    from engine.acoustic.cfm import replay_noise
    from engine.models.dit import DiT

    inputs, expected, meta = fixture(folder)
    name = min(meta["v3_runs"], key=lambda n: meta["v3_runs"][n]["sample_steps"])
    run, want = meta["v3_runs"][name], expected[f"v3_{name}"]
    m, pr = model(folder, "v3"), prompt(folder, "v3")
    fea, _ = m.decode_encp(inputs[run["target_semantic"]], inputs[run["target_phones"]], pr.refer_spec, pr.ge, run["speed"])
    feats = torch.cat([pr.features, fea[:, :, : pr.chunk_len]], 2)
    ref_mel = want["vocoder_input_mel"][:, :, : fea.shape[2]]

    def mel_with(interleaved: bool) -> torch.Tensor:
        est = m.cfm.estimator
        dit = DiT(dataclasses.replace(est.dims, rope_interleaved=interleaved))
        dit.load_state_dict(est.state_dict())
        from engine.models.cfm import CFM

        out = CFM(dit.eval()).sample(feats, pr.mel, run["sample_steps"], noise=replay_noise(want["cfm_noise"][:1]))
        from engine.acoustic.mel import denorm_spec

        return denorm_spec(out[:, :, pr.mel.shape[2]:])[:, :, : ref_mel.shape[2]]

    assert rel_err(mel_with(True), ref_mel) <= FEATURE_RTOL
    assert rel_err(mel_with(False), ref_mel) > 100 * FEATURE_RTOL


@pytest.mark.slow
@pytest.mark.parametrize("folder", FOLDERS)
def test_tolerances_are_well_above_the_float32_noise_floor(folder):
    """Re-measure the floor behind the tolerances: the same run in float64 vs the float32 fixture."""
    from engine.acoustic.cfm import prepare_prompt, replay_noise, synthesize_sequential
    from engine.loading.sovits_v3 import load_sovits_v3
    from engine.loading.vocoder import load_bigvgan

    inputs, expected, meta = fixture(folder)
    name = min(meta["v3_runs"], key=lambda n: meta["v3_runs"][n]["sample_steps"])
    run, want = meta["v3_runs"][name], expected[f"v3_{name}"]
    m = load_sovits_v3(sovits_file(folder), version="v3").double()
    voc = load_bigvgan([f for f in bigvgan_folders(folder) if f.name == "bigvgan_small"][0]).double()
    pr = prepare_prompt(m, inputs["prompt_semantic"], inputs["prompt_phones"], expected["refer_spec"].double(),
                        inputs["ref_wav_32k"], 32000)
    noise = replay_noise([n.double() for n in want["cfm_noise"]])
    audio, mel = synthesize_sequential(m, voc, pr, inputs[run["target_semantic"]], inputs[run["target_phones"]],
                                       run["speed"], run["sample_steps"], noise=noise)
    floor_mel, floor_audio = rel_err(mel, want["vocoder_input_mel"]), rel_err(audio, want["audio"])
    assert 0 < floor_mel < FEATURE_RTOL / 5 and 0 < floor_audio < AUDIO_RTOL / 5, (floor_mel, floor_audio)
