"""`EngineCore`: the engine's state and one step of work, driven by a single thread.

It is composed of components, each owning one concern and reached only through its public methods:
`kv` (KVManager: the only engine module that calls the radix tree and the device pool),
`scheduler`, `sessions`, `forker` (a request's sequences and CoW forks), `beams` (beam search),
`outputs` (token acceptance, streaming, endings), `admin` (eviction, flushes, pins, load, stats),
`validator` (fixed limits), `intake` (admission and aborts, intake.py), `commands` (applies admin /
session commands, commands.py), `faults` (what an unexpected error fails, faults.py) and `watchdog`
(stalled work reported, watchdog.py).

`step()` asks the scheduler for a plan, applies copy-on-write copies, runs the model, then accepts
sampled tokens: text deltas go to each request's sink, finished sequences insert their tokens into the
tree and free their blocks. `Engine` (engine.py) runs this on its own thread; tests and the offline
CLI may drive it directly with `run_until_idle()` and the components' methods.
"""

from __future__ import annotations

import concurrent.futures
import time
from array import array
from collections.abc import Callable
from typing import TypeVar, cast

import structlog

from radixd.daemon.engine.admin import Admin
from radixd.daemon.engine.beam import BeamSearch
from radixd.daemon.engine.commands import Command, Flush
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.dispatch import CommandRunner
from radixd.daemon.engine.faults import Faults
from radixd.daemon.engine.forks import Forker
from radixd.daemon.engine.intake import Intake
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.scheduler import Planned, Scheduler, StepPlan
from radixd.daemon.engine.sequence import RequestState, SeqIds, SeqStatus
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.swap import HostSwap
from radixd.daemon.engine.types import GenerateRequest, Sink
from radixd.daemon.engine.validation import Validator
from radixd.daemon.engine.watchdog import Watchdog
from radixd.daemon.runner import DecodeRows, ModelRunner, StepSeq
from radixd.daemon.sampling import SampleResult
from radixd.daemon.tokenizer import TextTokenizer

T = TypeVar("T")

log = structlog.get_logger("radixd.engine")

_NO_BLOCKS: array[int] = array("i")  # a planned sequence with no table yet (the runner only reads it)


