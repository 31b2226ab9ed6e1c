"""Generated protobuf and gRPC stubs for radixd.v1 (``make proto``; do not edit)."""
