"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`radixd.daemon.server.main` holds the `radixd serve` flags and entry point; `app` wires servers,
health, reflection, metrics and the SIGTERM drain; `pipeline` runs every protocol's generation
requests (submit, the in-flight registry, metrics, abort on exit), which `streaming` (radixd.v1) and
`vllm.generate` map to and from their messages, with one sampling conversion (`sampling`); `bridge`
moves engine outputs onto the event loop.
"""
