"""`SubscribeKvEvents`: catch a subscriber up (replay or snapshot), then stream batches and load records.

A subscriber with `start_sequence_number` inside the retained history gets the batches from that
number on; one without a cursor (0), or whose cursor the history no longer reaches (or that is beyond
the newest batch: the daemon restarted), gets a snapshot of the live blocks first, numbered so that
live batches follow without a gap. Load records ride on every batch, and on `load_only` batches
(numbered like the last batch sent) when the load changed or as a heartbeat while nothing happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator

import grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated.common_pb2 import KvEventBatch as Batch

from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.server.cache_feed import CacheFeed
from radixd.daemon.server.errors import RpcFailure
from radixd.daemon.server.kv_events import NamespaceKvLog
from radixd.daemon.server.vllm.loads import LoadSampler, routing_core

# A load record goes out at least this often while the engine is idle (smg reads silence as trouble).
HEARTBEAT_S = 2.0
SUBSCRIBER_BUFFER = 1024


def _catch_up(log: NamespaceKvLog, start: int) -> tuple[list[Batch], int]:
    """The batches a new subscriber gets first, and the sequence it then stands at."""
    replay = log.replay(start) if start > 0 else None
    if replay is not None:
        return replay, start - 1
    return log.snapshot(), log.sequence


async def kv_event_stream(
    log: NamespaceKvLog,
    feed: CacheFeed,
    sampler: LoadSampler,
    request: common_pb2.SubscribeKvEventsRequest,
) -> AsyncIterator[Batch]:
    """The batches of one `SubscribeKvEvents` call, until the client goes away. `feed` keeps the tree
    listener that feeds `log` installed meanwhile."""
    async with feed.subscribed(), contextlib.aclosing(_stream(log, sampler, request)) as batches:
        async for batch in batches:
            yield batch


async def _stream(
    log: NamespaceKvLog, sampler: LoadSampler, request: common_pb2.SubscribeKvEventsRequest
) -> AsyncGenerator[Batch, None]:
    queue: asyncio.Queue[Batch | None] = asyncio.Queue(SUBSCRIBER_BUFFER)

    def put(batch: Batch) -> bool:
        try:
            queue.put_nowait(batch)
        except asyncio.QueueFull:
            queue.get_nowait()
            queue.put_nowait(None)  # cut off: the stream ends and the subscriber resumes
            return False
        return True

    key = object()
    # NOTE: subscribed and caught up in one synchronous stretch, so no batch falls between the two;
    # whatever the queue also holds of the catch-up is skipped by its sequence number.
    log.subscribe(key, put)
    first, last = _catch_up(log, int(request.start_sequence_number))
    records = 0
    sent_core: tuple[int, int, int] | None = None
    sent_at = 0.0

    def record(sample: EngineStats, load_only: bool) -> common_pb2.EngineLoad:
        nonlocal records, sent_core, sent_at
        records += 1
        sent_core, sent_at = routing_core(sample), time.monotonic()
        return sampler.engine_load(sample, load_only, records)

    try:
        with sampler.listening():
            sample = sampler.latest or await sampler.read()
            if request.load_records_before_first_batch and sample is not None:
                yield Batch(sequence_number=0, timestamp=time.time(), load=record(sample, True))
            for batch in first:
                if sample is not None:
                    batch.load.CopyFrom(record(sample, False))
                last = max(last, batch.sequence_number)
                yield batch
            while True:
                try:
                    item: Batch | bool | None = await asyncio.wait_for(queue.get(), sampler.interval_s)
                except TimeoutError:
                    item = False
                if item is None:
                    raise RpcFailure(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the subscriber fell more than {SUBSCRIBER_BUFFER} batches behind; resubscribe with"
                        f" start_sequence_number={last + 1}",
                    )
                sample = sampler.latest
                if isinstance(item, Batch):
                    if item.sequence_number <= last:
                        continue
                    out = Batch()
                    out.CopyFrom(item)  # the log's copy is shared by every subscriber
                    if sample is not None:
                        out.load.CopyFrom(record(sample, False))
                    last = item.sequence_number
                    yield out
                elif sample is not None and (
                    routing_core(sample) != sent_core or time.monotonic() - sent_at >= HEARTBEAT_S
                ):
                    yield Batch(sequence_number=last, timestamp=time.time(), load=record(sample, True))
    finally:
        log.unsubscribe(key)