class EngineCore:
    """Engine state and the step function (single-threaded), composed of the components above."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: TextTokenizer,
        config: EngineConfig | None = None,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.config = config or EngineConfig()
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.block_size = runner.block_size
        self.vocab_size = runner.config.vocab_size
        model_len = int(getattr(runner.config, "max_position_embeddings", 0) or 0) or 8192
        self.max_model_len = self.config.max_model_len or model_len
        cfg = self.config
        self.kv = KVManager.create(runner.num_blocks, runner.block_size, cfg)
        self.swap = HostSwap(runner, cfg.num_host_blocks) if cfg.preemption_mode == "swap" else None
        seq_ids = SeqIds()
        self.forker = Forker(self.kv, seq_ids, tokenizer, self.eos_token_ids)
        self.scheduler = Scheduler(cfg, self.kv, self.swap, self.forker)
        self.sessions = SessionManager(self.kv, cfg.session_ttl_s)
        self.validator = Validator(self.kv, self.max_model_len, self.vocab_size)
        self.requests: dict[str, RequestState] = {}
        self.counters: dict[str, int] = {
            "requests_finished": 0,
            "requests_aborted": 0,
            "requests_rejected": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "steps": 0,
            "no_progress_reports": 0,
            "errors": 0,
        }
        self.outputs = Outputs(
            self.requests,
            self.scheduler,
            self.kv,
            self.swap,
            self.sessions,
            self.counters,
            self.max_model_len,
            self.config.stream_interval,
        )
        self.beams = BeamSearch(
            self.scheduler, self.kv, self.outputs, tokenizer, seq_ids, self.eos_token_ids, self.max_model_len
        )
        self.admin = Admin(
            cfg, self.requests, self.counters, self.scheduler, self.kv, self.sessions, self.swap
        )
        self.commands = CommandRunner(self.admin, self.sessions, self.validator, self.kv)
        self.faults = Faults(self.requests, self.outputs, self.sessions)
        self.watchdog = Watchdog(cfg.watchdog_s, self.scheduler, self.kv, self.counters)
        self.intake = Intake(
            self.requests,
            self.counters,
            self.validator,
            self.sessions,
            self.forker,
            self.scheduler,
            self.outputs,
            on_first_work=self.watchdog.progressed,
        )

    @property
    def on_request_done(self) -> Callable[[str], None]:
        """Called with a request's id once it ended (every outcome, rejections included)."""
        return self.outputs.on_request_done

    @on_request_done.setter
    def on_request_done(self, hook: Callable[[str], None]) -> None:
        self.outputs.on_request_done = hook

    # ---- commands --------------------------------------------------------------------------------
    def execute(self, cmd: Command[T]) -> T:
        """Apply an admin / session command now (engine thread); -> its result. A "wait_for_idle"
        flush of a busy engine needs the engine loop: `request_flush` (what `Engine.execute` uses)."""
        return cast(T, self.commands.run(cmd))

    def request_flush(self, cmd: Flush, fut: concurrent.futures.Future[int]) -> None:
        """Resolve `fut` with the flush `cmd`: now, or for "wait_for_idle" once no request is in flight."""
        self.admin.request_flush(cmd.mode, cmd.timeout_s, fut)

    # ---- requests --------------------------------------------------------------------------------
    def add_request(self, req: GenerateRequest, sink: Sink) -> None:
        """Queue a request, or reject it through `sink` with the reason (engine thread)."""
        self.intake.add(req, sink)

    def abort_request(self, request_id: str) -> bool:
        """Abort by id: idempotent; an id not seen yet is remembered so a late submit ends at once."""
        return self.intake.abort(request_id)

    def abort_all(self, reason: str) -> None:
        self.intake.abort_all(reason)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- the step --------------------------------------------------------------------------------
    def step(self) -> bool:
        """Schedule and run one step; -> whether any token was computed."""
        plan = self.scheduler.schedule()
        # NOTE: pending work that plans nothing is stalled on memory, and nothing else would free it
        # before a session lease lapses (the TTL, 600 s by default): free room until something fits.
        while not plan and self.scheduler.has_work() and self._unstall():
            plan = self.scheduler.schedule()
        self.admin.track_peaks()
        if not plan:
            return False
        self.runner.copy_blocks(self.kv.take_copies())
        ds = plan.decodes
        # NOTE: one-token rows are built a column at a time (not a root's last prompt token, nor a
        # one-token prefill chunk, samples: `Sequence.sampling_at`).
        rows = DecodeRows(
            [s.seq_id for s in ds],
            [s.tokens[s.num_computed] for s in ds],
            [s.num_computed for s in ds],
            [s.table.blocks if s.table is not None else _NO_BLOCKS for s in ds],
            [s.sampling_at(s.num_computed + 1) for s in ds],
        )
        results = self.runner.run([self._step_seq(p) for p in plan.chunks], rows)
        self.counters["steps"] += 1
        self.watchdog.progressed()
        self._after_step(plan, rows.positions, results)
        return True

    @staticmethod
    def _step_seq(p: Planned) -> StepSeq:
        """What the runner computes for one planned sequence (it samples once its tokens are all in)."""
        seq = p.seq
        end = p.start + p.n
        blocks = seq.table.blocks if seq.table is not None else _NO_BLOCKS
        return StepSeq(seq.seq_id, seq.tokens[p.start : end], p.start, blocks, seq.sampling_at(end))

    def _unstall(self) -> bool:
        """Free room for stalled work, one move at a time; -> whether anything changed.

        First an idle session's lease goes (earliest expiry first; the session stays open and its
        prefix stays cached, now evictable). With no lease left to shed and nothing running, the oldest
        swapped-out sequence falls back to recompute: its swap-in needs fresh blocks for every computed
        token, while re-admission shares what the cache still holds (a busy session's lease locks the
        very prefix its swapped-out turn carries on the host), so recompute can fit where swap-in
        cannot. Both preemption modes therefore progress whenever the pool can hold the work.
        """
        sched = self.scheduler
        if self.sessions.shed_one():
            log.info(
                "engine.session_lease_shed",
                waiting=len(sched.waiting),
                swapped=len(sched.swapped),
                free_blocks=self.kv.num_free,
            )
            return True
        if sched.running or not sched.swapped:
            return False
        seq = sched.swapped_to_recompute()
        log.info(
            "engine.swap_fallback_recompute",
            request_id=seq.request.request_id,
            seq_id=seq.seq_id,
            tokens=len(seq.tokens),
            free_blocks=self.kv.num_free,
        )
        return True

    def step_safely(self) -> bool:
        """`step()`, but an unexpected error fails the requests in flight instead of the engine."""
        try:
            return self.step()
        except Exception as exc:
            self.counters["errors"] += 1
            log.exception("engine.step_failed", requests=list(self.requests))
            # NOTE: every request in flight fails, not only those in the step: a half-applied step
            # (slots appended, tokens not accepted, copies queued) leaves no state to trust, and a
            # request that breaks scheduling itself would otherwise fail every step after this one.
            for rid in list(self.requests):
                self.faults.fail_request(rid, exc)
            self.kv.take_copies()
            return False

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        """Drive steps on the calling thread until nothing is left (tests, offline)."""
        idle_steps = 0
        for _ in range(max_steps):
            if not self.has_work():
                return
            if self.step():
                idle_steps = 0
                continue
            self.tick()
            idle_steps += 1
            if idle_steps > 2 and self.has_work():
                raise RuntimeError(
                    f"no progress: {len(self.scheduler.waiting)} waiting, {self.kv.num_free} free blocks"
                )
        raise RuntimeError(f"still busy after {max_steps} steps")

    def _after_step(self, plan: StepPlan, positions: list[int], results: list[SampleResult | None]) -> None:
        """Record what the step computed (`positions`: where each decode computed its token), publish
        newly full blocks, accept the sampled tokens. `results`: the chunks', then the decodes'."""
        done = [(p.seq, p.start + p.n) for p in plan.chunks]
        done += zip(plan.decodes, [p + 1 for p in positions], strict=True)
        kv, outputs = self.kv, self.outputs
        accepted = 0
        for (seq, computed), res in zip(done, results, strict=True):
            # NOTE: an earlier sequence's ending in this loop may have finished this one (a request's
            # last output ends all its indexes); a finished sequence has no table left to record into.
            if seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed = computed
            kv.insert_full_blocks(seq)
            if seq.index < 0:  # a root: forks into its children once its prompt is computed
                if seq.remaining == 0:
                    self.scheduler.fork_root(seq)
            elif res is not None:
                if seq.request.req.beam_width:
                    self.beams.step(seq, res)
                else:
                    outputs.accept(seq, res)
                    accepted += 1
        self.counters["generated_tokens"] += accepted

    # ---- timers ----------------------------------------------------------------------------------
    def idle_wait_s(self) -> float:
        """How long the engine thread may block on its queue: short while work is pending (a stalled
        step retries soon) or a flush waits for idle, longer when there is nothing to do."""
        return 0.01 if self.has_work() or self.admin.has_flush_waiters else 0.25

    def tick(self) -> None:
        """Timers: session TTLs, flush waiters, the no-progress watchdog."""
        now = time.monotonic()
        self.sessions.expire(now)
        if self.admin.has_flush_waiters:
            self.admin.serve_flush_waiters(now)
        self.watchdog.check(now)
