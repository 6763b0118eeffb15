"""Device and precision decisions with the machine faked, and the per-operator CPU fallback."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.errors import ConfigError, DeviceUnavailableError
from engine.platform_env import (
    MPS_FALLBACK_VAR,
    OMP_SPIN_VAR,
    OMP_WAIT_VAR,
    enable_mps_fallback,
    openmp_waits,
    passive_cpu_threads,
)
from engine.runtime import STAGES, CpuFallback, DeviceProbe, resolve_device, resolve_runtime, runtime_from_official

CPU_ONLY = DeviceProbe()
H200 = DeviceProbe(cuda_count=1, cuda_capability=(9, 0), cuda_name="NVIDIA H200", cuda_bf16=True)
PASCAL = DeviceProbe(cuda_count=2, cuda_capability=(6, 1), cuda_name="GeForce GTX 1080")
GTX1660 = DeviceProbe(cuda_count=1, cuda_capability=(7, 5), cuda_name="NVIDIA GeForce GTX 1660 Ti")
T4_NO_BF16 = DeviceProbe(cuda_count=1, cuda_capability=(7, 5), cuda_name="Tesla T4", cuda_bf16=False)
MAC = DeviceProbe(mps=True)


@pytest.mark.parametrize(
    "probe, want",
    [(CPU_ONLY, "cpu"), (H200, "cuda:0"), (MAC, "mps"), (DeviceProbe(cuda_count=1, mps=True), "cuda:0")],
)
def test_auto_prefers_cuda_then_mps_then_cpu(probe: DeviceProbe, want: str) -> None:
    assert str(resolve_device("auto", probe)) == want
    assert str(resolve_device(None, probe)) == want


@pytest.mark.parametrize("requested, probe", [("cuda", CPU_ONLY), ("cuda:1", H200), ("mps", H200), ("mps", CPU_ONLY)])
def test_explicit_missing_device_is_an_error(requested: str, probe: DeviceProbe) -> None:
    with pytest.raises(DeviceUnavailableError, match=requested.split(":")[0]):
        resolve_device(requested, probe)


def test_explicit_devices_that_exist() -> None:
    assert str(resolve_device("cuda:1", PASCAL)) == "cuda:1"
    assert str(resolve_device("CPU", H200)) == "cpu"
    with pytest.raises(ConfigError):
        resolve_device("gpu0", H200)
    with pytest.raises(DeviceUnavailableError):
        resolve_device("xpu", H200)


def test_auto_precision_per_device() -> None:
    assert set(resolve_runtime("auto", probe=CPU_ONLY).stage_dtypes.values()) == {torch.float32}
    assert set(resolve_runtime("auto", probe=H200).stage_dtypes.values()) == {torch.float16}
    assert set(resolve_runtime("auto", probe=PASCAL).stage_dtypes.values()) == {torch.float32}
    assert set(resolve_runtime("auto", probe=GTX1660).stage_dtypes.values()) == {torch.float32}
    mac = resolve_runtime("auto", probe=MAC)
    assert mac.dtype_for("vocoder") == torch.float32 and mac.dtype_for("t2s") == torch.float16


def test_sampling_stays_fp32_and_overrides_apply() -> None:
    rt = resolve_runtime("cuda", "bf16", {"vocoder": "fp32"}, probe=H200)
    assert rt.sampling_dtype == torch.float32
    assert rt.dtype_for("t2s") == torch.bfloat16 and rt.dtype_for("vocoder") == torch.float32
    assert rt.is_half
    with pytest.raises(ConfigError, match="bf16"):
        resolve_runtime("cuda", "bf16", probe=T4_NO_BF16)
    with pytest.raises(ConfigError, match="stage"):
        resolve_runtime("cpu", "fp32", {"decoder": "fp16"}, probe=CPU_ONLY)
    with pytest.raises(ConfigError, match="precision"):
        resolve_runtime("cpu", "fp8", probe=CPU_ONLY)
    with pytest.raises(KeyError):
        rt.dtype_for("nope")


def test_half_on_cpu_falls_back_to_fp32() -> None:
    rt = resolve_runtime("cpu", "fp16", probe=H200)
    assert not rt.is_half and set(rt.stage_dtypes) == set(STAGES)


def test_official_section_mapping() -> None:
    assert runtime_from_official("cuda", True, probe=H200).dtype_for("sovits") == torch.float16
    assert runtime_from_official("cpu", True, probe=H200).dtype_for("sovits") == torch.float32
    with pytest.raises(DeviceUnavailableError):  # the official code silently used the CPU here
        runtime_from_official("cuda", True, probe=CPU_ONLY)


def test_mps_fallback_env_only_on_macos() -> None:
    env: dict[str, str] = {}
    assert not enable_mps_fallback(env, platform="linux") and env == {}
    assert enable_mps_fallback(env, platform="darwin") and env[MPS_FALLBACK_VAR] == "1"
    user = {MPS_FALLBACK_VAR: "0"}
    assert not enable_mps_fallback(user, platform="darwin") and user[MPS_FALLBACK_VAR] == "0"


def test_openmp_threads_wait_passively_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    assert passive_cpu_threads(env) and env == {OMP_WAIT_VAR: "PASSIVE"}
    assert openmp_waits(env) == "OMP_WAIT_POLICY=PASSIVE"
    user = {OMP_WAIT_VAR: "active"}
    assert not passive_cpu_threads(user) and user == {OMP_WAIT_VAR: "active"}
    spin = {OMP_SPIN_VAR: "10000"}  # a spin count of the user's: the policy is left to libgomp's default
    assert not passive_cpu_threads(spin) and spin == {OMP_SPIN_VAR: "10000"}
    assert openmp_waits(spin) == "OMP_WAIT_POLICY=default GOMP_SPINCOUNT=10000"


def test_the_command_line_leaves_openmp_waits_to_libgomp(monkeypatch) -> None:
    """No sovits-studio command sets the OpenMP wait policy: libgomp's default spin keeps the T2S decode at its
    single-team speed (engine.openmp keeps the serving path there); a policy the user sets is theirs."""
    from studio.cli import main

    for var in (OMP_WAIT_VAR, OMP_SPIN_VAR):  # set first so that the test's end restores the caller's value
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)
    assert main(["--help"]) == 0
    import os

    assert OMP_WAIT_VAR not in os.environ and OMP_SPIN_VAR not in os.environ


class FakeDeviceTensorOp:
    """An operator that is 'missing' unless its input lives on the CPU (we fake a device tensor)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        where = "cpu" if getattr(x, "_fake_device", None) is None else "fake"
        self.calls.append(where)
        if where == "fake":
            raise NotImplementedError("The operator 'aten::fft_r2c' is not currently implemented for the MPS device")
        return x * scale


