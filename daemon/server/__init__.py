"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`radixd.daemon.server.main` holds the `radixd serve` flags and entry point; `app` wires servers,
health, reflection, metrics and the SIGTERM drain; `bridge` moves engine outputs onto the event loop.
"""
