"""Device results reach the host only after the host waited for the device, on every accelerator.

A fake accelerator stands in for MPS (and the others): a non-blocking copy to a host tensor is only queued, as
on a real device, and lands when the device's ``synchronize`` runs. A read before the wait sees stale numbers."""

from __future__ import annotations

import pytest
import torch

from engine.models.t2s import T2SDims
from engine.runtime import copy_to_host, tensors_to_host, wait_for_device
from engine.serving.slots import SlotDecoder
from engine.testweights.t2s import random_t2s_model


class FakeAccelerator:
    """Records the order of waits and reads; copies queued with non_blocking=True land at the wait."""

    def __init__(self) -> None:
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.events: list[str] = []
        fake = self

        class LateHost(torch.Tensor):  # a host buffer whose incoming non-blocking copies are deferred
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.Tensor.copy_ and kwargs.get("non_blocking"):
                    fake.pending.append((args[0], args[1].clone()))
                    return args[0]
                if func is torch.Tensor.numpy:
                    fake.events.append("read")
                return super().__torch_function__(func, types, args, kwargs)

        self.host_type = LateHost

    def synchronize(self, *_args) -> None:
        self.events.append("wait")
        for dst, src in self.pending:
            dst.copy_(src)
        self.pending.clear()


@pytest.fixture
def fake(monkeypatch) -> FakeAccelerator:
    accel = FakeAccelerator()
    monkeypatch.setattr(torch.mps, "synchronize", accel.synchronize)
    monkeypatch.setattr(torch.xpu, "synchronize", accel.synchronize)

    class Stream:
        synchronize = staticmethod(accel.synchronize)

    class Event:  # CUDA's copies to the host wait on an event recorded behind them (engine.runtime.HostCopy)
        def record(self, stream=None) -> None:
            pass

        synchronize = staticmethod(accel.synchronize)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "Event", Event)
    return accel


@pytest.mark.parametrize("device", ["mps", "xpu", "cuda:0"])
def test_copy_to_host_waits_for_every_accelerator(fake, device) -> None:
    host = torch.zeros(2, 3, dtype=torch.long).as_subclass(fake.host_type)
    src = torch.tensor([[1, 2, 3], [4, 5, 6]])
    copy_to_host(((host[0], src[0]), (host[1], src[1])), device)
    assert fake.events == ["wait"] and not fake.pending
    assert host.numpy().tolist() == [[1, 2, 3], [4, 5, 6]]


@pytest.mark.parametrize("device", ["mps", "cuda:0"])
def test_many_tensors_reach_the_host_after_one_wait(fake, device) -> None:
    """A round's audio: pieces of several shapes and dtypes, one wait for the device, the same numbers back."""
    g = torch.Generator().manual_seed(0)
    pieces = [torch.randn(5, generator=g), torch.randn(2, 3, generator=g).half(), torch.randn(0, generator=g),
              torch.randn(7, generator=g), torch.randn(4, generator=g)[1:3]]
    got = tensors_to_host(pieces, device)
    assert fake.events == ["wait"]
    assert [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in pieces]
    for a, b in zip(got, pieces):
        assert torch.equal(a, b)
    on_cpu = tensors_to_host(pieces, "cpu")  # the CPU: as they are, no wait
    assert all(a is b for a, b in zip(on_cpu, pieces)) and fake.events == ["wait"]


@pytest.mark.parametrize("device", ["mps", "cuda:0"])
def test_a_host_copy_is_queued_without_waiting(fake, device) -> None:
    """What lets an acoustic round be queued behind the previous one: starting the copy waits for nothing; the
    one wait comes with the read."""
    from engine.runtime import HostCopy

    pieces = [torch.arange(5.0), torch.arange(3, dtype=torch.long)]
    copy = HostCopy(pieces, device)
    assert fake.events == []
    got = copy.wait()
    assert fake.events == ["wait"]
    assert all(torch.equal(a, b) for a, b in zip(got, pieces))
    assert copy.wait() is got and fake.events == ["wait"]  # read once


def test_the_fake_shows_a_missing_wait() -> None:
    """The check can fail: without the wait, the read sees the buffer as it was."""
    accel = FakeAccelerator()
    host = torch.zeros(3, dtype=torch.long).as_subclass(accel.host_type)
    host.copy_(torch.tensor([7, 8, 9]), non_blocking=True)
    assert host.numpy().tolist() == [0, 0, 0]
    accel.synchronize()
    assert host.numpy().tolist() == [7, 8, 9]


def test_cpu_needs_no_wait(fake) -> None:
    wait_for_device("cpu")
    host = torch.zeros(2, dtype=torch.long)
    copy_to_host(((host, torch.tensor([3, 4])),), "cpu")
    assert host.tolist() == [3, 4] and fake.events == []


def test_a_decode_step_on_mps_reads_its_tokens_after_the_wait(fake) -> None:
    dims = T2SDims(embedding_dim=32, hidden_dim=32, n_head=2, n_layer=2, vocab_size=65, phoneme_vocab_size=40,
                   eos=64, bert_dim=16)
    decoder = SlotDecoder(random_t2s_model(dims), slots=2, capacity=64, use_graph=False, attention="torch")
    decoder.device = torch.device("mps")  # the fake: the step's copies to the host go through MPS's path
    decoder.pos_host, decoder.pos[0] = 63, 63  # a window that is a plain slice (no index tensor on "mps")
    decoder._host = decoder._host.as_subclass(fake.host_type)
    toks, args = decoder.step(2)
    assert fake.events[:2] == ["wait", "read"]
    assert toks.tolist() == decoder.out_token[:2].tolist() and args.tolist() == decoder.out_argmax[:2].tolist()
    assert decoder.out_token[:2].ne(0).any() or decoder.out_argmax[:2].ne(0).any()  # not the buffer's zeros
