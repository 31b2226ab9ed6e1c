"""The draft budget inside the engine (engine/draft_budget.py, engine/speculative.py): the default
configuration drafts, a step its decode rows fill gets no drafts when the step costs say so, and the
engine feeds the budget its own step timings. Outputs stay plain decoding's throughout."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from engine_kit import fixed_cost, make_core, run
from invariance_kit import Rig, answer, ask, assert_same

from radixd.daemon.engine.config import EngineConfig
from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.scheduler import StepPlan
from radixd.daemon.engine.speculative import Draft
from radixd.daemon.engine.types import GenerateRequest

pytestmark = pytest.mark.slow

# A file an agent rewrites: the prompt quotes it, then starts its rewrite (the model copies it).
FILE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "def describe(width, height):\n    print('area', area(width, height))\n"
)
COPY = f"Here is a file:\n{FILE}\nRewrite it with comments.\n\n{FILE[:25]}"


def weight_bound(rows: int) -> float:
    """A CPU-like step: up to 4 rows cost what 1 costs (reading the weights), then 1.5 ms a row."""
    return 0.006 + 0.0015 * max(0, rows - 4)


def record_plans(core: EngineCore) -> list[tuple[int, int, int]]:
    """Wrap the speculator's `plan`: each step's (chunk rows, decode rows, draft rows), appended."""
    steps: list[tuple[int, int, int]] = []
    spec = core.speculator
    plan: Callable[[StepPlan, int], list[Draft]] = spec.plan

    def recorded(p: StepPlan, budget: int) -> list[Draft]:
        decodes, chunk_rows = len(p.decodes), sum(c.n for c in p.chunks)
        drafts = plan(p, budget)
        steps.append((chunk_rows, decodes, sum(len(d.proposed) for d in drafts)))
        return drafts

    spec.plan = recorded  # type: ignore[method-assign]
    return steps


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_the_default_config_drafts_with_plain_decodings_output(rig: Rig) -> None:
    assert EngineConfig().speculative_tokens > 0
    ids = rig.lm.tokenizer.encode(COPY)
    req = [GenerateRequest("copy", ids, ask(16))]
    off = make_core(rig.lm, num_blocks=128, speculative_tokens=0)
    on = fixed_cost(make_core(rig.lm, num_blocks=128), weight_bound)
    want = {"copy": answer(run(off, req), "copy")}
    got = {"copy": answer(run(on, req), "copy")}
    assert_same(got, want, "the default config vs speculation off")
    assert on.speculator.accepted_tokens >= 8
    assert off.stats().drafted_tokens == 0


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_a_step_full_of_decode_rows_gets_no_drafts(rig: Rig) -> None:
    """Eight copies decoding together on a machine where a row past the fourth costs what a decode
    row yields: no drafts in those steps, though each copy alone drafts."""
    ids = rig.lm.tokenizer.encode(COPY)
    reqs = [GenerateRequest(f"c{i}", ids, ask(12)) for i in range(8)]
    off = make_core(rig.lm, num_blocks=256, speculative_tokens=0)
    on = fixed_cost(make_core(rig.lm, num_blocks=256), weight_bound)
    steps = record_plans(on)
    col_off, col_on = run(off, reqs), run(on, reqs)
    assert_same(
        {r.request_id: answer(col_on, r.request_id) for r in reqs},
        {r.request_id: answer(col_off, r.request_id) for r in reqs},
        "batch 8, speculation on vs off",
    )
    full = [s for s in steps if s[0] == 0 and s[1] == 8]
    assert len(full) >= 8 and all(drafted == 0 for _, _, drafted in full), steps
    steps.clear()
    run(on, [GenerateRequest("alone", ids, ask(12))])
    assert any(drafted for _, _, drafted in steps), steps


@pytest.mark.parametrize("rig", ["float32"], indirect=True)
def test_the_engine_feeds_the_budget_its_step_timings(rig: Rig) -> None:
    core = make_core(rig.lm, num_blocks=128)
    cost = core.speculator.budget.cost
    assert cost(1) is None
    ids = rig.lm.tokenizer.encode(COPY)
    run(core, [GenerateRequest(f"r{i}", ids, ask(32)) for i in range(2)])
    seconds = cost(1)
    assert seconds is not None and 0 < seconds < 10
    off = make_core(rig.lm, num_blocks=128, speculative_tokens=0)
    run(off, [GenerateRequest("r", ids, ask(4))])
    assert off.speculator.budget.cost(1) is None  # speculation off: nothing is timed for it
