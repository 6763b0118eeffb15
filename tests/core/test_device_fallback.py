"""The per-stage CPU fallback: a stage whose operator the accelerator lacks reruns on the CPU, once logged,
remembered and counted. The accelerator is faked: as MPS (the tensors report an "mps" device, as in
test_runtime), or as half-precision weights whose operator is "not implemented for 'Half'"."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch import nn

from engine.runtime import DeviceFallback, cpu_copy, is_missing_operator

MPS_MESSAGE = "Output channels > 65536 not supported at the MPS device."


class HalfHostile(nn.Module):
    """A stage whose operator is missing for half-precision weights (the CPU lacks half convs here)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 2)
        self.calls: list[torch.dtype] = []

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.calls.append(self.proj.weight.dtype)
        if self.proj.weight.dtype == torch.float16:
            raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'")
        return self.proj(x) * scale


def test_a_stage_that_fails_reruns_on_a_cpu_copy_and_is_remembered(caplog: pytest.LogCaptureFixture) -> None:
    net = HalfHostile().half()
    fallback = DeviceFallback(devices=("cpu",))  # the "accelerator" here: half weights on the CPU
    x = torch.ones(1, 3, dtype=torch.float16)
    with caplog.at_level(logging.WARNING, logger="engine.runtime"):
        first = fallback.run("sovits", net, lambda m, v, scale: m(v, scale=scale), x, scale=2.0)
        second = fallback.run("sovits", net, lambda m, v, scale: m(v, scale=scale), x, scale=3.0)
    want = nn.functional.linear(x.float(), net.proj.weight.float(), net.proj.bias.float())
    assert first.dtype == torch.float16 and torch.allclose(first.float(), 2 * want, atol=1e-2)
    assert torch.allclose(second.float(), 3 * want, atol=1e-2)
    assert net.calls == [torch.float16]  # the second call went straight to the CPU copy
    assert set(fallback.cpu_stages) == {"sovits"} and "Half" in fallback.cpu_stages["sovits"].error
    assert fallback.counts() == {"sovits": 2}
    assert sum("sovits stage" in r.message for r in caplog.records) == 1
    assert net.proj.weight.dtype == torch.float16  # the shared network is never changed


def test_other_stages_and_real_errors_are_untouched() -> None:
    fallback = DeviceFallback(devices=("cpu",))
    net = nn.Linear(2, 2)

    def broken(m, x):
        raise RuntimeError("The size of tensor a (3) must match the size of tensor b (2)")

    with pytest.raises(RuntimeError, match="size of tensor"):
        fallback.run("t2s", net, broken, torch.ones(2))

    def oom(m, x):
        raise RuntimeError("MPS backend out of memory (MPS allocated: 9 GB). Tried to allocate 1 GB")

    with pytest.raises(RuntimeError, match="out of memory"):
        fallback.run("vocoder", net, oom, torch.ones(2))
    assert fallback.cpu_stages == {} and fallback.counts() == {}
    # a device not listed (CUDA here) never falls back
    assert DeviceFallback(devices=("mps",)).run("t2s", net, lambda m, x: m(x), torch.ones(2)).shape == (2,)


