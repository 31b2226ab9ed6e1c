"""The gRPC front end: generation, session and cache-admin servicers on grpc.aio, bridged to the engine.

`app` wires and drains; `common/` holds what both services share (`pipeline`: every protocol's request
path; `cache_feed`/`events`: event streams); `vllm/` is the vLLM worker protocol.
"""
