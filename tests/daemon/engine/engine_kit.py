"""Test helpers for the engine: build a core over the session model, collect outputs, check leaks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.draft_budget import StepCost
from radixd.daemon.engine.factory import build_core
from radixd.daemon.engine.types import GenerateRequest, RequestOutput
from radixd.daemon.executor.sampling import SamplingParams
from radixd.daemon.loaders import LoadedModel

SYSTEM = (
    "You are a careful assistant. Answer briefly and precisely, cite no sources, and keep a friendly tone. "
    "When you do not know something, say so plainly instead of guessing."
)
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "What is 12 times 12?",
    "Who wrote Hamlet?",
    "What gas do plants absorb?",
]


def make_core(lm: LoadedModel, num_blocks: int = 512, **config: Any) -> EngineCore:
    return build_core(lm, EngineConfig(**config), num_blocks=num_blocks)


def greedy(max_tokens: int = 12, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def sampled(seed: int, max_tokens: int = 12, **kw: Any) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.8, top_p=0.95, seed=seed, ignore_eos=True, **kw
    )


class Collector:
    """A sink that keeps every output by (request id, index)."""

    def __init__(self) -> None:
        self.outs: dict[tuple[str, int], list[RequestOutput]] = defaultdict(list)

    def __call__(self, out: RequestOutput) -> None:
        self.outs[(out.request_id, out.index)].append(out)

    def tokens(self, rid: str, index: int = 0) -> list[int]:
        return [t for o in self.outs[(rid, index)] for t in o.new_token_ids]

    def text(self, rid: str, index: int = 0) -> str:
        return "".join(o.text_delta for o in self.outs[(rid, index)])

    def final(self, rid: str, index: int = 0) -> RequestOutput:
        outs = self.outs[(rid, index)]
        assert outs and outs[-1].finished, f"{rid}[{index}] did not finish"
        return outs[-1]

    def finished(self, rid: str, index: int = 0) -> bool:
        outs = self.outs.get((rid, index)) or []
        return bool(outs) and outs[-1].finished


def run(core: EngineCore, reqs: Iterable[GenerateRequest], col: Collector | None = None) -> Collector:
    col = col or Collector()
    for r in reqs:
        core.requests.add(r, col)
    core.run_until_idle()
    return col


def step_until(core: EngineCore, done: Callable[[], bool], max_steps: int = 10_000) -> None:
    """Drive steps until `done()`; a step that computes nothing is fine only while a grammar compiles
    (off the engine thread), and then waits for it instead of spinning."""
    for _ in range(max_steps):
        if done():
            return
        if core.step():
            continue
        assert core.requests.grammars, f"the engine went idle first: {core.stats()}"
        core.requests.grammars.wait(1.0)
    raise AssertionError(f"not done after {max_steps} steps")


def assert_all_free(core: EngineCore) -> None:
    """After every request ended: nothing in flight, and a flush frees every block."""
    assert not core.requests and not core.has_work()
    core.admin.flush("evict_unlocked")
    assert core.kv.pool.num_free == core.kv.usable_blocks(), (
        f"{core.kv.usable_blocks() - core.kv.pool.num_free} blocks leaked: {core.stats()}"
    )
    assert core.kv.tree.num_leases == 0


class FixedCost(StepCost):
    """A machine whose steps cost `seconds(rows)` whatever the clock says: a core given it
    (`fixed_cost`) drafts the same in every run, however busy the machine running the test is."""

    def __init__(self, seconds: Callable[[int], float]) -> None:
        super().__init__()
        self._seconds = seconds

    def observe(self, rows: int, seconds: float, drafted: bool = False) -> None:
        pass

    def __call__(self, rows: int, drafted: bool = False) -> float:
        return self._seconds(rows)


def cheap_rows(rows: int) -> float:
    """A step whose rows cost next to nothing beside its fixed cost (a GPU, a wide kernel): drafts
    go in whenever they are likely at all."""
    return 0.01 + 1e-6 * rows


def fixed_cost(core: EngineCore, seconds: Callable[[int], float] = cheap_rows) -> EngineCore:
    """`core`, its draft budget reading `seconds` instead of its step timings."""
    core.speculator.budget.cost = FixedCost(seconds)
    return core
