"""CUDA graphs of the acoustic stage's bucketed shapes (engine.acoustic.graphs, AcousticGraphs), with graph
semantics on the CPU: a fake capture whose replay recomputes the function from the static inputs only, so a
result that depends on anything but the copied inputs, or a replay whose outputs are read after the next
call, shows up as a wrong number."""

from __future__ import annotations

import pytest
import torch

import tests.support.synth as sup
from engine.acoustic.graphs import GraphBank
from engine.cloner import VoiceCloner
from engine.reference import Reference
from engine.reference_cache import ReferenceCache


def fake_capture(fn, example, static, pool):
    """A graph on the CPU: static inputs and outputs, and a replay that reads only the static inputs."""
    static_in = tuple(t.clone() for t in example)
    static_out = tuple(t.clone() for t in fn(*static_in, *static))

    def replay() -> None:
        for dst, src in zip(static_out, fn(*static_in, *static)):
            dst.copy_(src)

    return replay, static_in, static_out


def test_a_bank_runs_new_shapes_eagerly_captures_them_when_told_and_replays_them():
    calls = []

    def fn(a, b, scale):
        calls.append(a.shape)
        return (a * scale + b,)

    bank = GraphBank(fn, limit=2, capture=fake_capture, devices=("cpu",))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    torch.testing.assert_close(bank(a, b, static=(2.0,))[0], a * 2 + b)
    assert (bank.wanted, len(bank), bank.eager) == (1, 0, 1)
    bank(a, b, static=(2.0,))  # the same shape again: still one wanted
    bank(torch.randn(5, 4), torch.randn(5, 4), static=(2.0,))
    bank(torch.randn(6, 4), torch.randn(6, 4), static=(2.0,))  # past the limit: never wanted
    assert bank.wanted == 2
    assert bank.capture_wanted(limit=1) == 1 and bank.wanted == 1
    assert bank.capture_wanted() == 1 and len(bank) == 2 and bank.wanted == 0
    for _ in range(3):  # replays read the new inputs
        a, b = torch.randn(3, 4), torch.randn(3, 4)
        torch.testing.assert_close(bank(a, b, static=(2.0,))[0], a * 2 + b)
    assert bank.replays == 3
    torch.testing.assert_close(bank(a, b, static=(3.0,))[0], a * 3 + b)  # another static value: another key
    assert bank.replays == 3 and bank.wanted == 0  # the limit is reached: eager


def test_a_shape_whose_capture_fails_stays_eager_and_the_others_are_captured():
    def capture(fn, example, static, pool):
        if example[0].shape[0] == 2:
            raise RuntimeError("capture failed")
        return fake_capture(fn, example, static, pool)

    bank = GraphBank(lambda x: (x + 1,), capture=capture, devices=("cpu",))
    bank(torch.zeros(2))
    bank(torch.zeros(3))
    assert bank.capture_wanted() == 1
    torch.testing.assert_close(bank(torch.ones(2))[0], torch.full((2,), 2.0))
    torch.testing.assert_close(bank(torch.ones(3))[0], torch.full((3,), 2.0))
    assert bank.wanted == 0 and bank.replays == 1  # the failed shape is not wanted again


def test_a_bank_wants_nothing_off_its_devices():
    bank = GraphBank(lambda x: (x,))  # CUDA only
    bank(torch.zeros(2))
    assert bank.wanted == 0


