"""Memory kept by the sinc resamplers after clips at many odd sample rates: the process's RSS growth and the
bytes of every torchaudio kernel still alive, after resampling one short clip from each of N rates whose
kernel is as large as the sinc path allows (engine.audio.MAX_SINC_KERNEL) to 32 kHz.

    python benchmarks/resampler_memory.py            # 60 rates
    python benchmarks/resampler_memory.py --rates 200
"""

from __future__ import annotations

import argparse
import gc
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=int, default=60)
    args = parser.parse_args()

    import psutil
    import torch
    import torchaudio.transforms as AT

    from engine.audio import MAX_SINC_KERNEL, resample_sinc, sinc_kernel_size

    process = psutil.Process()
    resample_sinc(torch.zeros(1, 48000), 44100, 32000)  # the libraries' first-use memory is not the rates'
    gc.collect()
    base = process.memory_info().rss
    rates = [r for r in range(8000, 384000)
             if MAX_SINC_KERNEL * 0.9 < sinc_kernel_size(r, 32000) <= MAX_SINC_KERNEL][:args.rates]
    clip = torch.zeros(1, 16000)
    for rate in rates:
        resample_sinc(clip, rate, 32000)
    gc.collect()
    kernels = sum(b.numel() * b.element_size() for m in gc.get_objects() if type(m) is AT.Resample
                  for b in m.buffers())
    print(json.dumps({"rates": len(rates), "rss_growth_mib": round((process.memory_info().rss - base) / 2**20),
                      "kernels_alive_mib": round(kernels / 2**20, 1)}))


if __name__ == "__main__":
    main()
