"""The acoustic stage of the serving scheduler (engine.serving.scheduler): one thread voices the jobs the decode
loop hands it (token chunks of streams, whole sentences) in rounds, each round's streamed chunks and whole
sentences decoded as one bucketed batch on CUDA (through the acoustic CUDA graphs, captured under the device gate).

On CUDA the rounds are pipelined (``acoustic_pipeline``): round N+1's kernels are queued before round N's audio is
delivered (its copy to the host, the SOLA cuts, peaks, pieces to their requests), so the device does not wait for
that host work. A request has one job in a round and its rounds are delivered in order, so its pieces keep their
order and numbers.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.profiler import record_function

from engine.openmp import fit_threads, release_team
from engine.runtime import conv_backend
from engine.serving.requests import Piece, Request
from engine.serving.sampling import stream_key
from engine.t2s.decoding import T2SOutput

log = logging.getLogger(__name__)

MAX_ACOUSTIC_BATCH = 128  # streaming chunks decoded together (CUDA)
# acoustic graphs captured before a round at most (each pauses every device user for ~0.1-0.2 s while serving)
ACOUSTIC_CAPTURES_PER_ROUND = 1
CAPTURE = ("capture",)  # on the acoustic queue: capture every acoustic graph wanted (capture_graphs)


@dataclass(frozen=True)
class _Launched:
    """An acoustic round queued on the device: its batched jobs, whose audio ``delivery`` brings to the host
    (engine.acoustic.delivery.Delivery, None when nothing was batched), and its other jobs (``rest``)."""

    chunks: list
    wholes: list
    delivery: Any
    rest: list



class AcousticRounds:
    """The scheduler's acoustic thread (a mixin of :class:`engine.serving.scheduler.Scheduler`, whose state it
    uses: ``models``, ``config``, ``gate``, ``_acoustic`` (the job queue), ``acoustic_graphs``, the counters)."""

    def _acoustic_loop(self) -> None:
        """Voice the jobs in rounds: each round takes the oldest job of every request (a request's jobs
        stay in order); on CUDA its streaming chunks are decoded as one batch."""
        stream = torch.cuda.Stream(self.models.device) if self.models.device.type == "cuda" else None
        pending: deque = deque()
        stopping = False  # close() was seen: voice the jobs queued before it, then stop
        in_flight: _Launched | None = None  # the round whose kernels run while the next one is queued
        while True:
            if in_flight is not None and not pending and self._acoustic.empty():
                self._settle(in_flight, stream)  # nothing to queue behind it: deliver it now
                in_flight = None
            if not pending:
                if stopping:
                    return
                if self.cpu_teams and self._acoustic.empty():
                    release_team()  # nothing to voice: this thread's OpenMP team goes while it waits
                pending.append(self._acoustic.get())
            while not stopping:
                try:
                    pending.append(self._acoustic.get_nowait())
                except queue.Empty:
                    break
            if any(job is None for job in pending):
                stopping = True
                before = list(pending)[: next(i for i, job in enumerate(pending) if job is None)]
                pending = deque(job for job in before if job is not CAPTURE)
                if not pending:
                    if in_flight is not None:
                        self._settle(in_flight, stream)
                    return
            if in_flight is not None and (self.acoustic_graphs is not None and self.acoustic_graphs.wanted
                                          or any(job is CAPTURE for job in pending)):
                self._settle(in_flight, stream)  # a capture has the device to itself: nothing of ours in flight
                in_flight = None
            if any(job is CAPTURE for job in pending):  # capture_graphs (warm-up): every voicing shape, the
                pending = deque(job for job in pending if job is not CAPTURE)  # common encoder shapes, those met
                self.acoustic_graphs.want_voices()
                self.acoustic_graphs.want_encoders()
                self._capture_acoustic(stream, None)
                self._acoustic_captured.set()
                if not pending:
                    continue
            elif self.acoustic_graphs is not None and self.acoustic_graphs.wanted:
                self._capture_acoustic(stream, ACOUSTIC_CAPTURES_PER_ROUND)
            taken, pending = _round(pending)
            if self.cpu_teams:
                fit_threads()  # the cores other processes leave free (engine.openmp)
            t0 = time.perf_counter()
            try:
                with self._acoustic_section(stream):
                    launched = self._launch_round(taken)
            except Exception as e:  # the round's requests fail; the worker lives on for the others
                self._round_failed(taken, e)
                launched = None
            if in_flight is not None:  # the previous round's audio, while this round's kernels run
                self.acoustic_overlapped += launched is not None
                self._settle(in_flight, stream)
                in_flight = None
            if launched is not None:
                if self.pipeline_rounds:
                    in_flight = launched
                else:
                    self._settle(launched, stream)
            self.acoustic_seconds += time.perf_counter() - t0
            self.acoustic_rounds += 1
            self.acoustic_chunks += len(taken)

    @contextmanager
    def _acoustic_section(self, stream) -> Iterator[None]:
        """Device work of the acoustic thread: a gate work section, its convolution backend, its stream."""
        with self.gate.work(), conv_backend(self.models.device, self.config.conv_backend), \
                (torch.cuda.stream(stream) if stream is not None else nullcontext()):
            yield

    def _round_failed(self, jobs: list, error: BaseException) -> None:
        log.error("acoustic round failed", exc_info=error)
        self._event("acoustic_failure")
        for _, request, *_ in jobs:
            request.finish(error)
            request.cancel()

    def _capture_acoustic(self, stream, limit: int | None) -> None:
        """Capture acoustic graphs of shapes met eagerly (``limit`` at most), with the device to this thread
        (the gate's exclusive section: decode steps and the front end wait meanwhile)."""
        with self.gate.capture(), conv_backend(self.models.device, self.config.conv_backend), \
                torch.cuda.stream(stream):
            done = self.acoustic_graphs.capture_wanted(limit)
        if done:
            self._event("acoustic_graphs_captured", done)

    def _launch_round(self, jobs: list) -> _Launched:
        """Queue a round's batched decodes on the device (streamed chunks, and whole sentences a SoVITS model voices
        itself) and their audio's copy to the host, without waiting for the device; the round's other jobs (ends,
        jobs voiced alone) are left for :meth:`_settle`, which delivers the audio first. A request has one job in
        a round, so its pieces keep their order."""
        live, rest = [], []
        for job in jobs:
            if job[0] == "end":
                rest.append(job)
            elif not (job[1].cancelled or job[1].finished):
                live.append(job)
        chunks = [j for j in live if j[0] == "chunk" and j[3][0] is not None]
        wholes = [j for j in live if j[0] == "whole" and self._voiced_in_batches(j[1])] if self.batch_acoustic else []
        buckets = self.config.acoustic_buckets
        if not (self.batch_acoustic and (len(chunks) + len(wholes) > 1 or ((chunks or wholes) and buckets))):
            return _Launched([], [], None, rest + live)
        from engine.acoustic.delivery import Delivery
        from engine.acoustic.streaming import voice_together

        batched = {id(j) for j in chunks + wholes}
        rest += [j for j in live if id(j) not in batched]
        try:
            with torch.inference_mode():
                audios = voice_together([j[4] for j in chunks], [j[3] for j in chunks], buckets=buckets,
                                        sentences=self._sentence_rows(wholes), graphs=self.acoustic_graphs,
                                        lazy=True)
                with record_function("acoustic.to_host"):
                    delivery = Delivery(audios, self.models.device)  # one copy, queued
        except Exception as e:
            self._round_failed(chunks + wholes, e)
            return _Launched([], [], None, rest)
        return _Launched(chunks, wholes, delivery, rest)

    def _settle(self, launched: _Launched, stream) -> None:
        """A launched round's audio to its requests (waits for its copy), then the round's other jobs."""
        try:
            with self._acoustic_section(stream):
                self._deliver(launched)
                self._run_rest(launched.rest)
        except Exception as e:  # a device failure while waiting: the round's requests fail, the worker lives on
            self._round_failed(launched.chunks + launched.wholes + launched.rest, e)

    def _deliver(self, launched: _Launched) -> None:
        if launched.delivery is None:
            return
        try:
            with record_function("acoustic.to_host"):
                audios = launched.delivery.wait()
        except Exception as e:
            self._round_failed(launched.chunks + launched.wholes, e)
            return
        with record_function("acoustic.deliver"):  # peak normalisation, pieces to their requests
            for (_, request, sentence, (toks, final), _), audio in zip(launched.chunks, audios):
                self._put_chunk(request, sentence, toks, final, audio)
            for (_, request, sentence, out, _), audio in zip(launched.wholes, audios[len(launched.chunks):]):
                self._put_sentence(request, sentence, out, audio)

    def _run_rest(self, jobs: list) -> None:
        for kind, request, sentence, payload, voice in jobs:
            if kind == "end":
                request.finish(payload)
                continue
            if request.cancelled or request.finished:
                continue
            try:
                self._run_acoustic(kind, request, sentence, payload, voice)
            except Exception as e:
                log.exception("acoustic stage failed")
                self._event("acoustic_failure")
                request.finish(e)
                request.cancel()

    def _put_chunk(self, request: Request, sentence: Any, toks: list[int] | None, final: bool,
                   audio: torch.Tensor | None) -> None:
        from engine.audio import postprocess

        ctx = request.context  # engine.serving.scheduler.Context
        ends = final and not ctx.gap.size
        if audio is not None:
            request.put(Piece(postprocess(audio), sentence, tuple(toks or ()), "speech", ends))
        if final and ctx.gap.size:
            request.put(Piece(ctx.gap, sentence, (), "silence", True))

    def _voiced_in_batches(self, request: Request) -> bool:
        """Whether a whole sentence of ``request`` can join the batched chunk decodes: a SoVITS model that voices
        tokens itself (not v3/v4's CFM + vocoder) at speed 1."""
        ctx = request.context  # engine.serving.scheduler.Context
        return not self.models.uses_vocoder and ctx.options.speed_factor == 1.0

    def _sentence_rows(self, jobs: list) -> list[dict]:
        """The batched-decode rows of whole sentences: the official decode of each one's tokens, noise from the
        generator its request's seed gives the sentence (as when it is voiced alone); the style vector of a
        reference once for all its sentences in the round."""
        from engine.acoustic.streaming import sentence_row

        m, dev = self.models, self.models.device
        styles: dict[int, torch.Tensor] = {}
        rows = []
        for _, request, sentence, out, _ in jobs:
            ctx = request.context  # engine.serving.scheduler.Context
            ge = styles.get(id(ctx.ref))
            if ge is None:
                ge = styles[id(ctx.ref)] = m.sovits.style_vector(
                    list(ctx.ref.specs), list(ctx.ref.sv) if ctx.ref.sv is not None else None)
            gen = torch.Generator(device=dev).manual_seed(stream_key(ctx.seed, sentence.index))
            phones = torch.tensor(sentence.phones, dtype=torch.long)  # host numbers: one copy for the round
            rows.append(sentence_row(m.sovits, out.tokens.cpu(), phones, ge, gen))
        return rows

    def _put_sentence(self, request: Request, sentence: Any, out: T2SOutput, audio: torch.Tensor) -> None:
        from engine.audio import postprocess

        ctx = request.context  # engine.serving.scheduler.Context
        a = postprocess(audio)
        a = np.concatenate([a, ctx.gap]) if ctx.gap.size else a
        request.put(Piece(a, sentence, tuple(int(t) for t in out.tokens.tolist()), "speech", True))

    @torch.inference_mode()
    def _run_acoustic(self, kind: str, request: Request, sentence: Any, payload: Any, voice: Any) -> None:
        ctx = request.context  # engine.serving.scheduler.Context
        if kind == "chunk":
            toks, final = payload
            self._put_chunk(request, sentence, toks, final, voice.tail() if toks is None else voice.voice(toks, final))
            return
        out: T2SOutput = payload
        gen = torch.Generator(device=self.models.device).manual_seed(stream_key(ctx.seed, sentence.index))
        audio = ctx.cloner._acoustic([sentence], [out], ctx.ref, ctx.options, ctx.plan, gen)[0]
        self._put_sentence(request, sentence, out, audio)


def _round(pending: deque) -> tuple[list, deque]:
    """The jobs of one acoustic round: the oldest job of each request (a request's jobs stay in order),
    at most MAX_ACOUSTIC_BATCH, requests still waiting for their first audio first; and the rest."""
    eligible, seen = [], set()
    for i, job in enumerate(pending):
        if id(job[1]) not in seen:
            seen.add(id(job[1]))
            eligible.append(i)
    eligible.sort(key=lambda i: pending[i][1].first_voiced is not None)  # stable: oldest first otherwise
    chosen = set(eligible[:MAX_ACOUSTIC_BATCH])
    taken = [job for i, job in enumerate(pending) if i in chosen]
    return taken, deque(job for i, job in enumerate(pending) if i not in chosen)

