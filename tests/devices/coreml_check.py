"""``python -m tests.devices.coreml_check VOCODER_PTH PACKAGE``: a Core ML prediction against torch (macOS).

Loads the v4 vocoder and its exported package through the engine's own path (identity check, then
``select_vocoder`` with its probe comparison), vocodes a longer mel than the package's bound (so the
windowed path runs too) and exits non-zero when the package is not used or differs too much.
"""

from __future__ import annotations

import sys

import torch


def main(argv: list[str]) -> int:
    from engine.acoustic.vocoder_backend import DEFAULT_TOLERANCE, relative_error, select_vocoder
    from engine.loading.vocoder import V4VocoderDims, load_v4_vocoder

    weights, package = argv
    dims = V4VocoderDims()
    torch_vocoder = load_v4_vocoder(weights)
    chosen = select_vocoder("coreml", torch_vocoder, kind="v4", sample_rate=dims.sampling_rate, hop=dims.hop,
                            channels=torch_vocoder.conv_pre.in_channels, package=package)
    print(f"backend {chosen.backend}; probe difference {chosen.probe_error}; {chosen.reason or 'no fallback'}")
    if chosen.backend != "coreml":
        return 1
    mel = torch.randn(1, torch_vocoder.conv_pre.in_channels, 1500, generator=torch.Generator().manual_seed(3)) - 5
    with torch.inference_mode():
        err = relative_error(chosen.vocoder(mel), torch_vocoder(mel))
    print(f"1500-frame mel (windowed): relative difference {err:.3g} (limit {DEFAULT_TOLERANCE['none']})")
    return 0 if err <= DEFAULT_TOLERANCE["none"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
