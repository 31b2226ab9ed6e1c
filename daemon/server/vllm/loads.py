"""Engine load for routers: the `EngineLoad` records on the KV-event stream and `GetLoads`.

NOTE: `token_usage` is the KV that running requests hold (the distinct blocks in their block tables),
not what the prefix cache retains: the cache is kept full on purpose, and smg takes a worker above
0.8 usage out of rotation, so reporting the cache would make every warm replica look overloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2

from radixd.daemon.engine.commands import EngineLoad, GetLoad
from radixd.daemon.log import get_logger

if TYPE_CHECKING:
    from radixd.daemon.engine.engine import Engine

log = get_logger("radixd.server.vllm.loads")


@dataclass(frozen=True)
class LoadSample:
    """One reading of the engine's load (taken on the engine thread)."""

    running: int
    waiting: int
    used_blocks: int
    total_blocks: int
    block_size: int
    max_running: int
    generated_tokens: int
    hit_tokens: int
    miss_tokens: int
    taken_at: float

    @property
    def token_usage(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def hit_rate(self) -> float:
        total = self.hit_tokens + self.miss_tokens
        return self.hit_tokens / total if total else 0.0

    def routing_core(self) -> tuple[int, int, int]:
        """What a router acts on: a record is resent when this changes."""
        return self.running, self.waiting, self.used_blocks


def sample_load(load: EngineLoad) -> LoadSample:
    """The reading of an engine `GetLoad`: running and waiting requests (swapped-out ones wait too)
    and the blocks running sequences hold."""
    return LoadSample(
        running=load.running,
        waiting=load.waiting + load.swapped,
        used_blocks=load.active_blocks,
        total_blocks=load.total_blocks,
        block_size=load.block_size,
        max_running=load.max_running,
        generated_tokens=load.generated_tokens,
        hit_tokens=load.hit_tokens,
        miss_tokens=load.miss_tokens,
        taken_at=load.taken_at,
    )


class LoadSampler:
    """Reads the engine's load every `interval_s` while anyone listens; keeps the latest reading and
    the generation rate between the last two."""

    def __init__(self, engine: Engine, interval_s: float = 0.25) -> None:
        self._engine = engine
        self.interval_s = interval_s
        self.latest: LoadSample | None = None
        self.throughput = 0.0
        self.samples = 0  # readings taken: a stream's record `sample` counter
        self._listeners = 0
        self._task: asyncio.Task[None] | None = None
        self.updated = asyncio.Event()

    async def read(self) -> LoadSample | None:
        """A fresh reading (None when the engine no longer answers)."""
        try:
            sample = sample_load(await asyncio.wrap_future(self._engine.execute(GetLoad())))
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

    def engine_load(self, sample: LoadSample, load_only: bool, seq_sample: int) -> common_pb2.EngineLoad:
        """The stream's load record for `sample`."""
        return common_pb2.EngineLoad(
            running_requests=sample.running,
            waiting_requests=sample.waiting,
            token_usage=sample.token_usage,
            active_token_usage=sample.token_usage,
            gen_throughput=self.throughput,
            max_running_requests=sample.max_running,
            age_ms=int(max(0.0, time.monotonic() - sample.taken_at) * 1000),
            sample=seq_sample,
            load_only=load_only,
            cache_hit_rate=sample.hit_rate,
            num_used_tokens=sample.used_blocks * sample.block_size,
            max_total_num_tokens=sample.total_blocks * sample.block_size,
        )

    def scheduler_load(self, sample: LoadSample) -> vllm_engine_pb2.SchedulerLoad:
        """`GetLoads`' record for `sample` (one data-parallel rank: 0)."""
        return vllm_engine_pb2.SchedulerLoad(
            dp_rank=0,
            num_running_reqs=sample.running,
            num_waiting_reqs=sample.waiting,
            num_total_reqs=sample.running + sample.waiting,
            num_used_tokens=sample.used_blocks * sample.block_size,
            max_total_num_tokens=sample.total_blocks * sample.block_size,
            token_usage=sample.token_usage,
            gen_throughput=self.throughput,
            cache_hit_rate=sample.hit_rate,
            utilization=sample.running / sample.max_running if sample.max_running else 0.0,
            max_running_requests=sample.max_running,
        )
