"""The GPT-SoVITS model versions, named once.

Every version has a T2S (GPT) model and a SoVITS model. They differ in the acoustic stage:
- v1, v2, v2Pro, v2ProPlus decode semantic tokens to audio directly (HiFi-GAN inside SoVITS), so their
  audio can stream token chunk by token chunk;
- v2Pro and v2ProPlus also condition on a speaker-verification embedding (ERes2NetV2);
- v3 and v4 produce a mel with a CFM (DiT) model and need a vocoder: BigVGAN (v3) or the v4 HiFi-GAN.
"""

from __future__ import annotations

# The official release order, as the sections of the official tts_infer.yaml list them.
VERSIONS = ("v1", "v2", "v3", "v4", "v2Pro", "v2ProPlus")
PRO_VERSIONS = ("v2Pro", "v2ProPlus")
VOCODER_VERSIONS = ("v3", "v4")
DIRECT_VERSIONS = ("v1", "v2", *PRO_VERSIONS)  # SoVITS decodes audio itself (token-chunk streaming)


def uses_vocoder(version: str) -> bool:
    """True for v3/v4: audio comes from CFM + a vocoder, sentence by sentence."""
    return version in VOCODER_VERSIONS


def uses_speaker_embedding(version: str) -> bool:
    """True for v2Pro/v2ProPlus: SoVITS takes an ERes2NetV2 speaker embedding."""
    return version in PRO_VERSIONS
