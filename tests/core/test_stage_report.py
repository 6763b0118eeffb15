"""Where each stage runs and why (engine.stage_report): the runtime's reason per precision, stages the device
fallback moved to the CPU with the device's error, the CPU thread setup; `sovits-studio doctor` and /health."""

from __future__ import annotations

import torch

from engine.runtime import CPU_FP32, MPS_VOCODER_FP32, STAGES, DeviceProbe, resolve_runtime
from engine.stage_report import format_report, stage_report, stage_rows

MAC = DeviceProbe(mps=True)
CUDA = DeviceProbe(cuda_count=1, cuda_capability=(9, 0), cuda_name="H100", cuda_bf16=True)


def test_the_runtime_says_why_each_stage_runs_in_its_precision() -> None:
    cpu = resolve_runtime("cpu", "auto", probe=DeviceProbe())
    assert {cpu.reason_for(s) for s in STAGES} == {CPU_FP32}
    refused = resolve_runtime("cpu", "fp16", probe=DeviceProbe())  # half precision is refused on the CPU
    assert refused.reason_for("t2s").startswith(CPU_FP32) and "half precision was asked for" in refused.reason_for("t2s")
    mac = resolve_runtime("auto", "auto", probe=MAC)
    assert mac.device.type == "mps" and mac.reason_for("vocoder") == MPS_VOCODER_FP32
    assert mac.reason_for("t2s").startswith("fp16 (auto)")
    mixed = resolve_runtime("cuda", "fp16", stage_overrides={"vocoder": "fp32"}, probe=CUDA)
    assert mixed.reason_for("t2s").startswith("fp16: asked for")
    assert mixed.reason_for("vocoder") == "fp32: the config's precision for this stage"
    assert mixed == resolve_runtime("cuda", "fp16", stage_overrides={"vocoder": "fp32"}, probe=CUDA)


class _Studio:
    """What the report reads of a Studio: its runtime, stage plan and device fallback."""

    def __init__(self, runtime) -> None:
        from engine.runtime import DeviceFallback

        self.runtime, self.fallback, self.device_notice = runtime, DeviceFallback(), ""

    def stage_plan(self):
        from engine.runtime import PRECISIONS

        names = {v: k for k, v in PRECISIONS.items()}
        moved = self.fallback.cpu_stages
        return [(s, "cpu (operator missing on mps)" if s in moved else str(self.runtime.device),
                 "fp32" if s in moved else names[self.runtime.dtype_for(s)], "torch") for s in STAGES]


def test_a_mac_user_sees_what_runs_on_mps_what_fell_back_and_why() -> None:
    studio = _Studio(resolve_runtime("auto", "auto", probe=MAC))
    error = NotImplementedError("The operator 'aten::_weight_norm_interface' is not currently implemented for MPS")
    assert studio.fallback.moves_to_cpu("sovits", torch.device("mps"), error)
    rows = {r["stage"]: r for r in stage_rows(studio)}
    assert (rows["t2s"]["device"], rows["t2s"]["precision"]) == ("mps", "fp16")
    assert rows["vocoder"]["why"] == MPS_VOCODER_FP32
    assert rows["sovits"]["device"].startswith("cpu") and rows["sovits"]["precision"] == "fp32"
    assert "mps lacks an operator" in rows["sovits"]["why"] and "_weight_norm_interface" in rows["sovits"]["why"]
    report = stage_report(studio)
    assert report["fallbacks"]["sovits"]["cpu_runs"] == 1 and report["device"] == "mps"
    assert "PYTORCH_ENABLE_MPS_FALLBACK" in report["mps_operator_fallback"]
    assert report["cpu_threads"]["intra_op"] == torch.get_num_threads()
    text = format_report(report)
    assert "sovits: from mps, 1 CPU runs: The operator 'aten::_weight_norm_interface'" in text
    assert "OMP_WAIT_POLICY" in text


def test_a_cpu_engine_reports_no_fallback() -> None:
    report = stage_report(_Studio(resolve_runtime("cpu", "auto", probe=DeviceProbe())))
    assert report["fallbacks"] == {} and {r["device"] for r in report["stages"]} == {"cpu"}
    assert "moved to the CPU: none so far" in format_report(report)


def test_health_and_doctor_carry_the_report(capsys) -> None:
    """/health of a served engine lists every stage under ``stages``; `sovits-studio doctor --no-run --json`
    prints the same report for a config."""
    import json

    import httpx

    from studio.cli import main
    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from tests.support.server import running_server
    from tests.support.synth import model_config, studio

    with running_server(create_app(studio("v2"), ServerSettings())) as url:
        body = httpx.get(f"{url}/health", timeout=30).json()
    assert body["status"] == "ready"
    assert [r["stage"] for r in body["stages"]["stages"]] == list(STAGES)
    assert {r["device"] for r in body["stages"]["stages"]} == {"cpu"}
    assert main(["doctor", "-c", str(model_config("v2")), "--device", "cpu", "--no-run", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "cpu" and [r["stage"] for r in report["stages"]] == list(STAGES)
    assert all(r["why"] for r in report["stages"])
