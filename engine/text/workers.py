"""The text front end in worker processes, so that reading text never holds the engine's GIL.

Normalisation, language routing and g2p (jieba, pypinyin, G2PW's ONNX model, OpenJTalk, g2p_en) are Python and
C work that holds the interpreter lock: in the engine's process it competes with the scheduler's decode loop and
the acoustic thread, which launch the GPU's work (docs/benchmarks.md, issue 31: the HTTP server and the front end
alone would fill one core at about 1,000 audio-s/s). :class:`TextWorkers` runs
``TextFrontend.phones_and_bert(text, language, with_bert=False)`` in a few spawned processes instead; what comes
back is small (phones, word2ph, the normalised text), and BERT, which runs on the device, stays in the engine.
The result is the same function: each worker builds the same :class:`~engine.text.frontend.TextFrontend` (same
version, same G2PW folder) as the engine would.

Responsibilities: (1) a bounded pool of processes per front-end kind (:class:`FrontendSpec`), started on first use
and warm once a text of each language was read; (2) a dead worker fails only the reads it held (an
:class:`~engine.errors.EngineError` that says so) and the pool is replaced for the next read.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import CancelledError, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from engine.errors import EngineError
from engine.text.frontend import TextFeatures, TextFrontend

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 120.0  # one sentence's reading; far beyond any real one (a worker's first read loads dictionaries)


@dataclass(frozen=True)
class FrontendSpec:
    """What a worker needs to build the engine's front end: the symbol table version and the Mandarin g2p."""

    version: str  # "v1" or "v2" (the front end's symbol table)
    g2pw_folder: str | None = None  # the G2PW model's folder (v2+ Mandarin polyphones); None: pypinyin
    tokenizer: str | None = None  # the chinese-roberta folder G2PW tokenises with

    def build(self) -> TextFrontend:
        zh_g2p = None
        if self.g2pw_folder is not None and self.tokenizer is not None:
            from engine.text.chinese import g2pw_converter

            zh_g2p = g2pw_converter(self.g2pw_folder, self.tokenizer)
        return TextFrontend(self.version, bert=None, zh_g2p=zh_g2p)


# The front end of this worker process (set once by the pool's initializer; never used in the engine's process).
_worker_frontend: TextFrontend | None = None


def _start_worker(spec: FrontendSpec) -> None:
    global _worker_frontend
    _worker_frontend = spec.build()


def _started() -> bool:
    return _worker_frontend is not None


def _read(text: str, language: str) -> TextFeatures:
    assert _worker_frontend is not None, "the worker's front end is set by its initializer"
    return _worker_frontend.phones_and_bert(text, language, with_bert=False)


class TextWorkers:
    """``processes`` worker processes that read text with the front end of ``spec`` (thread-safe)."""

    def __init__(self, spec: FrontendSpec, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self.spec, self.processes = spec, processes
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def _executor(self) -> ProcessPoolExecutor:
        import multiprocessing

        with self._lock:
            if self._closed:
                raise EngineError("the text workers were shut down")
            if self._pool is None:  # spawn: a fork of a process with CUDA and many threads is unsafe
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_worker, initargs=(self.spec,))
                for _ in range(self.processes):  # every worker starts now (a pool starts them one per busy task)
                    self._pool.submit(_started)
            return self._pool

    def read(self, text: str, language: str) -> TextFeatures:
        """``TextFrontend.phones_and_bert(text, language, with_bert=False)``, read by a worker. Its errors
        (TextError, UnsupportedLanguageError...) are raised here as they were raised there."""
        pool = self._executor()
        try:
            return pool.submit(_read, text, language).result(timeout=READ_TIMEOUT_S)
        except EngineError:  # the front end's own (TextError, UnsupportedLanguageError...): as they are
            raise
        except BrokenProcessPool as e:  # a worker died (killed, out of memory): this read fails, the next starts anew
            self._replace(pool)
            raise EngineError("a text front-end worker process died while reading this text; retry the request") \
                from e
        except (CancelledError, RuntimeError) as e:  # the pool was closed meanwhile (the engine stops, or another
            # front-end kind took its place): submit refuses, or the read is cancelled
            raise EngineError("the text front end was restarted while reading this text; retry the request") from e
        except TimeoutError as e:
            raise EngineError(f"reading this text took longer than {READ_TIMEOUT_S:.0f} s; try a shorter text") from e

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        log.warning("a text front-end worker process died; the pool of %s starts anew", self.spec.version)
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self, wait: bool = False) -> None:
        """Stop the workers (reads still queued fail with an EngineError); ``wait``: until their processes ended."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)
