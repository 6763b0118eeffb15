"""The continuous-batching scheduler: all model work of one model set on one device.

Responsibilities: (1) T2S: requests' sentences take slots of a :class:`SlotDecoder`, join between
decode steps (their prefixes prefilled together) and leave the moment they stop or their reader
goes away; each step decodes every occupied slot at once; (2) the acoustic stage: token chunks
(streaming) or whole sentences go to a worker thread (its own CUDA stream) that voices them while
the decode loop goes on, so a decode step never waits for SoVITS; (3) admission: a bounded number
of requests wait for a slot, beyond that :class:`BusyError`.

Randomness per request (see :mod:`engine.serving.sampling`): T2S noise is keyed by (seed, sentence,
step); the SoVITS/CFM noise of a sentence comes from a generator seeded by (seed, sentence). So a
request's output does not depend on what else runs, and in float32 it is the same alone or not.
"""

from __future__ import annotations

import logging
import math
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.acoustic.streaming import ChunkTracker
from engine.errors import BusyError, EngineError
from engine.openmp import FIT_INTERVAL_S, fit_threads, release_team
from engine.serving.acoustic_rounds import CAPTURE, AcousticRounds
from engine.serving.gate import DeviceGate
from engine.serving.requests import Request
from engine.serving.sampling import stream_key
from engine.serving.slots import SlotDecoder
from engine.t2s.decoding import SamplingParams, StopRules, T2SOutput

log = logging.getLogger(__name__)

PREFILL_TOKENS = 8192  # most prefix positions (rows x width) prefilled in one go
CPU_SLOTS = 8
MAX_CUDA_SLOTS = 2048
# arrivals waiting that are prefilled at once, whatever prefill_wait_s (CUDA, while rows decode)
PREFILL_BATCH = 16
# a whole-file request decodes up to this many of its sentences at once (each in a slot of its own)
PARALLEL_SENTENCES = 16
# Python's GIL switch interval while a scheduler runs: a thread that waits for the GIL (the decode loop after
# each device sync) gets it after at most this long, not after the default 5 ms that any CPU-bound thread (a
# request's text front end) may hold it; with many clients the default throttles every decode step.
GIL_SWITCH_INTERVAL_S = 0.0005
T2S_STAGE = "t2s"  # the DeviceFallback stage of the decode steps


class SchedulerClosedError(EngineError):
    """The scheduler was closed (its model set evicted, reloaded or idle under memory pressure); a new
    one serves the model set now."""


class StepFailedError(BusyError):
    """A decode step (or prefill) this request was in failed on the device; the scheduler rebuilt its
    decoding state and serves the next requests, so the same request may be sent again."""


class DeviceFailedError(EngineError):
    """The device stopped working (its state could not be rebuilt): the server must be restarted."""


@dataclass(frozen=True)
class SchedulerConfig:
    """Sizes of one scheduler (``EngineSettings`` holds the user's choices; 0 = automatic)."""

    slots: int = 0  # decoding slots (requests decoded at once); 0: from free device memory (CPU: 8)
    queue: int = 64  # requests waiting for a slot; one more gets BusyError
    context: int = 2048  # positions per slot: prefix (phones + prompt tokens) + generated tokens
    memory_fraction: float = 0.5  # auto slots: this share of the free device memory goes to the KV cache
    conv_backend: str = "auto"  # the acoustic stage's convolutions (engine.runtime.conv_backend)
    # where streaming chunks are voiced in batches (CUDA), pad each batch to bucketed shapes (a single chunk
    # too), so that the convolutions meet a few shapes again and again instead of building plans for new ones
    acoustic_buckets: bool = True
    # bucketed acoustic batches (CUDA) replay CUDA graphs of the shapes met (captured under the gate, a few a
    # round, and every one met at warm-up by capture_graphs); False: always eager
    acoustic_graphs: bool = True
    # the voicing graphs hold the compiled, channels-last voicing (engine.acoustic.streaming.compiled_voicing)
    acoustic_compile: bool = False
    # CUDA: a round's kernels are queued before the previous round's audio is delivered (same numbers)
    acoustic_pipeline: bool = True
    # CUDA: prefills replay graphs captured per bucket (engine.serving.slots); False: eager prefills
    prefill_graphs: bool = True
    # CUDA, while rows decode: sentences that arrive wait up to this long for others (or until PREFILL_BATCH
    # wait), so that one prefill takes them together; 0: each loop turn prefills what arrived
    prefill_wait_s: float = 0.05


@dataclass
class Context:
    """What the scheduler needs of a request beyond its sentences (made by the VoiceCloner)."""

    cloner: Any  # engine.cloner.VoiceCloner
    ref: Any  # PreparedReference
    options: Any  # SynthesisOptions
    plan: Any  # SynthesisPlan
    seed: int
    params: SamplingParams
    rules: StopRules
    stream: bool  # token-chunk streaming (else whole sentences)
    gap: np.ndarray  # silence after each sentence


@dataclass
class _Sentences:
    """A whole-file request whose sentences decode side by side: what it has in flight, and the finished
    sentences held until those before them are done (they are voiced in text order)."""

    cap: int  # sentences of this request decoding (or waiting for a slot) at most at once
    order: deque = field(default_factory=deque)  # indices admitted, not yet released to the acoustic stage
    done: dict = field(default_factory=dict)  # index -> its finished acoustic job
    running: int = 0  # admitted, T2S not finished
    held: Any = None  # a featurised sentence waiting for room under ``cap``
    featurised: bool = False  # every sentence was featurised (or one failed)
    error: BaseException | None = None


