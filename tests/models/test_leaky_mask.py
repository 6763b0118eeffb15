"""The fused leaky-ReLU + mask of the masked HiFi-GAN decoder: the Triton kernel (run by Triton's interpreter
on the CPU) gives exactly PyTorch's numbers, and masked positions are zero."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from engine.models.leaky_mask import leaky_masked

REPO = Path(__file__).resolve().parents[2]


def test_the_torch_path_is_leaky_relu_times_the_mask() -> None:
    x = torch.randn(2, 3, 10)
    mask = (torch.arange(10) < torch.tensor([[7], [10]])).unsqueeze(1).float()
    y = leaky_masked(x, 0.1, mask)
    assert torch.equal(y, torch.nn.functional.leaky_relu(x, 0.1) * mask)
    assert torch.equal(leaky_masked(x, 0.01, None), torch.nn.functional.leaky_relu(x))
    assert not y[0, :, 7:].any()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_triton_kernel_matches_pytorch() -> None:
    code = textwrap.dedent("""
        import torch
        import torch.nn.functional as F
        from engine.models.leaky_mask_triton import leaky_masked
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.float16):
            for b, c, t in ((3, 5, 1500), (1, 2, 7)):
                x = (torch.randn(b, c, t, generator=g) * 3).to(dtype)
                lengths = torch.randint(1, t + 1, (b,), generator=g)
                mask = (torch.arange(t) < lengths.view(-1, 1)).unsqueeze(1).to(dtype)
                for slope in (0.1, 0.01):
                    got = leaky_masked(x, slope, mask)
                    want = torch.where(mask != 0, F.leaky_relu(x, slope), torch.zeros((), dtype=dtype))
                    assert got.dtype == dtype and torch.equal(got, want), (dtype, b, c, t, slope)
        print("ok")
    """)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
