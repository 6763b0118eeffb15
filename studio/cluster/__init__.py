"""The HTTP API of ``sovits-studio serve`` on a Ray Serve cluster (the optional ``[cluster]`` extra).

A gateway takes every request and forwards it to a synthesis replica, chosen by the model set the
request needs (``serve.multiplexed``); each replica runs one engine behind the server's own FastAPI app.
Nothing here imports Ray until a cluster is built or started. See docs/cluster.md.
"""
