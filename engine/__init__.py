"""SoVITS Studio inference engine for GPT-SoVITS models."""

__version__ = "0.1.0"