def test_cpu_fallback_runs_missing_operator_on_cpu_and_logs_once(caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fallback = CpuFallback()
    op = FakeDeviceTensorOp()
    x = torch.ones(3)
    x._fake_device = "mps"  # type: ignore[attr-defined]
    # the fallback moves tensors with .cpu()/.to(); on a real device that changes the device, here we
    # make .cpu() return an unmarked copy and report a non-CPU device for the marked one.
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("meta") if hasattr(t, "_fake_device") else torch.device("cpu")))
    monkeypatch.setattr(torch.Tensor, "cpu", lambda t: t.clone())
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: t)
    with caplog.at_level(logging.WARNING):
        out1 = fallback.run("fft", op, x, scale=2.0)
        out2 = fallback.run("fft", op, x, scale=3.0)
    assert out1.tolist() == [2.0] * 3 and out2.tolist() == [3.0] * 3
    assert op.calls == ["fake", "cpu", "fake", "cpu"]
    assert fallback.fallen_back == {"fft"}
    assert sum("fft" in r.message for r in caplog.records) == 1


def test_cpu_fallback_does_not_hide_real_errors() -> None:
    fallback = CpuFallback()

    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        fallback.run("broken", broken, torch.ones(1))

    def missing_on_cpu(x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("not implemented for 'CPU'")

    with pytest.raises(NotImplementedError):  # already on the CPU: nothing to fall back to
        fallback.run("missing", missing_on_cpu, torch.ones(1))


def test_config_device_missing_falls_back_but_command_line_device_must_exist() -> None:
    from engine.runtime import runtime_for_config

    rt, notice = runtime_for_config("cuda", True, probe=CPU_ONLY)  # the shipped official config on a laptop
    assert str(rt.device) == "cpu" and "cuda" in notice and "--device" in notice
    rt, notice = runtime_for_config("cuda", True, probe=H200)
    assert str(rt.device) == "cuda:0" and rt.dtype_for("t2s") == torch.float16 and notice == ""
    rt, notice = runtime_for_config("cuda", True, override_precision="fp32", probe=H200)
    assert rt.dtype_for("t2s") == torch.float32 and notice == ""
    with pytest.raises(DeviceUnavailableError):
        runtime_for_config("cpu", False, override_device="cuda", probe=CPU_ONLY)


def test_conv_backend_turns_cudnn_off_only_when_native_is_chosen_on_cuda() -> None:
    import pytest
    import torch

    from engine.runtime import conv_backend

    assert torch.backends.cudnn.enabled
    with conv_backend(torch.device("cuda"), "native"):
        assert not torch.backends.cudnn.enabled
    assert torch.backends.cudnn.enabled
    for device, choice in ((torch.device("cuda"), "auto"), (torch.device("cuda"), "cudnn"), (torch.device("cpu"), "native")):
        with conv_backend(device, choice):
            assert torch.backends.cudnn.enabled
    with pytest.raises(ValueError, match="conv backend"):
        conv_backend(torch.device("cpu"), "fast")
