"""One running engine: what every request shares, and who owns it.

:class:`Studio` responsibilities: (1) owns the model pool, the reference cache, the memory guard,
the device gate and one serving scheduler per live model set (bounded, oldest first), (2) serves
requests that each name their own weights (never a global model swap) through a
:class:`~engine.cloner.VoiceCloner`, degrading to the CPU or waiting when memory is short.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch

from engine.cloner import ProgressCallback, ReferenceBatches, VoiceCloner
from engine.loading.model_pool import ModelPool, Models, WeightSet
from engine.memory import (
    ORDER_IDLE_MODELS,
    ORDER_REFERENCE_CACHE,
    ORDER_SLOTS,
    DegradeStep,
    MemoryGuard,
    MemoryReader,
    system_memory_reader,
)
from engine.errors import BusyError
from engine.openmp import release_team
from engine.options import EngineSettings, SynthesisOptions
from engine.readiness import Readiness
from engine.reference import PreparedReference, Reference, ReferenceRules
from engine.reference_cache import ReferenceCache
from engine.results import Result
from engine.runtime import DeviceFallback, Runtime, resolve_runtime
from engine.t2s.decoding import SamplingParams, StopRules, T2SDecoder, T2SInput

log = logging.getLogger(__name__)

AUTO_TEXT_PROCESSES = 2  # text worker processes per front-end kind on CUDA (EngineSettings.text_processes -1)
MAX_TEXT_POOLS = 4  # front-end kinds (v1 / v2, G2PW folder) with worker processes at once; the oldest closes


# ---- the engine -----------------------------------------------------------------------------


class Studio:
    """One running engine: a model pool, a reference cache and a memory guard, shared by all requests.

    Responsibilities: (1) owns the bounded caches and the watermark policy, (2) builds a
    :class:`VoiceCloner` for the weights each request names (default: the configured ones).
    """

    def __init__(self, weights: WeightSet, runtime: Runtime, settings: EngineSettings = EngineSettings(),
                 reference_rules: ReferenceRules = ReferenceRules(), pool: ModelPool | None = None,
                 memory_reader: MemoryReader = system_memory_reader) -> None:
        self.settings = settings
        self.runtime = runtime
        self.reference_rules = reference_rules
        self.pool = pool if pool is not None else ModelPool(settings.model_pool_bytes, settings.weight_roots,
                                                            t2s_decoder=settings.t2s_decoder)
        self.references: ReferenceCache[PreparedReference] = ReferenceCache(
            settings.reference_cache_entries, settings.reference_cache_bytes)
        self.memory = MemoryGuard(settings, memory_reader, steps=(
            DegradeStep("reference cache", self.references.shrink, ORDER_REFERENCE_CACHE),
            DegradeStep("idle models", self._evict_idle_models, ORDER_IDLE_MODELS),
            DegradeStep("idle schedulers", self._close_idle_schedulers, ORDER_SLOTS)))
        self.fallback = DeviceFallback()  # MPS: a stage whose operator is missing reruns on the CPU
        self.config_notices: tuple[str, ...] = ()  # set by from_config: settings that cannot work as written
        self.readiness = Readiness(ready=True)  # a server's warm-up replaces it (engine.warmup); /health reads it
        self._default_models: Callable[[], Models | None] = lambda: None  # weak: the default set, once loaded
        self._defaults = weights
        self.device_notice = ""  # set by from_config when the config's device was not available
        self.vocoder_notice = ""  # set by from_config when Core ML was asked for but cannot run on this machine
        self.g2pw_notice = ""  # set by from_config when v2+ Mandarin runs without G2PW (says how to fetch it)
        self.g2pw_fix: tuple[str, str] = ("", "")  # (why G2PW is not used, the command that fetches it)
        self._lock = threading.Lock()
        self._warmed: set[str] = set()
        self._schedulers: dict[str, object] = {}  # Models.id -> engine.serving.Scheduler (insertion order)
        self._retired: list = []  # replaced schedulers still finishing their requests (closed once idle)
        from engine.serving.gate import DeviceGate

        self.gate = DeviceGate()  # device work of every scheduler and cloner vs CUDA graph captures
        # reference preparation on an accelerator runs on these threads (started on demand), not on the
        # request threads: few threads hold device handles, however many clients there are
        self._lane = ThreadPoolExecutor(max_workers=settings.reference_threads, thread_name_prefix="reference")
        # concurrent requests' new reference clips meet in one HuBERT batch and one speaker-model batch on CUDA,
        # on a thread of its own (one set of device handles); a lone clip runs at once, alone
        self._batch_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-batch")
        self._reference_batches = ReferenceBatches.make(self._batch_executor)
        self._events: dict[str, int] = {}  # serving events for /metrics (rebuilds, graphs captured...)
        # seconds requests spent before the scheduler, summed per place (VoiceCloner's account): the text's split,
        # the reference (from the cache or prepared), the first sentence's features
        self._upstream = dict.fromkeys(("split", "reference", "first_sentence"), 0.0)
        self._text_workers: dict[object, object] = {}  # FrontendSpec -> engine.text.workers.TextWorkers

    @classmethod
    def from_config(cls, config, device: str | None = None, precision: str | None = None,
                    settings: EngineSettings = EngineSettings(), vocoder_backend: str | None = None,
                    **kwargs) -> "Studio":
        """From a ``tts_infer.yaml`` path or ``InferConfig``; ``device``/``precision``/``vocoder_backend``
        (torch or coreml, for every version) override its sections."""
        from engine.config import InferConfig, load_config
        from engine.runtime import runtime_for_config

        cfg = config if isinstance(config, InferConfig) else load_config(config)
        active = cfg.active
        runtime, notice = runtime_for_config(active.device, active.is_half, device, precision,
                                             precision=active.precision or None,
                                             stage_precisions=dict(active.stage_precisions))
        weights = WeightSet.from_config(cfg).with_vocoder_backend(vocoder_backend)
        vocoder_notice = ""
        if weights.wants_coreml():  # said once here, not at every vocoder load: this machine cannot run Core ML
            from engine.acoustic import vocoder_backend as backends

            if why := backends.coreml_unavailable():
                from engine.runtime import PRECISIONS

                asked = ("--vocoder-backend coreml" if vocoder_backend == "coreml"
                         else "the config's vocoder_backend: coreml")
                weights = weights.with_vocoder_backend("torch")
                vocoder_precision = {v: k for k, v in PRECISIONS.items()}[runtime.dtype_for("vocoder")]
                vocoder_notice = (f"{asked} is not used: {why}; the torch vocoder runs instead, on "
                                  f"{runtime.device} ({vocoder_precision})")  # the front doors print it, once
        studio = cls(weights, runtime, settings, **kwargs)
        studio.device_notice = notice
        studio.vocoder_notice = vocoder_notice
        from engine.text.chinese import g2pw_fix, g2pw_notice

        studio.g2pw_fix = g2pw_fix(active.version, studio.default_weights.g2pw_folder(), cfg.base_dir)
        if studio.g2pw_fix[0]:
            studio.g2pw_notice = g2pw_notice(studio.g2pw_fix[0], cfg.base_dir)
        studio.config_notices = tuple(p for p in cfg.problems()  # the vocoder notice says it all when Core ML is out
                                      if not (vocoder_notice and "vocoder_backend is 'coreml'" in p))
        for problem in studio.config_notices:
            log.warning("config %s: %s", cfg.source, problem)
        return studio

    @property
    def default_weights(self) -> WeightSet:
        return self._defaults

    def set_default_weights(self, gpt: str | os.PathLike | None = None,
                            sovits: str | os.PathLike | None = None) -> Models:
        """Change the weights used by requests that name none (api_v2 ``set_*_weights``); loads them first,
        so a bad path changes nothing. Requests already running keep their models."""
        weights = self._defaults.replace(gpt=gpt, sovits=sovits)
        models = self.pool.models(weights, self.runtime)
        with self._lock:
            self._defaults = weights
        return models

    def stage_plan(self) -> list[tuple[str, str, str, str]]:
        """(stage, device, precision, backend) of each network as this engine runs it now: the runtime's choice,
        the CPU (float32) for stages the device fallback moved, and the vocoder backend per version."""
        from engine.runtime import PRECISIONS, STAGES
        from engine.versions import VERSIONS

        names = {v: k for k, v in PRECISIONS.items()}
        moved = self.fallback.cpu_stages
        coreml = [v for v in VERSIONS if (b := self._defaults.backend(v))[0] == "coreml" and b[1]]
        rows = []
        for stage in STAGES:
            device, precision = str(self.runtime.device), names[self.runtime.dtype_for(stage)]
            if stage in moved:
                device, precision = "cpu (operator missing on " + moved[stage].device + ")", "fp32"
            backend = "torch"
            if stage in ("vocoder", "sovits") and coreml:
                relevant = [v for v in coreml if (v in ("v3", "v4")) == (stage == "vocoder")]
                backend = f"coreml ({', '.join(relevant)}), else torch" if relevant else "torch"
            rows.append((stage, device, precision, backend))
        return rows

    def cloner(self, gpt: str | os.PathLike | None = None, sovits: str | os.PathLike | None = None,
               runtime: Runtime | None = None) -> VoiceCloner:
        """A VoiceCloner for these weights (defaults where None), loading them if needed."""
        weights = self._defaults.replace(gpt=gpt, sovits=sovits)
        models = self.pool.models(weights, runtime or self.runtime)
        if weights == self._defaults:
            self._default_models = weakref.ref(models)
        cloner = VoiceCloner(models, self.references, self.reference_rules, self.settings.max_text_chars,
                             scheduler=self.scheduler(models) if self.settings.scheduler else None,
                             fallback=self.fallback, reopen=lambda: self.scheduler(models), gate=self.gate,
                             conv_backend=self.settings.conv_backend,
                             lane=self._lane if models.device.type != "cpu" else None,
                             batches=self._reference_batches if models.device.type == "cuda" else None,
                             text_workers=self._text_workers_for(models),
                             stream_context=self.settings.stream_context_tokens, account=self._account)
        if self.settings.warmup:
            with self._lock:
                first = models.id not in self._warmed
                self._warmed.add(models.id)
            if first:
                # the official flow's FastT2S graph is captured only when that flow serves (no scheduler); with
                # the device to itself, since other requests may be running
                with self.gate.capture():
                    warm_up_models(models, capture=not self.settings.scheduler)
        return cloner

    def _text_workers_for(self, models: Models):
        """The worker processes that read texts for ``models`` (shared by the sets of one front-end kind), or None
        when texts are read on the request threads (``EngineSettings.text_processes``)."""
        from engine.text.workers import TextWorkers

        n = self.settings.text_processes
        if n < 0:
            n = AUTO_TEXT_PROCESSES if models.device.type == "cuda" else 0
        if n == 0 or models.frontend_spec is None:
            return None
        with self._lock:
            workers = self._text_workers.pop(models.frontend_spec, None)  # back in last: most recently used
            if workers is None:
                workers = TextWorkers(models.frontend_spec, n)
            self._text_workers[models.frontend_spec] = workers
            closing = []
            while len(self._text_workers) > MAX_TEXT_POOLS:  # least recently used kind first
                closing.append(self._text_workers.pop(next(iter(self._text_workers))))
        for old in closing:
            old.close()
        return workers

    def close_text_workers(self) -> int:
        """Stop every text worker process and wait for them (a server's shutdown); the number of pools closed. A
        later request starts new ones."""
        with self._lock:
            pools, self._text_workers = list(self._text_workers.values()), {}
        for workers in pools:
            workers.close(wait=True)
        return len(pools)

    def _count(self, event: str, n: int = 1) -> None:
        """A serving event (from a scheduler); graph captures are told apart by when they happened."""
        if event in ("graphs_captured", "prefill_graphs_captured", "acoustic_graphs_captured"):
            event = f"{event}_{'serving' if self.readiness.done else 'warmup'}"
        with self._lock:
            self._events[event] = self._events.get(event, 0) + n

    def _account(self, place: str, seconds: float) -> None:
        with self._lock:
            self._upstream[place] += seconds

    def serving_events(self) -> dict[str, int]:
        """Counts of scheduler rebuilds, acoustic failures and graph captures (decode step / prefill / acoustic,
        warm-up / serving)."""
        with self._lock:
            return dict(self._events)

    def serving_work(self) -> dict[str, float]:
        """The live schedulers' :meth:`engine.serving.Scheduler.work`, summed (a closed scheduler's counts go
        with it), and the seconds requests spent before a scheduler (``split``, ``reference``, ``first_sentence``
        ``_occupancy_seconds``)."""
        with self._lock:
            schedulers = [*self._schedulers.values(), *self._retired]
        with self._lock:
            total = {f"{place}_occupancy_seconds": v for place, v in self._upstream.items()}
        for sched in schedulers:
            for name, value in sched.work().items():
                total[name] = total.get(name, 0) + value
        return total

    @property
    def serving_state(self) -> str:
        """"ok"; "degraded" while a scheduler rebuilds its decoding state after a failed step; "failed" when
        one could not (the device is unusable: restart)."""
        with self._lock:
            states = {sched.state for sched in self._schedulers.values()}
        return "failed" if "failed" in states else "degraded" if "rebuilding" in states else "ok"

    def capture_graphs(self, timeout: float | None = None) -> int:
        """Capture every scheduler's decode-step graphs now (warm-up, before a server is ready); the number
        captured. Afterwards no request waits for, or risks, a capture."""
        with self._lock:
            schedulers = list(self._schedulers.values())
        return sum(sched.capture_graphs(timeout) for sched in schedulers)

    def capacity(self) -> int:
        """Requests the engine can hold at once (decoding slots + waiting room of every live scheduler); 0
        before a scheduler exists."""
        with self._lock:
            schedulers = list(self._schedulers.values())
        return sum(sched.slots + sched.config.queue for sched in schedulers)

    def _close_idle_schedulers(self) -> int:
        """Degrade step: close the schedulers no request is using, releasing their KV-cache pools; bytes
        released. The next request on a model set makes a new one, sized from the memory free then."""
        closed: list = []
        with self._lock:
            for key in [key for key, sched in self._schedulers.items() if sched.close_if_idle(wait=False)]:
                closed.append(self._schedulers.pop(key))
            self._sweep_retired_locked(closed)
        for sched in closed:
            sched.join()
        return sum(sched.kv_bytes for sched in closed)

    def _evict_idle_models(self) -> int:
        """Degrade step: drop every pooled network but those of the default weights; bytes released."""
        return self.pool.evict_except(self._default_models())

    def synthesize(self, text: str, text_lang: str, reference: Reference,
                   options: SynthesisOptions = SynthesisOptions(), gpt: str | os.PathLike | None = None,
                   sovits: str | os.PathLike | None = None,
                   on_progress: ProgressCallback | None = None) -> Iterator[Result]:
        """Admit the request under the memory watermark, then run it; validation errors come before any
        result. The returned iterator frees its per-request state when exhausted or closed."""
        admission = self.memory.admit(str(self.runtime.device))
        runtime = self.runtime if admission.device == str(self.runtime.device) else resolve_runtime("cpu", "fp32")
        cloner = self.cloner(gpt, sovits, runtime)
        results = cloner(text, text_lang, reference, options, on_progress)
        return results if cloner.scheduler is not None else _freeing(results, runtime)

    def scheduler(self, models: Models):
        """The scheduler that runs every request on ``models`` (made on first use, one per model set).

        At most ``max_schedulers`` live at once; to make room the oldest idle one is closed. A scheduler with
        requests in flight is never closed for another model set: when every one is busy, BusyError (HTTP 503
        + Retry-After) for the new set, and the running requests go on."""
        from engine.serving.scheduler import Scheduler, SchedulerConfig

        closed: list = []  # schedulers closed to make room: their threads are waited for outside the lock
        try:
            with self._lock:
                self._sweep_retired_locked(closed)
                sched = self._schedulers.get(models.id)
                if sched is not None and sched.models.t2s is models.t2s and not sched.closed:
                    return sched
                if sched is not None:  # reloaded weights (or closed meanwhile): its running requests finish there
                    del self._schedulers[models.id]
                    sched.retire()
                    self._retired.append(sched)
                    self._sweep_retired_locked(closed)
                self._make_room_locked(closed)
                s = self.settings
                sched = Scheduler(models, SchedulerConfig(slots=s.scheduler_slots, queue=s.scheduler_queue,
                                                          context=s.scheduler_context, conv_backend=s.conv_backend,
                                                          acoustic_buckets=s.acoustic_buckets,
                                                          acoustic_graphs=s.acoustic_graphs,
                                                          acoustic_compile=s.acoustic_compile,
                                                          acoustic_pipeline=s.acoustic_pipeline,
                                                          prefill_graphs=s.prefill_graphs,
                                                          prefill_wait_s=s.prefill_wait_ms / 1000),
                                  gate=self.gate, on_event=self._count, fallback=self.fallback)
                self._schedulers[models.id] = sched
                return sched
        finally:
            for old in closed:
                old.join()

    def _sweep_retired_locked(self, closed: list) -> None:
        """Replaced schedulers close as soon as their last request is done."""
        keep = []
        for old in self._retired:
            (closed if old.close_if_idle(wait=False) else keep).append(old)
        self._retired = keep

    def _make_room_locked(self, closed: list) -> None:
        """Room for one more scheduler: the oldest idle ones close; BusyError when every live scheduler
        (replaced ones still finishing included) has requests in flight."""
        limit = self.settings.max_schedulers
        while len(self._schedulers) + len(self._retired) >= limit:
            victim = next((key for key, old in self._schedulers.items() if old.close_if_idle(wait=False)), None)
            if victim is None:
                busy = [*self._schedulers.values(), *self._retired]
                wait = min((old.typical_seconds for old in busy), default=1.0)
                raise BusyError(f"the server is serving {len(busy)} other model sets with requests in flight, the "
                                f"most it holds at once (max_schedulers = {limit}); retry in {wait:.0f} s or use "
                                "weights that are loaded already", retry_after=wait)
            closed.append(self._schedulers.pop(victim))

    def drain(self, reason: str = "the server is shutting down; retry in a moment") -> int:
        """Shutdown has begun: every scheduler fails its queued requests (no audio made yet) with
        BusyError(reason); requests already decoding finish. The server stops admitting on its side (this
        Studio may serve other front doors, e.g. the page beside the API). Returns the number failed."""
        with self._lock:
            schedulers = list(self._schedulers.values())
        return sum(sched.drain(reason) for sched in schedulers)

    def load(self) -> dict[str, int]:
        """The schedulers' load summed: ``queued`` requests (not started), ``decoding`` rows, ``slots``."""
        with self._lock:
            schedulers = list(self._schedulers.values())
        total = {"slots": 0, "decoding": 0, "queued": 0}
        for sched in schedulers:
            load = sched.load
            for key in total:
                total[key] += load[key]
        return total

    def close(self) -> None:
        """Stop the schedulers (their running requests end with an error) and the reference threads."""
        with self._lock:
            schedulers, self._schedulers = [*self._schedulers.values(), *self._retired], {}
            self._retired = []
            text_workers, self._text_workers = list(self._text_workers.values()), {}
        for sched in schedulers:
            sched.close()
        for workers in text_workers:
            workers.close()
        self._lane.shutdown(wait=False, cancel_futures=True)
        self._batch_executor.shutdown(wait=False, cancel_futures=True)


