"""`SubscribeKvEvents`: catch a subscriber up (replay or snapshot), then stream batches and load records.

A cursor inside the retained history replays from there; otherwise a snapshot of the live blocks comes
first, numbered so live batches follow without a gap. Load records ride on every batch and on
`load_only` batches (on change, or as a heartbeat).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated.common_pb2 import KvEventBatch as Batch

from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.server.common.events import CacheEvents
from radixd.daemon.server.common.kv_events import to_batch
from radixd.daemon.server.vllm.loads import LoadSampler, routing_core

# A load record goes out at least this often while the engine is idle (smg reads silence as trouble).
HEARTBEAT_S = 2.0


async def kv_event_stream(
    events: CacheEvents, namespace: str, sampler: LoadSampler, request: common_pb2.SubscribeKvEventsRequest
) -> AsyncIterator[Batch]:
    """The batches of one `SubscribeKvEvents` call on `namespace`'s log, until the client goes away."""
    log = events.kv(namespace)
    records = 0
    sent_core: tuple[int, int, int] | None = None
    sent_at = 0.0

    def record(sample: EngineStats, load_only: bool) -> common_pb2.EngineLoad:
        nonlocal records, sent_core, sent_at
        records += 1
        sent_core, sent_at = routing_core(sample), time.monotonic()
        return sampler.engine_load(sample, load_only, records)

    # NOTE: subscribed and caught up in one synchronous stretch, so no batch falls between the two;
    # whatever the reader also holds of the catch-up is skipped by its sequence number.
    async with events.subscribed():
        with log.batches.subscribed() as reader, sampler.listening():
            start = int(request.start_sequence_number)
            first = log.replay(start)
            last = start - 1 if first is not None else log.sequence
            first = first if first is not None else log.snapshot()
            sample = sampler.latest or await sampler.read()
            if request.load_records_before_first_batch and sample is not None:
                yield Batch(sequence_number=0, timestamp=time.time(), load=record(sample, True))
            for out in first:
                if sample is not None:
                    out.load.CopyFrom(record(sample, False))
                last = max(last, out.sequence_number)
                yield out
            while True:
                item = await reader.next(last, sampler.interval_s)
                sample = sampler.latest
                if item is not None:
                    out = to_batch(item)
                    if sample is not None:
                        out.load.CopyFrom(record(sample, False))
                    last = item[0]
                    yield out
                elif sample is not None and (
                    routing_core(sample) != sent_core or time.monotonic() - sent_at >= HEARTBEAT_S
                ):
                    yield Batch(sequence_number=last, timestamp=time.time(), load=record(sample, True))
