"""engine.runtime: HostCopy (tensors to the host in one copy per dtype, read only after wait()) and the CUDA
attention backends."""

from __future__ import annotations

import torch

from engine.runtime import HostCopy, tensors_to_host


def test_host_copy_keeps_values_shapes_and_dtypes() -> None:
    tensors = [torch.arange(6.0).view(2, 3), torch.arange(4, dtype=torch.long), torch.ones(3, dtype=torch.float16),
               torch.zeros(0), torch.tensor(7.5)]
    for got in (HostCopy(tensors, "cpu").wait(), tensors_to_host(tensors, "cpu")):
        assert len(got) == len(tensors)
        for g, t in zip(got, tensors):
            assert g.dtype == t.dtype and g.shape == t.shape
            assert torch.equal(g, t)


def test_a_host_copy_of_nothing_is_empty() -> None:
    assert HostCopy([], "cpu").wait() == []


def test_cuda_attention_leaves_out_the_backend_that_plans_every_shape(monkeypatch) -> None:
    """cuDNN's attention builds a plan per shape (each prefill, clip and sentence has one): on a CUDA device it is
    turned off once, unless SOVITS_CUDNN_ATTENTION=1; nothing changes for other devices."""
    from engine.runtime import attention_without_shape_plans

    state = {"on": True}
    monkeypatch.setattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: state["on"])
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", lambda on: state.update(on=on))
    monkeypatch.delenv("SOVITS_CUDNN_ATTENTION", raising=False)
    assert attention_without_shape_plans(torch.device("cpu")) is False and state["on"]
    monkeypatch.setenv("SOVITS_CUDNN_ATTENTION", "1")
    assert attention_without_shape_plans(torch.device("cuda", 0)) is False and state["on"]
    monkeypatch.delenv("SOVITS_CUDNN_ATTENTION")
    assert attention_without_shape_plans(torch.device("cuda", 0)) is True and not state["on"]
    assert attention_without_shape_plans(torch.device("cuda", 0)) is False and not state["on"]  # once
