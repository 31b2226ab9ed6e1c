"""The serving daemon: model, loaders, engine, gRPC servers, CLI."""