@pytest.mark.parametrize("version", ["v2", "v2ProPlus"])
def test_batched_decodes_through_graphs_give_the_eager_numbers(version):
    """The bucketed batch decode with AcousticGraphs: the first round runs eagerly and notes its shapes; after
    the capture, rounds of the same shapes (other tokens, phones, crops, overlaps, noise) replay and give
    what the eager decode gives."""
    from engine.acoustic.streaming import AcousticGraphs, decode_streaming_batch

    models = sup.studio(version).cloner().models
    sovits = models.sovits
    ref = VoiceCloner(models, ReferenceCache()).prepare(Reference(sup.wav_bytes(sup.clip()), sup.REF_TEXT, "en"))
    ge = sovits.style_vector(list(ref.specs), list(ref.sv) if ref.sv is not None else None)
    hidden = sovits.dims.hidden_channels

    def rows(seed: int) -> list[dict]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for i, (n, p, keep, ov) in enumerate([(14, 9, None, None), (23, 17, 6, 4), (9, 5, 3, 2), (25, 7, 12, 4)]):
            out.append({"codes": torch.randint(0, 1024, (n,), generator=g), "text": torch.randint(1, 300, (p,), generator=g),
                        "ge": ge * (1 + 0.1 * i), "result_length": keep,
                        "overlap_frames": None if ov is None else torch.randn(1, hidden, ov, generator=g),
                        "generator": torch.Generator().manual_seed(seed + i)})
        return out

    graphs = AcousticGraphs(sovits, capture=fake_capture, devices=("cpu",))
    first = decode_streaming_batch(sovits, rows(1), buckets=True, graphs=graphs)
    assert graphs.wanted >= 2 and graphs.captures == 0
    assert graphs.capture_wanted() >= 2 and graphs.wanted == 0
    for seed in (2, 3):
        got = decode_streaming_batch(sovits, rows(seed), buckets=True, graphs=graphs)
        want = decode_streaming_batch(sovits, rows(seed), buckets=True)
        for (audio, latent), (want_audio, want_latent) in zip(got, want):
            torch.testing.assert_close(latent, want_latent, rtol=0, atol=0)
            torch.testing.assert_close(audio, want_audio, rtol=0, atol=0)
    assert graphs.encoders.replays == 2 and graphs.voices.replays >= 2
    assert len(first) == 4


def test_every_voicing_shape_and_the_common_encoder_shapes_can_be_captured_before_serving():
    """Warm-up captures a graph of every voicing shape (batch bucket x width bucket within the graph size) and of
    the common encoder shapes: a bucketed decode of such rows afterwards runs through replays only."""
    from engine.acoustic.streaming import BATCH_BUCKETS, AcousticGraphs, decode_streaming_batch

    sovits = sup.studio("v2").cloner().models.sovits
    graphs = AcousticGraphs(sovits, capture=fake_capture, devices=("cpu",))
    graphs.VOICE_FRAMES = 8 * 32  # a small graph size keeps the test short (serving: 32 x 160)
    wanted = graphs.want_voices()
    assert wanted == graphs.voices.wanted and wanted >= len(BATCH_BUCKETS)
    assert graphs.want_voices() == wanted  # noting them again adds nothing
    assert graphs.capture_wanted() == wanted and graphs.want_voices() == 0
    graphs.ENCODER_FRAMES, graphs.ENCODER_WIDTH = 4 * 128, 128
    encoders = graphs.want_encoders()
    assert encoders == graphs.encoders.wanted >= 2 and graphs.capture_wanted() == encoders
    g = torch.Generator().manual_seed(5)
    ge = torch.randn(1, sovits.dims.gin_channels, 1, generator=g)
    rows = [{"codes": torch.randint(0, 1024, (n,), generator=g), "text": torch.randint(1, 300, (7,), generator=g),
             "ge": ge, "result_length": 6, "overlap_frames": None, "generator": torch.Generator().manual_seed(n)}
            for n in (12, 30, 31)]
    decode_streaming_batch(sovits, rows, buckets=True, graphs=graphs)
    assert graphs.voices.eager == 0 and graphs.voices.replays >= 1
    assert graphs.encoders.eager == 0 and graphs.encoders.replays == 1  # 3 rows, 62 frames, 7 phones: (4, 64, 128)


def test_captures_stop_at_the_memory_bound_and_later_shapes_stay_eager():
    """A bank measures what each capture took of the device's memory; once its captures hold ``max_bytes``, the
    shapes still wanted (and any met later) run eagerly, with the same numbers, and are never wanted again."""
    held = [0]

    def capture(fn, example, static, pool):
        held[0] += 300  # each graph takes 300 bytes of the "device"
        return fake_capture(fn, example, static, pool)

    def fn(a, scale):
        return (a * scale,)

    bank = GraphBank(fn, limit=10, capture=capture, devices=("cpu",), max_bytes=500, reserved=lambda _: held[0])
    shapes = [torch.ones(n) for n in (1, 2, 3, 4)]
    for x in shapes:
        bank(x, static=(2.0,))
    assert bank.wanted == 4
    assert bank.capture_wanted() == 2  # 300, then 600 >= 500: no third capture
    assert len(bank) == 2 and bank.bytes == 600 and bank.wanted == 0
    for x in shapes + [torch.ones(5)]:
        assert torch.equal(bank(x, static=(2.0,))[0], 2 * x)
    assert bank.replays == 2 and bank.wanted == 0  # the shapes past the bound (and a new one after it) stay eager
    bank(torch.ones(6), static=(2.0,))
    assert bank.capture_wanted() == 0 and len(bank) == 2
