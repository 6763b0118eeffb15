"""A server that cannot allocate what its settings ask never says ready (issue 32, item 12), on the CPU.

Measured on an H100 (80 GB): ``serve --slots 1100`` (sized for a 141 GB card) failed to allocate its decoding
pool in warm-up (CUDA out of memory, 51.6 GiB asked), warm-up logged "finished (nothing); ready", /health said
ready and every request got 500 for good. Here the device memory is a fake figure and the allocation failure
a ``torch.OutOfMemoryError`` raised by a patched pool: explicit slots beyond what fits are clamped with a
warning naming the most that fits, an allocation failure fails its own request with a 503-kind error and the
next request tries again, and a failed warm-up leaves /health "degraded" with the reason.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import engine.serving.scheduler as scheduler_module
import tests.support.synth as sup
from engine.errors import BusyError
from engine.options import EngineSettings, SynthesisOptions
from engine.readiness import Readiness
from engine.reference import Reference
from engine.studio import Studio
from engine.warmup import WarmupSettings, warm_up_in_background

GIB = 1 << 30
TEXT = "The quick brown fox jumps over the lazy dog."


def _studio(**settings) -> Studio:
    shared = sup.studio("v2")
    return Studio(shared.default_weights, shared.runtime, EngineSettings(**settings), pool=shared.pool)


def _run(studio: Studio) -> list:
    options = SynthesisOptions(seed=1, text_split_method="cut5", early_stop_num=12)
    reference = Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en")
    return [r.tokens for r in studio.synthesize(TEXT, "en", reference, options)]


def test_the_slot_arithmetic_of_the_h100_case() -> None:
    v2 = SimpleNamespace(n_layer=24, hidden_dim=512, vocab_size=1025)  # the official v2 GPT, fp16
    per_slot = scheduler_module.slot_bytes(v2, context=2048, element_size=2)
    # the K half of 1100 slots is the 51.6 GiB the H100 could not allocate
    assert 1100 * 24 * 2048 * 512 * 2 / GIB == pytest.approx(51.6, abs=0.05)
    assert per_slot >= 2 * 24 * 2048 * 512 * 2
    free = 75 * GIB  # an 80 GB card with the models loaded
    fit = scheduler_module.slots_that_fit(free, per_slot, scheduler_module.EXPLICIT_FRACTION)
    assert fit * per_slot <= free * scheduler_module.EXPLICIT_FRACTION < (fit + 1) * per_slot
    assert 600 < fit < 1100  # 1100 did not fit; about 700 do
    assert scheduler_module.slots_that_fit(free, per_slot, 0.5) < fit  # automatic slots keep half the memory


def test_explicit_slots_beyond_what_fits_are_clamped_with_a_warning_naming_the_most_that_fits(
        monkeypatch, caplog) -> None:
    studio = _studio(scheduler_slots=1100)
    try:
        t2s = studio.cloner().models.t2s
        p = next(t2s.parameters())
        per_slot = scheduler_module.slot_bytes(t2s.dims, 2048, p.element_size())
        free = 10 * per_slot + per_slot // 2
        monkeypatch.setattr(scheduler_module, "device_free_memory", lambda device: free)
        fit = scheduler_module.slots_that_fit(free, per_slot, scheduler_module.EXPLICIT_FRACTION)
        assert 0 < fit < 1100
        studio.close()
        studio = _studio(scheduler_slots=1100)
        with caplog.at_level(logging.WARNING, logger="engine.serving.scheduler"):
            sched = studio.scheduler(studio.cloner().models)
        assert sched.slots == fit  # before: 1100 slots asked of a device that holds `fit`
        assert f"{fit} slots" in caplog.text and "1100" in caplog.text
        assert _run(studio)
    finally:
        studio.close()


def _failing_pool(monkeypatch, times: int | None) -> list:
    """The slot pool's allocation raises CUDA's out-of-memory error ``times`` times (None: always)."""
    calls: list[int] = []
    real = scheduler_module.SlotDecoder

    def pool(*args, **kwargs):
        calls.append(1)
        if times is None or len(calls) <= times:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 51.60 GiB (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "SlotDecoder", pool)
    return calls


def test_an_allocation_failure_fails_its_own_request_with_503_and_the_next_one_tries_again(monkeypatch) -> None:
    from studio.http.errors import status_for

    calls = _failing_pool(monkeypatch, times=1)
    studio = _studio(scheduler_slots=2)
    try:
        with pytest.raises(BusyError) as caught:  # before: torch.OutOfMemoryError, a 500 for every request
            _run(studio)
        assert status_for(caught.value) == 503 and caught.value.retry_after > 0
        assert "scheduler_slots" in str(caught.value) and "out of memory" in str(caught.value)
        assert _run(studio)  # the next request allocates again, and it works
        assert len(calls) == 2
    finally:
        studio.close()


def test_a_failed_warm_up_leaves_health_degraded_with_the_reason(monkeypatch, tmp_path) -> None:
    from studio.http.app import create_app
    from studio.http.context import ServerSettings
    from tests.http.test_hardening import asgi

    _failing_pool(monkeypatch, times=None)
    studio = _studio(scheduler_slots=2)
    try:
        app = create_app(studio, ServerSettings())
        studio.readiness = Readiness()
        warm_up_in_background(studio, studio.readiness, settings=WarmupSettings(languages=("en",), max_tokens=6))
        assert studio.readiness.wait(120)

        async def calls(c):
            return await c.get("/health")

        health = asgi(app, calls)
        assert health.status_code == 200
        body = health.json()
        assert body["status"] == "degraded", body  # before: "ready", then a 500 for every request
        assert "out of memory" in body["reason"]
    finally:
        studio.close()
