"""The request flow's public names, where code written against ``engine.pipeline`` finds them.

The flow itself lives in modules of one job each: :mod:`engine.cloner` (one model set's request flow,
:class:`VoiceCloner`), :mod:`engine.studio` (the running engine that owns the shared pools and
schedulers, :class:`Studio`), :mod:`engine.reference` (:class:`Reference`, :class:`PreparedReference`)
and :mod:`engine.results` (:class:`Result`, :func:`join`). New code imports from ``engine`` itself.
"""

from engine.cloner import VoiceCloner
from engine.reference import PreparedReference, Reference
from engine.results import Result, join
from engine.studio import Studio

__all__ = ["PreparedReference", "Reference", "Result", "Studio", "VoiceCloner", "join"]
