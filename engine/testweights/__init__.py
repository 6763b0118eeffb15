"""Complete random model sets in the official formats and folder layout, so tests never download.

``make_test_weights(dir, version)`` writes, under ``dir/GPT_SoVITS/pretrained_models`` with the
official file names, a GPT ``.ckpt``, a SoVITS ``.pth``, the HuBERT and RoBERTa folders, the
speaker-verification net (v2Pro*) or the vocoder (v3/v4), and ``dir/tts_infer.yaml`` pointing at
them. Tiny dims by default; the official dims with ``full_size`` (for benchmarks).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from engine.versions import VERSIONS, VOCODER_VERSIONS

PRETRAINED = Path("GPT_SoVITS") / "pretrained_models"
LAYOUT: dict[str, dict[str, str]] = {
    "v1": {"gpt": "s1bert25hz-2kh-longer-epoch=68e-step=50232.ckpt", "sovits": "s2G488k.pth"},
    "v2": {"gpt": "gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt",
           "sovits": "gsv-v2final-pretrained/s2G2333k.pth"},
    "v2Pro": {"gpt": "s1v3.ckpt", "sovits": "v2Pro/s2Gv2Pro.pth", "sv": "sv/pretrained_eres2netv2w24s4ep4.ckpt"},
    "v2ProPlus": {"gpt": "s1v3.ckpt", "sovits": "v2Pro/s2Gv2ProPlus.pth",
                  "sv": "sv/pretrained_eres2netv2w24s4ep4.ckpt"},
    "v3": {"gpt": "s1v3.ckpt", "sovits": "s2Gv3.pth", "vocoder": "models--nvidia--bigvgan_v2_24khz_100band_256x"},
    "v4": {"gpt": "s1v3.ckpt", "sovits": "gsv-v4-pretrained/s2Gv4.pth", "vocoder": "gsv-v4-pretrained/vocoder.pth"},
}
BERT_FOLDER = "chinese-roberta-wwm-ext-large"
HUBERT_FOLDER = "chinese-hubert-base"
TEST_TOKEN_CAP = 50  # tokens per sentence written into a test set's config (2 s of audio)


def make_test_weights(out_dir: str | Path, version: str, full_size: bool = False, seed: int = 0,
                      t2s_shape: Mapping[str, int] | None = None) -> Path:
    """Write a complete random model set for ``version``; returns the path of its ``tts_infer.yaml``.

    ``t2s_shape`` overrides GPT widths (``engine.testweights.t2s.SHAPE_KEYS``), e.g. a head width that is
    not a power of two."""
    from engine.testweights.roberta import write_roberta_folder
    from engine.testweights.sovits import write_hubert_folder, write_sovits, write_sv_checkpoint
    from engine.testweights.t2s import write_t2s

    if version not in LAYOUT:
        raise ValueError(f"unknown version {version!r}; choose one of {', '.join(VERSIONS)}")
    out_dir = Path(out_dir).resolve()
    root = out_dir / PRETRAINED
    files = {kind: root / rel for kind, rel in LAYOUT[version].items()}
    write_t2s(files["gpt"], "v1" if version == "v1" else "v2", full_size, seed, t2s_shape)
    if version in VOCODER_VERSIONS:
        from engine.testweights.v3v4 import write_bigvgan_folder, write_sovits_v3, write_v4_vocoder

        write_sovits_v3(files["sovits"], version, full_size)
        if version == "v3":
            write_bigvgan_folder(files["vocoder"], full_size)
        else:
            write_v4_vocoder(files["vocoder"], full_size)
    else:
        write_sovits(files["sovits"], version, full_size)
    if "sv" in files:
        write_sv_checkpoint(files["sv"], full_size)
    write_hubert_folder(root / HUBERT_FOLDER, full_size)
    write_roberta_folder(root / BERT_FOLDER, full_size)
    section = {
        "device": "cpu", "is_half": False, "version": version,
        "t2s_weights_path": str(files["gpt"]), "vits_weights_path": str(files["sovits"]),
        "bert_base_path": str(root / BERT_FOLDER), "cnhuhbert_base_path": str(root / HUBERT_FOLDER),
        # random weights rarely say EOS: a cap ends each sentence in 2 s, and the page says what this is
        "max_tokens_per_sentence": TEST_TOKEN_CAP, "random_weights": True,
    }
    if "vocoder" in files:
        section["vocoder_path"] = str(files["vocoder"])
    if "sv" in files:
        section["sv_weights_path"] = str(files["sv"])
    config = out_dir / "tts_infer.yaml"
    config.write_text(yaml.safe_dump({"custom": section, version: dict(section)}, sort_keys=True), encoding="utf-8")
    return config
