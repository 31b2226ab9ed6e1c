"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`main`: flags; `app`: wiring and drain; `pipeline`: every protocol's request path; `bridge`/`handover`:
outputs to the loop; `cache_feed`, `event_log`, `events`, `kv_events`: the cache-event streams.
"""
