"""Engine load for routers: the `EngineLoad` records on the KV-event stream and `GetLoads`, both
rendered from the engine's `EngineStats`.

`token_usage` is the KV running requests hold, not the cache (kept full on purpose: counting it would
take warm replicas out of rotation). Swapped-out sequences count as waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2

from radixd.daemon.engine.commands import GetStats
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.process.log import get_logger

if TYPE_CHECKING:
    from radixd.daemon.engine.engine import Engine

log = get_logger("radixd.server.vllm.loads")


def token_usage(s: EngineStats) -> float:
    """The fraction of the pool running sequences hold."""
    return s.active_blocks / s.total_blocks if s.total_blocks else 0.0


def waiting(s: EngineStats) -> int:
    """What a router counts as waiting: sequences not admitted yet and those swapped out."""
    return s.waiting_seqs + s.swapped_seqs


def routing_core(s: EngineStats) -> tuple[int, int, int]:
    """What a router acts on: a record is resent when this changes."""
    return s.running_seqs, waiting(s), s.active_blocks


class LoadSampler:
    """Reads the engine's load every `interval_s` while anyone listens (latest reading, generation rate)."""

    def __init__(self, engine: Engine, interval_s: float = 0.25) -> None:
        self._engine = engine
        self.interval_s = interval_s
        self.latest: EngineStats | None = None
        self.throughput = 0.0
        self.samples = 0  # readings taken: a stream's record `sample` counter
        self._listeners = 0
        self._task: asyncio.Task[None] | None = None
        self.updated = asyncio.Event()

    async def read(self) -> EngineStats | None:
        """A fresh reading (None when the engine no longer answers)."""
        try:
            sample = await asyncio.wrap_future(self._engine.execute(GetStats()))
        except Exception as exc:  # stopping or dead: the caller reports what it has
            log.info("loads.unavailable", error=str(exc))
            return None
        prev = self.latest
        if prev is not None and sample.taken_at > prev.taken_at:
            tokens = sample.generated_tokens - prev.generated_tokens
            self.throughput = max(0.0, tokens / (sample.taken_at - prev.taken_at))
        self.latest = sample
        self.samples += 1
        self.updated.set()
        self.updated = asyncio.Event()
        return sample

    async def _run(self) -> None:
        while self._listeners > 0:
            await self.read()
            await asyncio.sleep(self.interval_s)

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Sample in the background while at least one stream is inside this block."""
        self._listeners += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            yield
        finally:
            self._listeners -= 1
            if self._listeners == 0 and self._task is not None:
                self._task.cancel()  # no reading is due until someone listens again
                self._task = None

    def engine_load(self, s: EngineStats, load_only: bool, seq_sample: int) -> common_pb2.EngineLoad:
        """The stream's load record for the reading `s`."""
        usage = token_usage(s)
        return common_pb2.EngineLoad(
            running_requests=s.running_seqs,
            waiting_requests=waiting(s),
            token_usage=usage,
            active_token_usage=usage,
            gen_throughput=self.throughput,
            max_running_requests=s.max_running,
            age_ms=int(max(0.0, time.monotonic() - s.taken_at) * 1000),
            sample=seq_sample,
            load_only=load_only,
            cache_hit_rate=s.hit_rate,
            num_used_tokens=s.active_blocks * s.block_size,
            max_total_num_tokens=s.total_blocks * s.block_size,
        )

    def scheduler_load(self, s: EngineStats) -> vllm_engine_pb2.SchedulerLoad:
        """`GetLoads`' record for the reading `s` (one data-parallel rank: 0)."""
        return vllm_engine_pb2.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=s.running_seqs,
            num_waiting_reqs=waiting(s),
            num_total_reqs=s.running_seqs + waiting(s),
            num_used_tokens=s.active_blocks * s.block_size,
            max_total_num_tokens=s.total_blocks * s.block_size,
            token_usage=token_usage(s),
            gen_throughput=self.throughput,
            cache_hit_rate=s.hit_rate,
            utilization=s.running_seqs / s.max_running if s.max_running else 0.0,
            max_running_requests=s.max_running,
        )