def _freeing(results: Iterator[Result], runtime: Runtime) -> Iterator[Result]:
    try:
        yield from results
    finally:
        if runtime.device.type == "cuda":
            torch.cuda.empty_cache()
        elif runtime.device.type == "cpu":
            release_team()  # the caller's thread waits for its next request: its OpenMP team goes (engine.openmp)


@torch.no_grad()
def warm_up_models(models: Models, capture: bool = True) -> None:
    """Run each network once on tiny inputs (first-call kernel selection, allocator growth); ``capture``:
    also capture FastT2S's decode-step graph of the common shape (the official flow's)."""
    dev = models.device
    if capture and models.t2s_fast is not None:
        models.t2s_fast.warm_up()
    decoder = T2SDecoder(models.t2s, generator=torch.Generator(device=dev).manual_seed(0))
    phones = torch.zeros(8, dtype=torch.long, device=dev)
    width = models.t2s.bert_proj.in_features
    out = decoder.decode_naive(T2SInput(phones, torch.zeros(width, 8, device=dev)),
                               torch.zeros(8, dtype=torch.long, device=dev), SamplingParams(),
                               StopRules(early_stop_num=4, min_steps=0))
    if not models.uses_vocoder:
        spec = torch.zeros(1, 1025, 32, device=dev, dtype=next(models.sovits.parameters()).dtype)
        sv = [torch.zeros(1, models.sovits.dims.sv_dim, device=dev)] if models.sv is not None else None
        models.sovits.decode(out.tokens.view(1, 1, -1), phones.unsqueeze(0), [spec], sv_emb=sv)
    log.info("warmed up %s", models.id)
