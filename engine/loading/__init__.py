"""Checkpoint file -> module: format and version detection, safe loading, dims read from the file."""