def test_fake_mps_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """As test_runtime fakes MPS: marked tensors report the mps device; the network fails there."""
    net = nn.Linear(2, 2)
    for p in net.parameters():
        p._fake_mps = True  # type: ignore[attr-defined]
    moved: list[str] = []
    real_to = torch.Tensor.to

    def fake_to(t, *args, **kwargs):
        if args and str(args[0]) == "mps":
            moved.append("mps")
            return real_to(t, *args[1:], **kwargs) if len(args) > 1 else t
        return real_to(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "device",
                        property(lambda t: torch.device("mps") if getattr(t, "_fake_mps", False) else torch.device("cpu")))
    monkeypatch.setattr(torch.Tensor, "to", fake_to)

    def stage(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if getattr(next(m.parameters()), "_fake_mps", False):
            raise NotImplementedError(MPS_MESSAGE)
        return m(x)

    fallback = DeviceFallback()  # MPS only, the default
    out = fallback.run("vocoder", net, stage, torch.ones(1, 2))
    assert torch.allclose(out, net(torch.ones(1, 2))) and moved == ["mps"]
    assert fallback.cpu_stages["vocoder"].device == "mps" and MPS_MESSAGE in fallback.cpu_stages["vocoder"].error


@dataclasses.dataclass(frozen=True)
class Prompt:
    mel: torch.Tensor
    n: int


def test_inputs_inside_dataclasses_and_generators_move_to_the_cpu() -> None:
    fallback = DeviceFallback(devices=("cpu",))
    net = HalfHostile().half()
    gen = torch.Generator().manual_seed(0)
    seen = {}

    def stage(m, prompt: Prompt, generator: torch.Generator):
        seen["dtype"], seen["n"] = prompt.mel.dtype, prompt.n
        seen["noise"] = torch.randn(2, generator=generator)
        return m(prompt.mel)

    fallback.run("cfm", net, stage, Prompt(torch.ones(1, 3, dtype=torch.float16), 7), generator=gen)
    assert seen["dtype"] == torch.float32 and seen["n"] == 7 and seen["noise"].shape == (2,)


def test_cpu_copy_is_float32_and_leaves_the_original() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).half()
    copy = cpu_copy(net)
    assert all(p.dtype == torch.float32 for p in copy.parameters())
    assert copy[1].num_batches_tracked.dtype == torch.int64
    assert all(p.dtype == torch.float16 for p in net.parameters())
    assert copy[0].weight.data_ptr() != net[0].weight.data_ptr()


@pytest.mark.parametrize("err, missing", [
    (NotImplementedError("The operator 'aten::_fft_r2c' is not currently implemented for the MPS device."), True),
    (NotImplementedError(MPS_MESSAGE), True),
    (RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'"), True),
    (TypeError("Trying to convert BFloat16 to the MPS backend but it does not have support for that dtype."), True),
    (RuntimeError("MPSGraph does not support tensor dims larger than INT_MAX"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1.00 GB)"), False),
    (RuntimeError("shape mismatch"), False),
    (ValueError("not implemented for 'Half'"), False),
])
def test_missing_operator_errors(err: BaseException, missing: bool) -> None:
    assert is_missing_operator(err) is missing


@pytest.mark.parametrize("scheduler", [False, True])
def test_streaming_chunks_rerun_on_the_cpu_when_the_device_lacks_an_operator(monkeypatch, scheduler) -> None:
    """Token-chunk streaming (the official loop, and the scheduler's) voices each chunk through the
    fallback: when SoVITS's decoder fails on the "device", the chunks come from its CPU copy, and the audio is
    the same as without the failure (here both copies are float32 on the CPU). The failing network is the
    reference encoder, which the first chunk meets before any noise is drawn, so the noise is the same too."""
    import numpy as np

    import tests.support.synth as sup
    from engine.options import EngineSettings, SynthesisOptions
    from engine.reference import Reference
    from engine.results import join
    from engine.studio import Studio

    shared = sup.studio("v2")

    def studio(fallback):
        s = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler=scheduler), pool=shared.pool)
        s.fallback = fallback
        return s

    opts = SynthesisOptions(streaming_mode=True, seed=4, early_stop_num=40, min_chunk_length=8,
                            text_split_method="cut5")
    reference = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    plain = studio(None)
    try:
        want = list(plain.synthesize("Nice to meet you.", "en", reference, opts))
    finally:
        plain.close()
    encoder = plain.cloner().models.sovits.ref_enc
    broken = {id(encoder)}  # the shared network "lacks an operator"; its CPU copy (a new object) does not
    forward = type(encoder).forward

    def failing(self, *args, **kwargs):
        if id(self) in broken:
            raise NotImplementedError("The operator 'aten::fake' is not currently implemented for the MPS device")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(encoder), "forward", failing)
    fallback = DeviceFallback(devices=("cpu",))
    served = studio(fallback)
    try:
        got = list(served.synthesize("Nice to meet you.", "en", reference, opts))
    finally:
        served.close()
    assert len(want) >= 2 and [r.tokens for r in got] == [r.tokens for r in want]
    assert np.array_equal(join(got)[1], join(want)[1])
    assert "sovits" in fallback.cpu_stages and fallback.counts()["sovits"] >= len(want) - 1
