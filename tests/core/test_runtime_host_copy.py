"""engine.runtime.HostCopy: tensors to the host in one copy per dtype, read only after wait()."""

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
