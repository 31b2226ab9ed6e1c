"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`app` wires and drains; `pipeline` is every protocol's request path; `cache_feed`/`events`: event streams.
"""
