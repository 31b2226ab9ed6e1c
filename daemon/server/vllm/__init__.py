"""The vLLM worker protocol (`vllm.grpc.engine.VllmEngine`, stubs from `smg-grpc-proto`) over the engine.

Served beside `radixd.v1` on the public port, so that Shepherd Model Gateway (smg) can front several
radixd replicas: it tokenizes and renders chat templates itself, sends token ids, and routes with its
`cache_aware` policy fed by the KV events translated from the radix tree (`kv_events.py`).
"""
