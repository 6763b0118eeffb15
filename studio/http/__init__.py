"""The HTTP server: ``studio.http.app.create_app(studio, settings) -> FastAPI``.

``app`` wires the routes behind ``guard`` (request ids, keys, body limits, last-resort errors, counting);
``api_v2`` is the official api_v2 protocol and ``openai`` the OpenAI speech endpoint over saved voices
(``profiles``), both running their work through ``synthesis`` (admission, time and audio limits,
cancellation: ``exchange``); ``bodies`` reads request bodies, ``errors`` turns errors into answers,
``auth`` holds the credentials, ``limits`` every bound (``ServerLimits``), ``lifecycle`` runs uvicorn with
them and drains on SIGTERM, ``runner`` is the worker pool and ``metrics`` the Prometheus exposition.
Importing this package does nothing.
"""