@dataclass
class _Row:
    request: Request
    sentence: Any  # _Sentence
    prompt: torch.Tensor | None
    voice: Any = None  # SentenceStream (streaming)
    generator: torch.Generator | None = None


# explicit slots (scheduler_slots) may take at most this share of the free device memory: the rest is for the
# prefill and acoustic activations, the graphs and the allocator's slack
EXPLICIT_FRACTION = 0.9


class PoolAllocationError(BusyError):
    """The decoding slots of a model set could not be allocated (the device is out of memory now); this
    request fails (HTTP 503 + Retry-After) and the next one tries again."""


def slot_bytes(dims, context: int, element_size: int) -> int:
    """Device bytes of one decoding slot: its K and V cache rows, the keys it may attend and the token ids
    it has seen (engine.serving.slots.SlotDecoder)."""
    return 2 * dims.n_layer * context * dims.hidden_dim * element_size + context + dims.vocab_size


def slots_that_fit(free: int, per_slot: int, fraction: float) -> int:
    """The most slots of ``per_slot`` bytes in ``fraction`` of ``free`` bytes (0 when not even one)."""
    return max(0, int(free * fraction) // per_slot)


def device_free_memory(device: torch.device) -> int | None:
    """Free bytes of an accelerator (CUDA); None where the slot pool is not bounded by device memory."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def auto_slots(model: torch.nn.Module, context: int, fraction: float) -> int:
    p = next(model.parameters())
    free = device_free_memory(p.device)
    if free is None:
        return CPU_SLOTS
    per_slot = slot_bytes(model.dims, context, p.element_size())
    return max(1, min(MAX_CUDA_SLOTS, slots_that_fit(free, per_slot, fraction)))


def fitted_slots(model: torch.nn.Module, requested: int, context: int, fraction: float = EXPLICIT_FRACTION) -> int:
    """``requested`` slots, or the most that fit the free device memory with a warning when fewer do (an H100
    asked for 1,100 slots sized for a 141 GB card failed its allocation at every request)."""
    p = next(model.parameters())
    free = device_free_memory(p.device)
    if free is None:
        return requested
    per_slot = slot_bytes(model.dims, context, p.element_size())
    fit = slots_that_fit(free, per_slot, fraction)
    if requested <= fit:
        return requested
    log.warning("scheduler_slots = %d does not fit %s: %d slots of %.1f MiB need %.1f GiB, %.1f GiB are free; "
                "using %d slots, the most that fit (%.0f%% of the free memory); lower scheduler_slots (--slots) "
                "to silence this", requested, p.device, requested, per_slot / 2**20, requested * per_slot / 2**30,
                free / 2**30, max(1, fit), 100 * fraction)
    return max(1, fit)


class Scheduler(AcousticRounds):
    """Owns the decoding of one model set on one device; see the module docstring."""

    def __init__(self, models, config: SchedulerConfig = SchedulerConfig(), gate: DeviceGate | None = None,
                 on_event: Callable[[str, int], None] | None = None, fallback=None) -> None:
        self.models, self.config = models, config
        self.gate = gate if gate is not None else DeviceGate()  # shared with every device user of the engine
        # ("rebuild" | "graphs_captured" | "acoustic_graphs_captured" | "acoustic_failure", count) for metrics
        self._on_event = on_event
        self.fallback = fallback  # engine.runtime.DeviceFallback: T2S steps the device cannot run move to the CPU
        slots = (fitted_slots(models.t2s, config.slots, config.context) if config.slots
                 else auto_slots(models.t2s, config.context, config.memory_fraction))
        self.slots = slots
        self.decoder = self._allocate()
        self.tracker = ChunkTracker(slots, config.context, models.mute_similarity)
        self.state = "ok"  # "rebuilding" after a failed step, "failed" when the device could not be rebuilt
        self.rebuilds = 0
        self._capture_wanted = False  # capture_graphs() asked the loop to capture every bucket
        self._captured = threading.Event()
        self.eos = models.t2s.dims.eos
        self._rows: list[_Row | None] = [None] * slots
        self._n = 0  # rows [0, n) are occupied
        self._idx = np.zeros(slots, dtype=np.int64)  # official step index of each row's next sample
        self._limit = np.zeros(slots, dtype=np.int64)  # last allowed step index + 1
        self._early = np.full(slots, -1, dtype=np.int64)  # early_stop_num (-1: off)
        self._length = np.zeros(slots, dtype=np.int64)  # positions a row attends (prefix + tokens)
        self._arrivals: deque[tuple[Request, Any]] = deque()
        self._arrivals_since: float | None = None  # when the arrivals now waiting began to wait (prefill_wait_s)
        # a prefill costs hundreds of launches whatever its rows, each a chance for other threads to take the GIL:
        # under load, arrivals wait a little to share one (engine figures in docs/benchmarks.md, issue 31)
        self.prefill_wait_s = config.prefill_wait_s if models.device.type == "cuda" else 0.0
        self._active: set[Request] = set()  # admitted, T2S not finished
        self._parallel: dict[Request, _Sentences] = {}  # whole-file requests decoding sentences side by side
        self._cancelled: set[Request] = set()
        self._cv = threading.Condition()
        self._text = ThreadPoolExecutor(max_workers=1, thread_name_prefix="text")
        self._acoustic: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._retired = False  # retire(): admit nothing new, close when the last request is done
        self._durations: deque[float] = deque(maxlen=64)
        self._threads: list[threading.Thread] = []
        # float32 on the CPU voices chunk by chunk, so a request's audio is exactly what it is alone
        self.batch_acoustic = models.device.type == "cuda"
        # CUDA: a round's kernels are queued before the previous round's audio is delivered (its copy to the host,
        # the chunks' peaks, the pieces to their requests), so the device is not idle during that host work
        self.pipeline_rounds = models.device.type == "cuda" and config.acoustic_pipeline
        # CPU: the decode loop and the acoustic thread release their OpenMP teams before they wait (a lone request's
        # stages keep libgomp's full spin) and fit their thread counts to the free cores (engine.openmp)
        self.cpu_teams = models.device.type == "cpu"
        self._fitted = -math.inf  # when the decode loop last fitted its thread count
        self.acoustic_graphs = self._make_acoustic_graphs()
        self._acoustic_captured = threading.Event()
        self.steps = 0  # decode steps run (for benchmarks)
        self.tokens = 0  # tokens decoded
        self.t2s_seconds = 0.0  # time in decode steps (host and device)
        self.prefill_seconds = 0.0  # time in prefills of arrivals (host and device)
        self.prefills = 0
        self.prefill_rows = 0  # sentences prefilled
        self.prefill_setup_seconds = 0.0  # of prefill_seconds: the rows' host set-up before the device prefill
        self.gate_wait_seconds = 0.0  # of the prefills' and steps' time: waiting for a graph capture to end
        self.acoustic_seconds = 0.0  # time in acoustic rounds
        self.acoustic_rounds = 0
        self.acoustic_chunks = 0
        self.acoustic_overlapped = 0  # rounds queued while the previous one's audio was still on its way
        # (submit -> first token chunk due, due -> its audio ready) seconds of recent requests, and their sums
        self.first_chunk_parts: deque[tuple[float, float]] = deque(maxlen=4096)
        self._first_chunk_sums = [0, 0.0, 0.0]  # requests, seconds to the first chunk due, due to its audio
        # time integrals of how many requests were admitted (T2S unfinished), sentences decoding in rows, sentences
        # waiting for a prefill, acoustic jobs queued: over an interval, their deltas / its length are the mean
        # occupancy of each place (Little's law says where requests wait); summed at each decode-loop turn
        self.occupancy = dict.fromkeys(("admitted", "decoding", "prefill_queue", "acoustic_queue"), 0.0)
        self._occupied: tuple[float, tuple[int, int, int, int]] | None = None

    def _allocate(self) -> SlotDecoder:
        """The first slot pool; PoolAllocationError (503, retry) when the device cannot hold it now."""
        try:
            return self._make_decoder()
        except torch.OutOfMemoryError as e:
            if self.models.device.type == "cuda":
                torch.cuda.empty_cache()  # what the failed allocation left cached goes back
            per_slot = slot_bytes(self.models.t2s.dims, self.config.context,
                                  next(self.models.t2s.parameters()).element_size())
            raise PoolAllocationError(
                f"the decoding slots of this model set could not be allocated ({self.slots} slots, "
                f"{self.slots * per_slot / 2**30:.1f} GiB: {str(e).splitlines()[0][:200]}); retry in a moment, or "
                "lower scheduler_slots (--slots) or scheduler_context", retry_after=5.0) from e

    def _make_decoder(self) -> SlotDecoder:
        return SlotDecoder(self.models.t2s, self.slots, self.config.context,
                           prefill_graphs=None if self.config.prefill_graphs else False)

    def _make_acoustic_graphs(self):
        """The CUDA graphs of the batched chunk decodes (engine.acoustic.streaming.AcousticGraphs), or None."""
        c, m = self.config, self.models
        if not (m.device.type == "cuda" and c.acoustic_buckets and c.acoustic_graphs and not m.uses_vocoder):
            return None
        from engine.acoustic.streaming import AcousticGraphs

        return AcousticGraphs(m.sovits, compile=c.acoustic_compile)

    def _event(self, name: str, count: int = 1) -> None:
        if self._on_event is not None and count:
            self._on_event(name, count)

    # ---- public ---------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        """Admit a request (its first sentence is featurised) or raise BusyError."""
        with self._cv:
            if self._closed or self._retired:
                raise SchedulerClosedError("the scheduler is shut down")
            if self.state == "failed":
                raise DeviceFailedError("the device failed and its decoding state could not be rebuilt; the "
                                        "server must be restarted (see its log)")
            if len(self._active) >= self.slots + self.config.queue:
                wait = self.typical_seconds
                raise BusyError(f"the server is busy: all {self.slots} decoding slots are taken and "
                                f"{self.config.queue} requests are waiting; retry in {wait:.0f} s", retry_after=wait)
            request.on_cancel = self._on_cancel
            request.on_first_voiced = self._first_voiced
            self._active.add(request)
            self._arrivals.append((request, request.first))
            parallel = self._decodes_in_parallel(request)
            if parallel:
                self._parallel[request] = _Sentences(cap=max(1, min(PARALLEL_SENTENCES, self.slots // 2)),
                                                     order=deque([request.first.index]), running=1)
            self._start()
            self._cv.notify_all()
        if parallel:
            request.next_sentence(request.first.index, lambda s, e: self._more_sentences(request, s, e))

    @staticmethod
    def _decodes_in_parallel(request: Request) -> bool:
        """Whole files (not streams, not fragments) decode their sentences side by side, as the official
        ``parallel_infer`` batches them: the caller waits for all of them anyway. A sentence's numbers do not
        depend on its neighbours (its own noise keys; masked rows), so this changes the wait, not the audio."""
        ctx: Context = request.context
        return not ctx.stream and ctx.plan.parallel_infer and not ctx.plan.return_fragment and len(request.texts) > 1

    def _more_sentences(self, request: Request, sentence: Any, error: BaseException | None) -> None:
        """The next sentence of a parallel whole-file request is featurised (None: there are no more): it
        joins the arrivals while the request has room under its cap, else it is held until a row ends."""
        with self._cv:
            st = self._parallel.get(request)
            if st is None:  # the request ended meanwhile (failed, cancelled)
                return
            if sentence is None or request.cancelled:
                st.featurised, st.error = True, error
                self._end_parallel_locked(request, st)
                return
            if st.running >= st.cap:
                st.held = sentence
                return
            self._admit_locked(request, st, sentence)
        request.next_sentence(sentence.index, lambda s, e: self._more_sentences(request, s, e))

    def _admit_locked(self, request: Request, st: _Sentences, sentence: Any) -> None:
        st.order.append(sentence.index)
        st.running += 1
        self._arrivals.append((request, sentence))
        self._cv.notify_all()

    def _end_parallel_locked(self, request: Request, st: _Sentences) -> None:
        """Release the finished sentences in text order; after the last, end the request's T2S work."""
        while st.order and st.order[0] in st.done:
            self._acoustic.put(st.done.pop(st.order.popleft()))
        if st.featurised and not st.running:
            del self._parallel[request]
            self._active.discard(request)
            self._durations.append(time.monotonic() - request.started)
            self._acoustic.put(("end", request, None, st.error, None))

    def _sentence_done_in_parallel(self, request: Request, sentence: Any, job: tuple) -> None:
        held = None
        with self._cv:
            st = self._parallel.get(request)
            if st is None:
                return
            st.done[sentence.index] = job
            st.running -= 1
            if st.held is not None and not request.cancelled:
                held, st.held = st.held, None
                self._admit_locked(request, st, held)
            self._end_parallel_locked(request, st)
        if held is not None:
            request.next_sentence(held.index, lambda s, e: self._more_sentences(request, s, e))

    def capture_graphs(self, timeout: float | None = None) -> int:
        """Capture the decode-step graph of every batch bucket now, and the prefill graph of every bucket up to
        engine.serving.slots.PREFILL_WARM_WIDTH positions, on the decode loop at its next quiet moment and with
        the device to itself (engine.serving.gate), and the acoustic graphs (every voicing
        shape, the encoder shapes of prefixes up to 512 frames and 128 phones, and those the acoustic stage has
        met: warm-up's requests) on its own thread under the gate; warm-up calls it before a server says it is
        ready, so that serving captures only rarer shapes it meets later (one before a round). Returns the
        number of graphs captured (0 off CUDA)."""
        before = self.decoder.captures + self.decoder.prefill_captures + self._acoustic_graph_count()
        with self._cv:
            if self._closed:
                return 0
            self._start()
            if self.decoder.uncaptured() or self.decoder.uncaptured_prefills():
                self._captured.clear()
                self._capture_wanted = True
                self._cv.notify_all()
            else:
                self._captured.set()
        self._captured.wait(timeout)
        if self.acoustic_graphs is not None:
            self._acoustic_captured.clear()
            self._acoustic.put(CAPTURE)
            self._acoustic_captured.wait(timeout)
        return self.decoder.captures + self.decoder.prefill_captures + self._acoustic_graph_count() - before

    def _acoustic_graph_count(self) -> int:
        return self.acoustic_graphs.captures if self.acoustic_graphs is not None else 0

    @property
    def text_executor(self) -> ThreadPoolExecutor:
        """Where requests featurise their later sentences (off the decode loop)."""
        return self._text

    @property
    def load(self) -> dict[str, int]:
        """``queued``: requests that have not started decoding; ``waiting``: sentences waiting for a slot
        (queued requests' first sentences and running requests' next ones)."""
        with self._cv:
            waiting, queued = len(self._arrivals), len(self._queued_locked())
        return {"slots": self.slots, "decoding": self._n, "waiting": waiting, "queued": queued,
                "requests": len(self._active)}

    def drain(self, reason: str = "the server is shutting down; retry in a moment") -> int:
        """Fail the queued requests (none of their audio made yet) with BusyError(reason); requests already
        decoding run to their end. Admission stays the caller's business (a draining server admits nothing
        new; a scheduler may be shared with other front doors). Returns the number of requests failed."""
        with self._cv:
            queued = self._queued_locked()
            for item in queued:
                self._arrivals.remove(item)
                self._active.discard(item[0])
        for request, _ in queued:
            request.finish(BusyError(reason))
        return len(queued)

    def _queued_locked(self) -> list[tuple[Request, Any]]:
        """Arrivals of requests that have not started: their first sentence, nothing voiced yet."""
        return [(r, s) for r, s in self._arrivals if s is r.first and r.first_due is None]

    @property
    def kv_bytes(self) -> int:
        """Device bytes of the slot pool's KV cache (what closing this scheduler releases)."""
        return self.decoder.k.numel() * self.decoder.k.element_size() * 2

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def typical_seconds(self) -> float:
        """How long a request took here lately (at least 1 s): the Retry-After of a busy answer."""
        with self._cv:
            return max(1.0, float(np.mean(self._durations))) if self._durations else 1.0

    @property
    def idle(self) -> bool:
        """No request admitted (none decoding, queued or still being voiced)."""
        with self._cv:
            return not self._active and not self._n

    def close_if_idle(self, wait: bool = True) -> bool:
        """Close this scheduler only if no request is admitted, atomically with admission: a request that
        comes after gets SchedulerClosedError (its cloner then asks for the model set's new scheduler), never
        a shut-down error mid-decode. True when it was closed (or was already). ``wait``: until its threads
        have ended (else call :meth:`join` later, e.g. outside the caller's lock)."""
        with self._cv:
            if self._closed:
                return True
            if self._active or self._n:
                return False
            self._closed = True
            self._cv.notify_all()
            self._acoustic.put(None)  # after every job queued so far: the acoustic stage voices those first
        if wait:
            self.join()
        return True

    def retire(self) -> None:
        """Admit nothing new (SchedulerClosedError) and close once the requests in flight are done (the
        model set was reloaded: a new scheduler serves it; the engine closes it when it finds it idle)."""
        with self._cv:
            self._retired = True

    def close(self) -> None:
        with self._cv:
            already = self._closed
            self._closed = True
            self._cv.notify_all()
        if not already:
            self._acoustic.put(None)
        self.join()

    def join(self) -> None:
        """Wait (a few seconds at most) for the threads of a closed scheduler to end."""
        for t in self._threads:
            t.join(timeout=5)
        self._text.shutdown(wait=False, cancel_futures=True)

    # ---- threads --------------------------------------------------------------------------------
    def _start(self) -> None:
        if self._threads:
            return
        if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:  # process-wide; only ever lowered
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        for name, target in (("t2s-loop", self._loop), ("acoustic", self._acoustic_loop)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _first_voiced(self, request: Request) -> None:
        due = request.first_due if request.first_due is not None else request.first_voiced
        self.first_chunk_parts.append((due - request.started, request.first_voiced - due))
        sums = self._first_chunk_sums
        sums[0], sums[1], sums[2] = sums[0] + 1, sums[1] + due - request.started, sums[2] + request.first_voiced - due

    def work(self) -> dict[str, float]:
        """What this scheduler has done (monotonic counts and busy seconds): for metrics and benchmarks, where
        the deltas over a time say how the stages share it (decode steps and rows per step, acoustic rounds and
        chunks per round, a first chunk's wait for its tokens and then for its audio)."""
        first = self._first_chunk_sums
        return {"decode_steps": self.steps, "tokens": self.tokens, "prefills": self.prefills,
                "prefill_rows": self.prefill_rows,
                "decode_seconds": self.t2s_seconds, "prefill_seconds": self.prefill_seconds,
                "prefill_setup_seconds": self.prefill_setup_seconds,
                "gate_wait_seconds": self.gate_wait_seconds,
                "acoustic_rounds": self.acoustic_rounds, "acoustic_chunks": self.acoustic_chunks,
                "acoustic_overlapped": self.acoustic_overlapped, "acoustic_seconds": self.acoustic_seconds,
                "first_chunks": first[0], "first_chunk_tokens_seconds": first[1], "first_chunk_audio_seconds": first[2],
                **{f"{place}_occupancy_seconds": v for place, v in self.occupancy.items()}}

    def _on_cancel(self, request: Request) -> None:
        with self._cv:
            self._cancelled.add(request)
            self._cv.notify_all()

    def _loop(self) -> None:
        if self.models.device.type == "cuda":  # decode steps go first on the GPU; vocoding fills the gaps
            with torch.cuda.stream(torch.cuda.Stream(self.models.device, priority=-1)):
                self._decode_loop()
        else:
            self._decode_loop()

    def _nothing_to_do(self) -> bool:
        """The decode loop waits: no row, arrival, cancellation or capture (read under ``_cv``, or as a hint)."""
        return (not self._closed and not self._n and not self._arrivals and not self._cancelled
                and not self._capture_wanted and not self.decoder.missing)

    def _count_occupancy(self) -> None:
        """Add the time since the last turn times what was in each place then (read without the lock: hints)."""
        now = time.perf_counter()
        if self._occupied is not None:
            dt = now - self._occupied[0]
            for place, count in zip(self.occupancy, self._occupied[1]):
                self.occupancy[place] += dt * count
        self._occupied = (now, (len(self._active), self._n, len(self._arrivals), self._acoustic.qsize()))

    def _decode_loop(self) -> None:
        while True:
            self._count_occupancy()
            if self.cpu_teams and self._nothing_to_do():  # only this thread empties the rows: a safe hint
                release_team()  # the next stage's thread finds no idle team of ours (engine.openmp)
                self._fitted = -math.inf  # the next busy spell fits its thread count first
            with self._cv:
                while self._nothing_to_do():
                    self._cv.wait()
                self._count_occupancy()  # the wait, with what was there before it
                if self._closed:
                    break
                cancelled, self._cancelled = self._cancelled, set()
                arrivals = self._take_arrivals()
            if self.cpu_teams and time.monotonic() - self._fitted >= FIT_INTERVAL_S:
                fit_threads()
                self._fitted = time.monotonic()
            try:
                self._drop(cancelled)
                if arrivals:
                    t0 = time.perf_counter()
                    with self.gate.work():
                        self.gate_wait_seconds += time.perf_counter() - t0  # a graph capture held the device
                        self._prefill(arrivals)
                    self.prefill_seconds += time.perf_counter() - t0
                    self.prefills += 1
                    self.prefill_rows += len(arrivals)
                    arrivals = []
                    if self.decoder.prefill_missing:
                        self._capture_prefills()
                if self._n:
                    t0 = time.perf_counter()
                    with self.gate.work():
                        self.gate_wait_seconds += time.perf_counter() - t0
                        self._decode_step()
                    self.t2s_seconds += time.perf_counter() - t0
                elif not self._arrivals and (self._capture_wanted or self.decoder.missing):
                    self._capture_quietly()
            except Exception as e:
                self._recover(e, arrivals)
        self._captured.set()
        self._fail_all(EngineError("the scheduler was shut down"))

    def _capture_quietly(self) -> None:
        """No row decodes: capture the missing graphs (all of them when capture_graphs asked) while every
        other device user of the engine waits (the gate's exclusive section)."""
        try:
            buckets = self.decoder.uncaptured() if self._capture_wanted else sorted(self.decoder.missing)
            with self.gate.capture():
                done = self.decoder.capture(buckets)
            self._event("graphs_captured", done)
            if self._capture_wanted:
                self._capture_prefills(self.decoder.uncaptured_prefills())
        finally:
            self._capture_wanted = False
            self._captured.set()

    def _capture_prefills(self, buckets: list[tuple[int, int]] | None = None) -> None:
        """Capture prefill buckets (engine.serving.slots; default: those just met without a graph) with the device
        to this thread (the gate's exclusive section: the acoustic thread and the front end wait, and the rows
        decoding here wait for about one eager prefill a bucket). A capture that fails leaves this pool's
        prefills eager."""
        buckets = sorted(self.decoder.prefill_missing) if buckets is None else buckets
        try:
            with self.gate.capture():
                done = self.decoder.capture_prefills(buckets)
        except Exception as e:  # noqa: BLE001 - the prefills still run eagerly
            log.warning("capturing the prefill of %s failed (%s: %s); prefills run eagerly", buckets,
                        type(e).__name__, e)
            self.decoder.prefill_graphs = False
            self.decoder.prefill_missing.clear()
            return
        self._event("prefill_graphs_captured", done)

    def _recover(self, error: BaseException, arrivals: list[tuple[Request, Any]]) -> None:
        """A prefill, decode step or capture failed: fail the requests that were in it (their rows and the
        arrivals being prefilled) with a retryable error, rebuild the decoding state on the device, and go on
        with the queued requests. ``state`` is "rebuilding" meanwhile (``/health`` says "degraded"); when
        the device cannot even run a probe, "failed", and every request fails."""
        log.error("decode step failed; rebuilding the decoding state", exc_info=error)
        self.state = "rebuilding"
        self.rebuilds += 1
        self._event("rebuild")
        failed = {r.request for r in self._rows[: self._n] if r is not None} | {req for req, _ in arrivals}
        for i in range(len(self._rows)):
            self._rows[i] = None
        self._n = 0
        with self._cv:
            for request in failed:
                self._active.discard(request)
                self._parallel.pop(request, None)
        for request in failed:
            failure = StepFailedError("the decoding step this request was in failed on the device; the engine "
                                      "rebuilt its state: send the request again", retry_after=1.0)
            failure.__context__ = error  # for tracebacks in process; clients see only the message
            request.finish(failure)
        try:
            with self.gate.capture():  # nothing else on the device while its memory is given back and retaken
                self.decoder.release()  # free the KV pool before the new one is allocated (unusable after)
                if self.models.device.type == "cuda":
                    torch.cuda.empty_cache()
                self.decoder = self._make_decoder()
                self.tracker = ChunkTracker(self.slots, self.config.context, self.models.mute_similarity)
                probe = torch.ones(1, device=self.models.device)
                if float((probe + probe).sum().item()) != 2.0:
                    raise RuntimeError("the device computed 1 + 1 wrongly")
            self.state = "ok"
            log.warning("decoding state rebuilt (%d rebuilds so far); serving again", self.rebuilds)
        except Exception:
            log.exception("the decoding state could not be rebuilt: the device is unusable, restart the server")
            self.state = "failed"
            self._fail_all(DeviceFailedError("the device failed and its decoding state could not be rebuilt; the "
                                             "server must be restarted (see its log)"))

    def _take_arrivals(self) -> list[tuple[Request, Any]]:
        if not self._arrivals:
            self._arrivals_since = None
            return []
        now = time.monotonic()
        if self._arrivals_since is None:
            self._arrivals_since = now
        if self._n and len(self._arrivals) < PREFILL_BATCH and now - self._arrivals_since < self.prefill_wait_s:
            return []  # rows decode meanwhile; these join the next prefill, with whoever arrives by then
        free = self.slots - self._n
        out: list[tuple[Request, Any]] = []
        width = 0
        while self._arrivals and len(out) < free:
            request, sentence = self._arrivals[0]
            if request.cancelled or request.finished:  # cancelled (dropped elsewhere), or failed meanwhile
                self._arrivals.popleft()
                if request.finished:
                    self._active.discard(request)
                    self._parallel.pop(request, None)
                continue
            ref = request.context.ref
            w = len(sentence.phones) + len(ref.prompt_phones) + (
                ref.prompt_semantic.numel() if ref.prompt_semantic is not None else 0)
            if out and (len(out) + 1) * max(width, w) > PREFILL_TOKENS:
                break
            width = max(width, w)
            out.append(self._arrivals.popleft())
        if not self._arrivals:
            self._arrivals_since = None  # (those left for lack of room keep their time: taken at the next turn)
        return out

    # ---- T2S ------------------------------------------------------------------------------------
    def _prefill(self, arrivals: list[tuple[Request, Any]]) -> None:
        t0 = time.perf_counter()
        rows, inputs, prompts, params, min_steps, keys = [], [], [], [], [], []
        for request, sentence in arrivals:
            ctx: Context = request.context
            row = self._n + len(rows)
            prompt = ctx.ref.prompt_semantic
            item = ctx.cloner._t2s_input(sentence, ctx.ref)
            prefix = item.phones.shape[0] + (prompt.numel() if prompt is not None else 0)
            if prefix + 2 > self.decoder.capacity:  # this request fails alone, before it takes a slot
                with self._cv:
                    self._active.discard(request)
                    self._parallel.pop(request, None)
                request.finish(EngineError(
                    f"sentence {sentence.index}: its phones and the reference prompt need {prefix} positions but a "
                    f"decoding slot holds {self.decoder.capacity} (scheduler_context): shorten the sentence or the "
                    "reference clip, or raise scheduler_context"))
                continue
            self._rows[row] = _Row(request, sentence, prompt)
            room = self.decoder.capacity - prefix - 1
            rules = ctx.rules
            limit = min(rules.max_steps, room)
            if limit < rules.max_steps and (rules.early_stop_num == -1 or rules.early_stop_num + 1 > limit):
                log.warning("sentence %d: at most %d tokens fit a slot (context %d); it may be cut short",
                            sentence.index, limit, self.decoder.capacity)
            self._idx[row], self._limit[row], self._early[row] = 0, limit, rules.early_stop_num
            self._length[row] = prefix
            mode = (ChunkTracker.WHOLE if not ctx.stream else
                    ChunkTracker.FIXED if ctx.options.fixed_length_chunk else ChunkTracker.MUTE)
            self.tracker.start(row, mode, ctx.options.min_chunk_length)
            rows.append(row)
            inputs.append(item)
            prompts.append(prompt)
            params.append(ctx.params)
            min_steps.append(rules.min_steps)
            keys.append(stream_key(ctx.seed, sentence.index))
            if ctx.stream:
                gen = torch.Generator(device=self.models.device).manual_seed(stream_key(ctx.seed, sentence.index))
                self._rows[row].generator = gen
                self._rows[row].voice = ctx.cloner.sentence_stream(sentence.phones, ctx.ref, ctx.options, gen)
            nxt = sentence.index + 1
            if nxt < len(request.texts):
                request.feature(nxt)  # featurise ahead while this one decodes
        self.prefill_setup_seconds += time.perf_counter() - t0
        if not rows:
            return
        if self.decoder.device.type == "cuda":
            toks, args = self._t2s(lambda: self.decoder.prefill(rows, inputs, prompts, params, min_steps, keys))
        else:  # one by one: no padding, so a row's numbers do not depend on its neighbours
            out = [self._t2s(lambda: self.decoder.prefill([r], [i], [p], [s], [m], [k]))
                   for r, i, p, s, m, k in zip(rows, inputs, prompts, params, min_steps, keys)]
            toks, args = np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])
        self._n += len(rows)
        self._absorb(np.array(rows, dtype=np.int64), toks, args)

    def _decode_step(self) -> None:
        n = self._n
        self.decoder.window = int(math.ceil((self._length[:n].max() + 2) / 64) * 64)
        toks, args = self._t2s(lambda: self.decoder.step(n))
        self.steps += 1
        self._absorb(np.arange(n, dtype=np.int64), toks, args)

    def _t2s(self, call):
        """A prefill or decode step through the device fallback: when the device lacks one of its operators
        (MPS), this model set's slot pool moves to the CPU with its KV cache (logged once, counted in
        /metrics) and the step runs again there; a failed step leaves only rewritable state behind."""
        moved = self.decoder.model is not self.models.t2s  # the pool runs on a CPU copy already
        try:
            out = call()
        except (NotImplementedError, RuntimeError, TypeError) as err:
            if moved or self.fallback is None or not self.fallback.moves_to_cpu(T2S_STAGE, self.decoder.device, err):
                raise
            log.warning("the scheduler of %s moves its %d slots (KV cache included) to the CPU", self.models.id,
                        self.slots)
            self.decoder.to_cpu(self.fallback.cpu_model(self.models.t2s))
            return call()
        if moved:
            self.fallback.count(T2S_STAGE)  # a step of a moved pool
        return out

    def _absorb(self, rows: np.ndarray, toks: np.ndarray, args: np.ndarray) -> None:
        """Apply the official stop rules to one sampled token per row; hand out due chunks; free stopped rows."""
        self.tokens += rows.size
        idx = self._idx[rows]
        eos = (toks == self.eos) | (args == self.eos)
        early = (self._early[rows] != -1) & (idx + 1 > self._early[rows])
        capped = idx >= self._limit[rows] - 1
        keep = ~eos
        for row, chunk in self.tracker.push(rows[keep], toks[keep]):
            self._voice(row, chunk, final=False)
        self._idx[rows] += 1
        self._length[rows] += 1
        ended = eos | early | capped
        freed = []
        for row, is_eos, is_early, step in zip(rows[ended].tolist(), eos[ended].tolist(), early[ended].tolist(),
                                               idx[ended].tolist()):
            self._end_row(row, "eos" if is_eos else "early_stop" if is_early else "max_steps", step)
            freed.append(row)
        if freed:
            self._compact(freed)

    def _end_row(self, row: int, stop: str, step: int) -> None:
        r = self._rows[row]
        due, final = self.tracker.finish(row, eos=stop == "eos")
        for _, chunk in due:
            self._voice(row, chunk, final=False)
        kept = self.tracker.tokens[row, : self.tracker.n[row]].tolist()
        out = naive_output(r.prompt, kept, step, stop)
        request, sentence = r.request, r.sentence
        # read without the lock: while a row of the request lives, only this thread removes its entry
        if request in self._parallel:
            self._rows[row] = None
            self._sentence_done_in_parallel(request, sentence, ("whole", request, sentence, out, None))
            return
        if request.context.stream:
            if not kept:
                final = [int(t) for t in out.tokens.tolist()]  # the official "bad zero prediction"
            self._voice(row, final, final=True)
        else:
            self._acoustic.put(("whole", request, sentence, out, None))
        self._rows[row] = None
        request.next_sentence(sentence.index, lambda s, e: self._sentence_ready(request, s, e))

    def _voice(self, row: int, chunk: list[int] | None, final: bool) -> None:
        r = self._rows[row]
        if r.request.first_due is None:
            r.request.first_due = time.monotonic()
        self._acoustic.put(("chunk", r.request, r.sentence, (chunk, final), r.voice))

    def _sentence_ready(self, request: Request, sentence: Any, error: BaseException | None) -> None:
        """The request's next sentence is featurised (None: the request has no more T2S work)."""
        with self._cv:
            if sentence is not None and not request.cancelled:
                self._arrivals.appendleft((request, sentence))  # a running request goes first
                self._cv.notify_all()
                return
            self._active.discard(request)
            self._durations.append(time.monotonic() - request.started)
            # queued before the request stops counting as admitted: a close that finds the scheduler idle puts
            # its stop after this, and the acoustic stage finishes what came before its stop
            self._acoustic.put(("end", request, None, error, None))

    def _compact(self, freed: list[int]) -> None:
        """Keep the occupied rows at [0, n): move the highest rows down into the holes."""
        holes = sorted(freed)
        for h in holes:
            self.decoder.clear(h)
        while holes:
            top = self._n - 1
            if self._rows[top] is None:
                self._n -= 1
                if holes and holes[-1] == top:
                    holes.pop()
                continue
            h = holes.pop(0)
            if h >= top:
                continue
            self.decoder.move(top, h)
            self.tracker.move(top, h)
            for a in (self._idx, self._limit, self._early, self._length):
                a[h] = a[top]
            self._rows[h], self._rows[top] = self._rows[top], None
            self._n -= 1
        while self._n and self._rows[self._n - 1] is None:
            self._n -= 1

    def _drop(self, cancelled: set[Request]) -> None:
        if not cancelled:
            return
        rows = [i for i in range(self._n) if self._rows[i] is not None and self._rows[i].request in cancelled]
        for i in rows:
            self._rows[i] = None
        if rows:
            self._compact(rows)
        with self._cv:
            for request in cancelled:
                self._active.discard(request)
                self._parallel.pop(request, None)

    def _fail_all(self, error: BaseException) -> None:
        requests = {r.request for r in self._rows[: self._n] if r is not None}
        with self._cv:
            requests |= {req for req, _ in self._arrivals}
            self._arrivals.clear()
            self._parallel.clear()
            for request in requests:
                self._active.discard(request)
        for i in range(self._n):
            self._rows[i] = None
            self.decoder.clear(i)
        self._n = 0
        for request in requests:
            request.finish(error)

def naive_output(prompt: torch.Tensor | None, kept: list[int], step: int, stop: str) -> T2SOutput:
    """The official naive loop's result for a row: ``kept`` tokens (EOS excluded), stopped at ``step``."""
    head = prompt.detach().long().view(-1).cpu() if prompt is not None else torch.zeros(0, dtype=torch.long)
    seq = torch.cat([head, torch.tensor(kept, dtype=torch.long)])
    if seq.numel() == 0:
        seq = torch.zeros(1, dtype=torch.long)  # official "bad zero prediction"
    steps = 0 if prompt is None else step
    return T2SOutput(tokens=seq if steps == 0 else seq[-steps:], steps=steps, stop=stop, sequence=seq)
