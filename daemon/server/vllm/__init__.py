"""The vLLM worker protocol (`vllm.grpc.engine.VllmEngine`, stubs from `smg-grpc-proto`) over the engine.

Served beside `radixd.v1` on the public port, so a gateway (smg) can route on the tree's KV events.
"""
