"""The Gradio web UI of SoVITS Studio: a thin layer over :mod:`engine` (which never imports gradio).

``webui.app.build_ui(studio)`` builds the page; ``sovits-studio webui`` (``webui.server``) serves it
together with the HTTP API on one port.
"""
