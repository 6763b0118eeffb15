"""CUDA graphs of one function of fixed-shape tensors, one graph per input shape (the acoustic stage's bucketed
shapes): a call replays the graph of its shape when there is one, else runs the function eagerly and notes the
shape; the noted shapes are captured later, when the owner holds the device to itself.

Why: a streamed chunk's SoVITS decode is about 1,800 small kernels, each launched from Python; at serving's
batch sizes their launch cost, not their device time, is what a chunk costs. A graph launches them at once.

Responsibilities: the graphs, their static buffers and their one memory pool; bounds on how many and on the
memory their captures took. Not: when it
is safe to capture (the caller, e.g. ``engine.serving.gate``), nor which shapes are worth one (the caller's
buckets). Calls and captures must come from one thread at a time, and the outputs of a replay are valid only
until the next call (copy what must outlive it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

import torch

log = logging.getLogger(__name__)

Key = tuple[Hashable, ...]


def _key(inputs: tuple[torch.Tensor, ...], static: tuple) -> Key:
    return (*((tuple(t.shape), t.dtype, t.device) for t in inputs), *static)


Graph = tuple[Callable[[], None], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]  # replay, inputs, outputs


def device_reserved(device: torch.device) -> int:
    """Bytes the caching allocator holds on ``device`` (CUDA; 0 elsewhere): a capture's growth of it is what the
    graph's pool (and its warm-up call) took."""
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def capture_cuda(fn: Callable[..., tuple[torch.Tensor, ...]], example: tuple[torch.Tensor, ...], static: tuple,
                 pool) -> Graph:
    """Capture ``fn(*example, *static)`` as a CUDA graph in ``pool``, on the current stream (a side stream when
    that is the default one), after a warm-up call there. Returns its replay, its static inputs (copies of
    ``example``) and outputs.

    The low-level capture calls, not ``torch.cuda.graph``: that one synchronises the device, collects garbage
    and empties the allocator's cache on entry, costs a serving process pays for every shape captured while
    serving. The warm-up calls run on the stream that will run the eager rounds too, so the memory they
    cache is reused there rather than held for a stream used once."""
    device = example[0].device
    stream = torch.cuda.current_stream(device)
    side = stream == torch.cuda.default_stream(device)  # capture cannot run on the legacy default stream
    static_in = tuple(t.clone() for t in example)
    if side:  # after the copies: the side stream reads them
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(*static_in, *static)  # a first call: convolution plans, Triton builds, lazy buffers
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's API call cannot invalidate this capture
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            static_out = tuple(fn(*static_in, *static))
        finally:
            graph.capture_end()
    if side:
        torch.cuda.current_stream(device).wait_stream(stream)
    return graph.replay, static_in, static_out


class GraphBank:
    """Graphs of ``fn(*tensors, *static)`` keyed by the tensors' shapes and ``static``; at most ``limit`` of them,
    and no capture once those already made took ``max_bytes`` of device memory (measured by ``reserved``: what the
    allocator holds before and after each capture); shapes beyond either bound run eagerly.

    ``fn`` must read only its tensor arguments (and fixed weights) and return a tuple of tensors; its work must
    be capturable (no host synchronisation, no new shapes from data). ``capture``: how a graph is made
    (:func:`capture_cuda`; tests give graph semantics on the CPU), for inputs on ``devices``. ``captured``: the
    function the graphs hold, when not ``fn`` itself (a compiled ``fn``: its compiling, tens of seconds, then
    happens in a capture, never in an eager call of a shape met while serving).
    """

    def __init__(self, fn: Callable[..., tuple[torch.Tensor, ...]], limit: int = 64,
                 capture: Callable[..., Graph] = capture_cuda, devices: tuple[str, ...] = ("cuda",),
                 captured: Callable[..., tuple[torch.Tensor, ...]] | None = None, max_bytes: int | None = None,
                 reserved: Callable[[torch.device], int] = device_reserved) -> None:
        self.fn, self.limit, self._make, self._devices = fn, limit, capture, devices
        self.max_bytes, self._reserved = max_bytes, reserved
        self.bytes = 0  # device memory the captures took (pool growth, warm-up calls included)
        self._captured = fn if captured is None else captured
        self._graphs: dict[Key, Graph] = {}
        self._wanted: dict[Key, tuple[tuple[torch.Tensor, ...], tuple]] = {}  # shapes met eagerly: an example each
        self._failed: set[Key] = set()  # shapes whose capture failed: always eager
        self._pool = None  # one memory pool for every graph of the bank: replays never overlap (one thread, one
        # stream at a time), and a replay's outputs are used before the next call
        self.captures = 0
        self.replays = 0
        self.eager = 0

    def __len__(self) -> int:
        return len(self._graphs)

    @property
    def full(self) -> bool:
        """Whether the captures took their memory bound: no shape is wanted or captured any more."""
        return self.max_bytes is not None and self.bytes >= self.max_bytes

    @property
    def wanted(self) -> int:
        """Shapes met without a graph, waiting for :meth:`capture_wanted`."""
        return len(self._wanted)

    def want(self, *example: torch.Tensor, static: tuple = ()) -> None:
        """Note a shape to capture (``example``: inputs of that shape the function runs on without error), as if
        a call had met it; within the limit."""
        key = _key(example, static)
        if (key not in self._graphs and key not in self._wanted and key not in self._failed and not self.full
                and len(self._graphs) + len(self._wanted) < self.limit):
            self._wanted[key] = (example, static)

    def __call__(self, *inputs: torch.Tensor, static: tuple = ()) -> tuple[torch.Tensor, ...]:
        """``fn``'s outputs: a graph's (valid until the next call), else an eager call's."""
        key = _key(inputs, static)
        entry = self._graphs.get(key)
        if entry is None:
            if (key not in self._wanted and key not in self._failed and inputs[0].device.type in self._devices
                    and not self.full and len(self._graphs) + len(self._wanted) < self.limit):
                self._wanted[key] = (tuple(t.clone() for t in inputs), static)
            self.eager += 1
            return self.fn(*inputs, *static)
        replay, static_in, static_out = entry
        with torch.inference_mode():  # the static buffers were made in inference mode (capture_wanted)
            for dst, src in zip(static_in, inputs):
                dst.copy_(src)
            replay()
        self.replays += 1
        return static_out

    @torch.inference_mode()
    def capture_wanted(self, limit: int | None = None) -> int:
        """Capture the graphs of (up to ``limit`` of) the shapes met eagerly; the number captured. Only while no
        other thread uses the device (a capture records every launch on it)."""
        done = 0
        for key in list(self._wanted)[:limit]:
            example, static = self._wanted.pop(key)
            if self.full:
                log.warning("the acoustic graphs hold %.0f MiB (their bound: %.0f MiB): %d more shapes run eagerly",
                            self.bytes / 2**20, self.max_bytes / 2**20, len(self._wanted) + 1)
                self._failed.update([key, *self._wanted])  # never wanted again
                self._wanted.clear()
                break
            if self._pool is None and self._make is capture_cuda:
                self._pool = torch.cuda.graph_pool_handle()
            before = self._reserved(example[0].device)
            try:
                self._graphs[key] = self._make(self._captured, example, static, self._pool)
            except Exception:  # that shape stays eager; the others are unaffected
                log.exception("capturing an acoustic graph failed; that shape runs eagerly")
                self._failed.add(key)
                continue
            finally:
                self.bytes += max(0, self._reserved(example[0].device) - before)
            self.captures += 1
            done += 1
        return done
