"""The HTTP server: ``studio.http.app.create_app(studio, settings) -> FastAPI``.

``app`` wires the routes, ``api_v2`` is the official api_v2 protocol, ``openai`` the OpenAI speech
endpoint over saved voices (``profiles``), ``runner`` the bounded worker pool, ``audio_formats`` the
response encoders, ``metrics`` the Prometheus exposition and ``http`` the error/size plumbing.
Importing this package does nothing.
"""
