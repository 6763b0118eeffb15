"""Channels-last 1-D convolutions (engine.models.conv_layout) and the compiled voicing built on them
(engine.acoustic.streaming.compiled_voicing): the numbers of the plain modules, the layout they promise."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from engine.models.conv_layout import NWCConv1d, NWCConvTranspose1d, nwc_convolutions
from engine.models.hifigan import Generator


@pytest.mark.parametrize("make", [
    lambda: nn.Conv1d(8, 12, 7, padding=3),
    lambda: nn.Conv1d(8, 8, 3, dilation=5, padding=5, bias=False),
    lambda: nn.Conv1d(8, 4, 4, stride=2, padding=1, groups=2),
    lambda: nn.ConvTranspose1d(8, 4, 16, stride=8, padding=4),
    lambda: nn.ConvTranspose1d(8, 6, 4, stride=2, padding=1, output_padding=1, dilation=2),
])
def test_a_converted_convolution_gives_the_plain_numbers_in_nwc_memory(make):
    torch.manual_seed(0)
    plain = make().eval()
    nwc = copy.deepcopy(plain)
    assert nwc_convolutions(nwc) == 1 and type(nwc) in (NWCConv1d, NWCConvTranspose1d)
    x = torch.randn(3, 8, 21)
    want = plain(x)
    got = nwc(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == want.shape and got.stride(1) == 1  # channels are the fastest dimension: NWC memory
    x_nwc = x.transpose(1, 2).contiguous().transpose(1, 2)  # the same values in NWC memory (no copy made)
    torch.testing.assert_close(nwc(x_nwc), want, rtol=1e-5, atol=1e-5)
    assert nwc.state_dict().keys() == plain.state_dict().keys()  # files and loaders see the plain module


def test_a_hifigan_decoder_gives_the_same_audio_converted_and_is_converted_once():
    torch.manual_seed(1)
    dec = Generator(16, [3, 7], [[1, 3, 5], [1, 3, 5]], [4, 2], 32, [8, 4], gin_channels=8).eval()
    nwc = copy.deepcopy(dec)
    n = nwc_convolutions(nwc)
    assert n == sum(isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) for m in dec.modules())
    assert nwc_convolutions(nwc) == 0
    x, g = torch.randn(2, 16, 13), torch.randn(2, 8, 1)
    mask = (torch.arange(13)[None, None, :] < torch.tensor([13, 9])[:, None, None]).float()
    with torch.inference_mode():
        torch.testing.assert_close(nwc(x, g), dec(x, g), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(nwc(x, g, mask=mask)[..., : 9 * 8], dec(x, g, mask=mask)[..., : 9 * 8],
                                   rtol=1e-5, atol=1e-5)


def test_a_transposed_convolution_refuses_an_output_size_rather_than_ignoring_it():
    conv = nn.ConvTranspose1d(4, 4, 4, stride=2, padding=1)
    nwc_convolutions(conv)
    with pytest.raises(ValueError, match="output_size"):
        conv(torch.randn(1, 4, 5), output_size=[11])


def test_a_bank_captures_its_compiled_function_and_runs_shapes_met_eagerly_through_the_plain_one():
    from engine.acoustic.graphs import GraphBank
    from tests.acoustic.test_graphs import fake_capture

    plain_calls, compiled_calls = [], []

    def plain(x):
        plain_calls.append(x.shape)
        return (x + 1,)

    def compiled(x):
        compiled_calls.append(x.shape)
        return (x + 1,)

    bank = GraphBank(plain, capture=fake_capture, devices=("cpu",), captured=compiled)
    torch.testing.assert_close(bank(torch.zeros(3))[0], torch.ones(3))
    assert plain_calls == [(3,)] and compiled_calls == []
    assert bank.capture_wanted() == 1 and compiled_calls and plain_calls == [(3,)]
    torch.testing.assert_close(bank(torch.full((3,), 2.0))[0], torch.full((3,), 3.0))
    assert bank.replays == 1 and plain_calls == [(3,)]


@pytest.mark.slow
def test_the_compiled_voicing_gives_the_eager_numbers_for_every_bucket_met():
    """AcousticGraphs(compile=True) on the CPU (Inductor's C++ backend; serving compiles only on CUDA): bucketed
    decodes of several batch and width buckets through captures of the compiled, channels-last voicing give the
    eager decode's audio, with one dynamic-shape compile for all of them."""
    import tests.support.synth as sup
    from engine.acoustic.streaming import AcousticGraphs, decode_streaming_batch
    from tests.acoustic.test_graphs import fake_capture

    sovits = copy.deepcopy(sup.studio("v2ProPlus").cloner().models.sovits)  # converted in place: a copy of ours
    graphs = AcousticGraphs(sovits, compile=True, capture=fake_capture, devices=("cpu",))
    reference = copy.deepcopy(sup.studio("v2ProPlus").cloner().models.sovits)
    g = torch.Generator().manual_seed(3)
    ge = torch.randn(1, sovits.dims.gin_channels, 1, generator=g)

    def rows(lengths, seed):
        g = torch.Generator().manual_seed(seed)
        return [{"codes": torch.randint(0, 1024, (n,), generator=g), "text": torch.randint(1, 300, (7,), generator=g),
                 "ge": ge, "result_length": 6, "overlap_frames": None, "generator": torch.Generator().manual_seed(n)}
                for n in lengths]

    for lengths in ((12, 30, 31), (9,), (40, 8, 20, 33, 17)):
        decode_streaming_batch(sovits, rows(lengths, 1), buckets=True, graphs=graphs)  # met: noted
        assert graphs.capture_wanted() >= 1
        got = decode_streaming_batch(sovits, rows(lengths, 2), buckets=True, graphs=graphs)
        want = decode_streaming_batch(reference, rows(lengths, 2), buckets=True)
        for (audio, latent), (want_audio, want_latent) in zip(got, want):
            torch.testing.assert_close(latent, want_latent, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(audio, want_audio, rtol=1e-4, atol=1e-4)
    assert graphs.voices.replays >= 3
    assert sum(isinstance(m, NWCConv1d) for m in sovits.dec.modules()) > 0
