"""Typed engine errors. Every message says what was wrong and what to do about it.

An error about one input carries ``field``: the engine's own name for it, never a front door's
parameter name. The names are the arguments of :meth:`engine.cloner.VoiceCloner.__call__` and the
fields of :class:`engine.reference.Reference` and :class:`engine.options.SynthesisOptions`:

- ``text``, ``text_lang``: the text to speak and its language;
- ``reference.audio``, ``reference.aux_audio[i]``: the main and the i-th auxiliary reference clip;
- ``reference.text``, ``reference.language``: the clip's transcript and its language;
- a :class:`~engine.options.SynthesisOptions` field name (``top_k``, ``min_chunk_length``...).

A front door maps these to its own words (the HTTP API says ``ref_audio_path``, ``prompt_lang``...).
When ``field`` is set the message may begin with the engine's name; the front door replaces it.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose. ``field``: the input at fault, if one is."""

    def __init__(self, message: str = "", *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):
        """Pickled whole (its field and any other attribute), e.g. from the text worker processes."""
        return _restore_error, (type(self), self.args, dict(self.__dict__))


def _restore_error(cls: type, args: tuple, state: dict) -> "EngineError":
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ConfigError(EngineError, ValueError):
    """A configuration file or value is invalid (names the key)."""


class DeviceUnavailableError(EngineError, RuntimeError):
    """An explicitly requested device is not available on this machine."""


class CheckpointError(EngineError):
    """A weight file or folder is missing, corrupt, unsafe or of the wrong kind (names the file)."""


class ReferenceAudioError(EngineError, ValueError):
    """The reference clip cannot be used (unreadable, too short/long, silent...)."""


class UnsupportedLanguageError(EngineError, ValueError):
    """A language code the frontend does not support."""


class TextError(EngineError, ValueError):
    """The text cannot be turned into phones (empty, only punctuation...)."""


class OptionsError(EngineError, ValueError):
    """A synthesis option is out of range or inconsistent (names the option)."""


class BusyError(EngineError, RuntimeError):
    """No capacity for this request now; the same request may succeed after ``retry_after`` seconds."""

    def __init__(self, message: str = "busy: retry later", *, retry_after: float = 1.0,
                 field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after = float(retry_after)


def with_field(error: EngineError, field: str) -> EngineError:
    """``error`` with ``field`` set unless it already names one (for re-raising with ``raise``)."""
    if error.field is None:
        error.field = field
    return error


class MemoryPressureError(EngineError, RuntimeError):
    """Memory stayed above the watermark after every degrade step: retry later (HTTP 503)."""
