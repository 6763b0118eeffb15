"""The Gradio web UI: a thin layer over the engine."""
