"""`EngineCore`: the engine's state and one step of work, driven by a single thread.

Components each own one concern and are reached only through their public methods; every command goes
through one table (dispatch.py). `step()`: plan, copy-on-write copies, forward, accept sampled tokens.
`Engine` runs it on its own thread; tests and offline call `run_until_idle()`."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from array import array
from collections.abc import Callable
from typing import Any, TypeVar, cast

import structlog

from radixd.daemon.engine.admin import Admin, WaitForIdle
from radixd.daemon.engine.beam import BeamSearch
from radixd.daemon.engine.commands import Abort, Command, Submit
from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.dispatch import command_table
from radixd.daemon.engine.forks import Forker
from radixd.daemon.engine.grammars import GrammarWait
from radixd.daemon.engine.jump_forward import JumpForward
from radixd.daemon.engine.kv import KVManager
from radixd.daemon.engine.outputs import Outputs
from radixd.daemon.engine.prompt_scoring import plan_scoring, scoring
from radixd.daemon.engine.requests import Requests
from radixd.daemon.engine.scheduler import Planned, Scheduler, StepPlan
from radixd.daemon.engine.sequence import SeqIds, SeqStatus, Sequence
from radixd.daemon.engine.sessions import SessionManager
from radixd.daemon.engine.speculative import Draft, Speculator
from radixd.daemon.engine.stalls import Unstaller
from radixd.daemon.engine.stats import EngineStats
from radixd.daemon.engine.swap import HostSwap
from radixd.daemon.engine.validation import Validator
from radixd.daemon.engine.watchdog import Watchdog
from radixd.daemon.errors import EngineError, InvalidRequest
from radixd.daemon.executor.runner import DecodeRows, ModelRunner, StepResult, StepSeq
from radixd.daemon.structured.cache import GrammarCache
from radixd.daemon.structured.matcher import GrammarRefused
from radixd.daemon.structured.tokenizer import llg_tokenizer
from radixd.daemon.text.tokenizer import TextTokenizer

T = TypeVar("T")

log = structlog.get_logger("radixd.engine")

# EngineStats' fields read under the same name from the tree's `CacheStats` and `SchedulerCounters`.
_FROM_TREE = ("free_blocks", "evictable_blocks", "in_use_blocks", "cached_blocks", "pinned_blocks")
_FROM_SCHEDULER = (
    "hit_tokens",
    "miss_tokens",
    "preemptions_recompute",
    "preemptions_swap",
    "swap_fallbacks",
    "held_for_shared_prefix",
)

_NO_BLOCKS: array[int] = array("i")  # a planned sequence with no table yet (the runner only reads it)


class EngineCore:
    """Engine state and the step function (single-threaded), composed of the components above."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: TextTokenizer,
        config: EngineConfig | None = None,
        eos_token_ids: tuple[int, ...] = (),
        grammars: GrammarCache | None = None,
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
        layout = runner.layout
        self.kv = KVManager.create(
            runner.num_blocks, runner.block_size, cfg, layout.window, layout.sliding_groups
        )
        self.swap = HostSwap(runner, cfg.num_host_blocks) if cfg.preemption_mode == "swap" else None
        seq_ids = SeqIds()
        self.forker = Forker(self.kv, seq_ids, tokenizer, self.eos_token_ids)
        self.scheduler = Scheduler(cfg, self.kv, self.swap, self.forker)
        self.sessions = SessionManager(self.kv, cfg.session_ttl_s)
        self.validator = Validator(self.kv, self.max_model_len, self.vocab_size)
        # Constraints compile off this thread, once per canonical form, over this model's tokenizer.
        if grammars is None:
            grammars = GrammarCache(
                functools.partial(llg_tokenizer, tokenizer, self.vocab_size, self.eos_token_ids)
            )
        self.grammars = grammars
        self.outputs = Outputs(self.scheduler, self.kv, self.swap, self.max_model_len, cfg.stream_interval)
        self.watchdog = Watchdog(cfg.watchdog_s, self.scheduler, self.kv)
        self.jump_forward = JumpForward(self.outputs, cfg.jump_forward)
        self.speculator = Speculator(self.kv, self.outputs, self.max_model_len, cfg.speculative_tokens)
        self.requests = Requests(
            self.validator,
            GrammarWait(self.grammars),
            self.sessions,
            self.forker,
            self.scheduler,
            self.outputs,
            self.watchdog.progressed,
        )
        self.beams = BeamSearch(
            self.scheduler,
            self.kv,
            self.outputs,
            self.requests.finish,
            tokenizer,
            seq_ids,
            self.eos_token_ids,
            self.max_model_len,
        )
        self.admin = Admin(self.requests, self.scheduler, self.kv)
        self.unstaller = Unstaller(self.scheduler, self.sessions, self.kv, self.validator, self.requests)
        self._commands = command_table(
            self.requests, self.admin, self.sessions, self.validator, self.kv, self.stats
        )
        self.steps = 0  # steps that computed tokens
        self.generated_tokens = 0
        self.errors = 0  # unexpected errors survived (a step, a command, a timer)
        # Called right before each forward pass (`Engine`: hands the outputs emitted so far over).
        self.before_forward: Callable[[], None] | None = None

    # ---- commands --------------------------------------------------------------------------------
    def execute(self, cmd: Command[T]) -> T:
        """Apply any engine command now; -> its result (a busy "wait_for_idle" flush raises `WaitForIdle`)."""
        handler = self._commands.get(type(cmd))
        if handler is None:
            names = ", ".join(sorted(k.__name__ for k in self._commands))
            raise InvalidRequest(f"{type(cmd).__name__} is not an engine command; the engine runs {names}")
        return cast(T, handler(cmd))

    def apply(self, cmd: Command[Any], fut: concurrent.futures.Future[Any] | None) -> None:
        """Run a queued command; its result or error goes to `fut` (None: the request's sink hears)."""
        if fut is not None and not fut.set_running_or_notify_cancel():
            return
        try:
            result = self.execute(cmd)
        except WaitForIdle as wait:
            assert fut is not None  # only a Flush waits, and every Flush has a caller
            self.admin.wait_for_idle(time.monotonic() + wait.timeout_s, fut)
            return
        except Exception as exc:
            if fut is not None and isinstance(exc, EngineError):  # the caller's mistake, theirs to hear
                fut.set_exception(exc)
                return
            self.errors += 1
            rid = cmd.req.request_id if isinstance(cmd, Submit) else getattr(cmd, "request_id", None)
            log.exception("engine.command_failed", command=type(cmd).__name__, request_id=rid)
            if isinstance(cmd, Submit):
                self.requests.fail_submit(cmd.req, cmd.sink, exc)
            elif isinstance(cmd, Abort):
                self.requests.fail(cmd.request_id, exc)
            elif fut is not None:
                fut.set_exception(exc)
            return
        if fut is not None:
            fut.set_result(result)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.requests.grammars)

    # ---- stats -----------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Every component's counts and gauges in one record (`GetStats`)."""
        sc, kv, req, swap = self.scheduler.counters, self.kv, self.requests, self.swap
        cache = kv.cache_stats()
        sliding = kv.sliding
        same = {k: getattr(cache, k) for k in _FROM_TREE} | {k: getattr(sc, k) for k in _FROM_SCHEDULER}
        return EngineStats(
            **same,
            taken_at=time.monotonic(),
            waiting_seqs=len(self.scheduler.waiting),
            running_seqs=len(self.scheduler.running),
            swapped_seqs=len(self.scheduler.swapped),
            requests_in_flight=len(req),
            sessions=len(self.sessions),
            max_waiting=self.config.max_waiting,
            max_running=self.config.max_num_seqs,
            block_size=kv.block_size,
            total_blocks=cache.usable_blocks,
            active_blocks=self.admin.active_blocks(),
            peak_used_blocks=self.admin.peak_used_blocks,
            peak_active_blocks=self.admin.peak_active_blocks,
            cache_nodes=cache.nodes,
            requests_finished=req.finished,
            requests_aborted=req.aborted,
            requests_rejected=req.rejected,
            prompt_tokens=req.prompt_tokens,
            cached_tokens=req.cached_tokens,
            generated_tokens=self.generated_tokens,
            steps=self.steps,
            errors=self.errors,
            no_progress_reports=self.watchdog.reports,
            session_leases_shed=self.sessions.shed,
            evicted_blocks=kv.evicted_blocks,
            evictions=dict(cache.evicted_blocks),
            host_free_blocks=swap.num_free if swap is not None else 0,
            swapped_out_blocks=swap.swapped_out_blocks if swap is not None else 0,
            swapped_in_blocks=swap.swapped_in_blocks if swap is not None else 0,
            kv_layout="windowed" if sliding is not None else "full",
            kv_bytes_per_block=self.runner.kv_bytes_per_block,
            window_pages=len(sliding.store.pages()) if sliding is not None else 0,
            kept_windows=len(sliding.store) if sliding is not None else 0,
            window_tombstones=sliding.store.dropped if sliding is not None else 0,
            window_cut_tokens=sliding.cut_tokens if sliding is not None else 0,
            kv_windows=self.config.kv_windows if sliding is not None else "",
            drafted_tokens=self.speculator.drafted_tokens,
            accepted_draft_tokens=self.speculator.accepted_tokens,
            draft_s=self.speculator.draft_s,
        )

    # ---- the step --------------------------------------------------------------------------------
    def step(self) -> bool:
        """Schedule and run one step; -> whether any token was computed."""
        if self.requests.grammars:
            self.requests.admit_compiled()
        plan = self.scheduler.schedule()
        # Pending work that plans nothing is stalled on memory, which only a lease's TTL would free.
        while not plan and self.scheduler.has_work() and self.unstaller.unstall():
            plan = self.scheduler.schedule()
        self.admin.track_peaks()
        if not plan:
            return False
        spec = self.speculator
        t0 = time.perf_counter()
        drafts = spec.plan(plan, self._spare_tokens(plan)) if spec.enabled else []
        self.runner.copy_blocks(self.kv.take_copies())
        if self.requests.scoring:
            plan_scoring(plan, self.requests.scoring)
        ds = plan.decodes
        # One-token rows are built a column at a time (`Sequence.sampling_at` says which sample).
        rows = DecodeRows(
            [s.seq_id for s in ds],
            [s.tokens[s.num_computed] for s in ds],
            [s.num_computed for s in ds],
            [s.table.blocks if s.table is not None else _NO_BLOCKS for s in ds],
            [s.sampling_at(s.num_computed + 1) for s in ds],
            [s.window.pages if s.window is not None else () for s in ds] if self.kv.sliding else [],
        )
        chunks = [self._step_seq(p) for p in plan.chunks]
        chunks += [self.speculator.step_seq(d) for d in drafts]
        if self.before_forward is not None:
            self.before_forward()
        results = self.runner.run(chunks, rows)
        self.steps += 1
        self.watchdog.progressed()
        if drafts:
            n = len(plan.chunks)
            self._after_drafts(drafts, results[n : n + len(drafts)])
            del results[n : n + len(drafts)]
        self._after_step(plan, rows.positions, results)
        if spec.enabled:  # the draft budget learns what a step of this many rows costs here
            seconds = time.perf_counter() - t0
            spec.observe(len(rows) + sum(len(c.token_ids) for c in chunks), seconds, bool(drafts))
        return True

    def _spare_tokens(self, plan: StepPlan) -> int:
        """The step's token budget left after what the scheduler planned (drafts may use it)."""
        return self.config.max_num_batched_tokens - sum(p.n for p in plan.chunks) - len(plan.decodes)

    def _after_drafts(self, drafts: list[Draft], results: list[StepResult]) -> None:
        """Accept what verification kept of each draft (speculative.py)."""
        accepted = 0
        for d, res in zip(drafts, results, strict=True):
            # As in `_after_step`: an earlier ending in this loop may have finished this one.
            seq = d.seq
            if seq.status is not SeqStatus.RUNNING or not isinstance(res, list):
                continue
            try:
                n, ended = self.speculator.accept(d, res)
                accepted += n
                st = seq.sampling
                if not ended and st is not None and st.grammar is not None:
                    forced, ended = self.jump_forward.extend(seq)  # after the last accepted token
                    accepted += forced
            except GrammarRefused as exc:  # as in `_after_step`: this request alone
                self._refused(seq, exc)
                continue
            if ended:
                self.requests.finish(seq.request)
        self.generated_tokens += accepted

    @staticmethod
    def _step_seq(p: Planned) -> StepSeq:
        """What the runner computes for one planned sequence (it samples once its tokens are all in)."""
        seq = p.seq
        end = p.start + p.n
        blocks = seq.table.blocks if seq.table is not None else _NO_BLOCKS
        windows = seq.window.pages if seq.window is not None else ()
        return StepSeq(
            seq.seq_id,
            seq.tokens[p.start : end],
            p.start,
            blocks,
            seq.sampling_at(end),
            scoring(seq),
            window_tables=windows,
        )

    def step_safely(self) -> bool:
        """`step()`, but an unexpected error fails the requests in flight instead of the engine."""
        try:
            return self.step()
        except Exception as exc:
            self.errors += 1
            log.exception("engine.step_failed", requests=list(self.requests.ids()))
            # Every request in flight fails: a half-applied step leaves no state to trust.
            for rid in self.requests.ids():
                self.requests.fail(rid, exc)
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
            if self.requests.grammars:  # nothing to run until a grammar compiles (off this thread)
                self.requests.grammars.wait(1.0)
                continue
            self.tick()
            idle_steps += 1
            if idle_steps > 2 and self.has_work():
                raise RuntimeError(
                    f"no progress: {len(self.scheduler.waiting)} waiting, {self.kv.num_free} free blocks"
                )
        raise RuntimeError(f"still busy after {max_steps} steps")

    def _after_step(self, plan: StepPlan, positions: list[int], results: list[StepResult]) -> None:
        """Record what the step computed, publish full blocks, accept tokens (`results`: chunks, decodes)."""
        done = [(p.seq, p.start + p.n) for p in plan.chunks]
        done += zip(plan.decodes, [p + 1 for p in positions], strict=True)
        kv, outputs, requests = self.kv, self.outputs, self.requests
        accepted = 0
        for (seq, computed), res in zip(done, results, strict=True):
            # An earlier ending in this loop may have finished this one (it has no table left).
            if seq.status is not SeqStatus.RUNNING:
                continue
            seq.num_computed = computed
            kv.insert_full_blocks(seq)
            if seq.index < 0:  # a root: forks into its children once its prompt is computed
                if seq.remaining == 0:
                    self.scheduler.fork_root(seq)
            elif res is not None and not isinstance(res, list):
                try:
                    if seq.request.req.beam_width:
                        self.beams.step(seq, res)
                    else:
                        ended = outputs.accept(seq, res)
                        accepted += 1
                        st = seq.sampling
                        if not ended and st is not None and st.grammar is not None:
                            forced, ended = self.jump_forward.extend(seq)  # what its grammar forces next
                            accepted += forced
                        if ended:
                            requests.finish(seq.request)
                except GrammarRefused as exc:  # this request alone: its constraint's dead end, or a bug
                    self._refused(seq, exc)
        self.generated_tokens += accepted

    def _refused(self, seq: Sequence, exc: GrammarRefused) -> None:
        """Fail `seq`'s request over a token its grammar refused (the client's fault, or a bug)."""
        if exc.client_fault:
            self.requests.fail(seq.request.request_id, InvalidRequest(str(exc)))
        else:
            self.errors += 1
            self.requests.fail(seq.request.request_id, exc)

    # ---- timers ----------------------------------------------------------------------------------
    def idle_wait_s(self) -> float:
        """How long the engine thread may block on its queue (short while work or a flush waits)."""
        if self.requests.grammars:  # a compile may finish any moment: its request starts soon after
            return 0.002
        return 0.01 if self.has_work() or self.admin.has_flush_waiters else 0.25

    def tick(self) -> None:
        """Timers: session TTLs, flush waiters, the no-progress watchdog."""
        now = time.monotonic()
        self.sessions.expire(now)
        if self.admin.has_flush_waiters:
            self.errors += self.admin.serve_flush_waiters(now)
        self.watchdog.check(now)
