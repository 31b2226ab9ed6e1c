"""Client library for the radixd gRPC daemon."""
