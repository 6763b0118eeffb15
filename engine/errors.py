"""Typed engine errors. Every message says what was wrong and what to do about it."""

from __future__ import annotations


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


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


class MemoryPressureError(EngineError, RuntimeError):
    """Memory stayed above the watermark after every degrade step: retry later (HTTP 503)."""
