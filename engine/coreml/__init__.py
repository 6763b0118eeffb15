"""Core ML vocoders: export (``export``), package inspection and the macOS runtime wrapper (``package``).

coremltools is imported inside functions only: the engine imports fine without it.
"""
