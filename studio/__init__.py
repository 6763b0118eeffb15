"""The product's front doors over the :mod:`engine` library: the HTTP API (``studio.http``) and the command
line (``studio.cli``). The web UI (:mod:`webui`) stands between them: it mounts on the HTTP app, and the CLI
starts it."""
