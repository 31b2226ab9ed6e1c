"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`radixd.daemon.server.main` holds the `radixd serve` flags and entry point; `app` wires servers, health,
reflection, metrics and the SIGTERM drain. `common/` holds what both services share: `pipeline` runs
every protocol's generation requests (submit, the in-flight registry, metrics, abort on exit), which
`streaming` (radixd.v1) and `vllm.generate` map to and from their messages, with one sampling conversion
(`sampling`); `bridge` moves engine outputs onto the event loop. The tree's changes reach both
cache-event streams through one listener (`cache_feed`) and one log mechanism (`event_log`): `events`
keeps radixd's stream and each namespace's vLLM KV log (`kv_events`), which `admin` and `vllm.kv_stream`
render.
"""
