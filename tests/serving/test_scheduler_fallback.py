"""The scheduler's T2S steps go through the device fallback: when the device lacks an operator of a prefill or a
decode step (MPS), the model set's slot pool moves to the CPU with its KV cache and the request finishes there,
with the tokens it would have had; logged once, counted in /metrics.

The accelerator is faked as in tests/core/test_device_fallback.py: the fallback treats the CPU as the device,
and the decoder raises PyTorch's MPS "not implemented" error while it runs on the shared model."""

from __future__ import annotations

import logging
import time

import pytest

import tests.support.synth as sup
from engine.options import EngineSettings, SynthesisOptions
from engine.reference import Reference
from engine.results import join
from engine.studio import Studio
from engine.runtime import DeviceFallback
from engine.serving.scheduler import StepFailedError
from engine.serving.slots import SlotDecoder

MPS_ERROR = ("The operator 'aten::_fused_sdp_choice' is not currently implemented for the MPS device. "
             "As a temporary fix, you can set the environment variable `PYTORCH_ENABLE_MPS_FALLBACK=1`")
TEXT = "The quick brown fox jumps over the lazy dog. It was a bright cold day."


def _studio(fake_mps: bool) -> Studio:
    shared = sup.studio("v2")
    studio = Studio(shared.default_weights, shared.runtime, EngineSettings(scheduler_slots=2), pool=shared.pool)
    if fake_mps:
        studio.fallback = DeviceFallback(devices=("cpu",))  # the CPU plays the accelerator
    return studio


def _synthesize(studio: Studio, stream: bool):
    opts = SynthesisOptions(seed=11, streaming_mode=stream, text_split_method="cut5", early_stop_num=60)
    results = list(studio.synthesize(TEXT, "en", Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"), opts))
    return [r.tokens for r in results], join(results)[1]


def _lacks_operator(monkeypatch, which: str, calls: list[str]) -> None:
    """``which`` (prefill or step) fails as on MPS while the decoder runs on the shared model (on the device)."""
    original = getattr(SlotDecoder, which)

    def on_device(self, *args, **kwargs):
        shared = self.model is self.__dict__.setdefault("_device_model", self.model)
        calls.append("device" if shared else "cpu")
        if shared:
            raise NotImplementedError(MPS_ERROR)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SlotDecoder, which, on_device)


@pytest.mark.parametrize("which,stream", [("prefill", False), ("step", True)])
def test_a_request_finishes_on_the_cpu_after_a_failing_step(monkeypatch, caplog, which, stream) -> None:
    plain = _studio(fake_mps=False)
    try:
        want_tokens, want_audio = _synthesize(plain, stream)
    finally:
        plain.close()
    calls: list[str] = []
    _lacks_operator(monkeypatch, which, calls)
    studio = _studio(fake_mps=True)
    try:
        with caplog.at_level(logging.WARNING):
            tokens, audio = _synthesize(studio, stream)
            again, _ = _synthesize(studio, stream)  # the pool stays on the CPU: no new failure, no new log
        sched = studio.scheduler(studio.cloner().models)
        assert calls[0] == "device" and calls.count("device") == 1 and calls[1:] and set(calls[1:]) == {"cpu"}
        assert tokens == want_tokens == again and audio.size == want_audio.size
        assert sched.decoder.device.type == "cpu" and sched.decoder.model is not sched.models.t2s
        assert sched.decoder.k.device.type == "cpu"
        assert "t2s" in studio.fallback.cpu_stages and "MPS" in studio.fallback.cpu_stages["t2s"].error
        counts = studio.fallback.counts()["t2s"]
        assert counts >= sched.steps  # every step of the moved pool is counted
        assert sum("t2s stage needs an operator" in r.message for r in caplog.records) == 1
        assert sum("moves its 2 slots" in r.message for r in caplog.records) == 1
        from studio.http.metrics import Registry, register_engine_metrics

        registry = Registry()
        register_engine_metrics(registry, studio)
        assert f'sovits_cpu_fallback_total{{stage="t2s"}} {float(counts)}' in registry.render() or \
            f'sovits_cpu_fallback_total{{stage="t2s"}} {counts}' in registry.render()
    finally:
        studio.close()


def test_a_real_error_is_not_moved(monkeypatch) -> None:
    def broken(self, *args, **kwargs):
        raise RuntimeError("The size of tensor a (3) must match the size of tensor b (2)")

    monkeypatch.setattr(SlotDecoder, "step", broken)  # (a failing prefill is the serving issue's recovery work)
    studio = _studio(fake_mps=True)
    try:
        with pytest.raises(StepFailedError) as caught:  # the step's requests fail; the scheduler rebuilds
            _synthesize(studio, False)
        assert "size of tensor" in str(caught.value.__context__)
        sched = studio.scheduler(studio.cloner().models)
        deadline = time.monotonic() + 30
        while sched.state != "ok" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert studio.fallback.counts() == {}
        assert studio.scheduler(studio.cloner().models).decoder.model is studio.cloner().models.t2s
    finally:
        studio.close()
