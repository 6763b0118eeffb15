"""What a T2S prefill's attention costs the first time it meets a width, per SDPA backend (CUDA).

The serving prefill (engine.serving.slots.SlotDecoder.prefill) runs ``F.scaled_dot_product_attention`` with a
boolean prefix-LM mask over rows left-padded to the widest prefix, so nearly every prefill has a width of its own.
A backend that builds a plan per shape (cuDNN's attention) pays that build in every prefill. This times, for
widths not met before, the first call and a repeat, under PyTorch's default choice and under each backend alone;
then the same for a 24-layer stack of such calls (the official T2S depth).

    python benchmarks/prefill_shapes.py --widths 180:260:7
"""

from __future__ import annotations

import argparse
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="180:260:7", help="start:stop:step of prefix widths (each new)")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--device", default="cuda", help="cuda (what this is for); cpu only checks the script")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{name}, torch {torch.__version__}, cuDNN attention enabled: {torch.backends.cuda.cudnn_sdp_enabled()}",
          flush=True)
    start, stop, step = (int(x) for x in args.widths.split(":"))
    backends = {"default": None, "cudnn": [SDPBackend.CUDNN_ATTENTION],
                "efficient": [SDPBackend.EFFICIENT_ATTENTION], "math": [SDPBackend.MATH]}
    for offset, (name, chosen) in enumerate(backends.items()):
        firsts, repeats, stacks = [], [], []
        for w in range(start + offset, stop + offset, step):  # widths of their own for each backend
            q, k, v = (torch.randn(args.rows, args.heads, w, args.head_dim, device=dev, dtype=dtype)
                       for _ in range(3))
            mask = torch.ones(args.rows, 1, w, w, device=dev, dtype=torch.bool).tril()

            def call(q=q, k=k, v=v, mask=mask, chosen=chosen):
                if chosen is None:
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                with sdpa_kernel(chosen):
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

            try:
                for times in (firsts, repeats):
                    sync()
                    t0 = time.perf_counter()
                    call()
                    sync()
                    times.append(time.perf_counter() - t0)
                sync()
                t0 = time.perf_counter()
                for _ in range(args.layers):
                    call()
                sync()
                stacks.append(time.perf_counter() - t0)
            except RuntimeError as e:  # a backend that cannot run this shape or device
                print(f"{name}: width {w}: {str(e).splitlines()[0][:120]}", flush=True)
                break
        if firsts:
            print(f"{name:9s}: first call at a new width median {1e3 * sorted(firsts)[len(firsts) // 2]:7.2f} ms "
                  f"(max {1e3 * max(firsts):7.2f}), repeat {1e3 * sorted(repeats)[len(repeats) // 2]:6.3f} ms, "
                  f"{args.layers} layers at a met width {1e3 * sorted(stacks)[len(stacks) // 2]:6.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
