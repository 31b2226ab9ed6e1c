"""What the radixd.v1 and vLLM services share: the request pipeline, server state, auth and bounds, error
mapping, metrics, the cache-event feed and logs, and the conversion of sampling parameters."""
