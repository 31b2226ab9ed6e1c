"""The draft budget (engine/draft_budget.py) fed known step timings: it drafts while rows are nearly
free, stops as decode rows fill the step, prefers the sequences whose drafts are accepted, and learns
the cost curve and acceptance rates from what it is told."""

from __future__ import annotations

from typing import cast

import pytest

from radixd.daemon.engine.draft_budget import Acceptance, DraftBudget, StepCost


def weight_bound(rows: int) -> float:
    """A machine where 4 rows cost what 1 costs (the weights' stream), then 1.5 ms a row."""
    return 0.006 + 0.0015 * max(0, rows - 4)


def learned(curve: object = weight_bound, rows: range = range(1, 80)) -> StepCost:
    cost = StepCost()
    for _ in range(2):  # a bucket counts from its second step
        for r in rows:
            cost.observe(r, curve(r))  # type: ignore[operator]
    return cost


def test_cost_follows_the_timings_it_is_fed() -> None:
    cost = learned()
    for r in (1, 2, 4, 8, 16, 33, 64, 79):
        assert cost(r) == pytest.approx(weight_bound(r), rel=0.08)
    assert cost(120) == pytest.approx(weight_bound(120), rel=0.08)  # extrapolated along the last slope


def test_cost_is_unknown_then_flat_then_never_decreasing() -> None:
    cost = StepCost()
    assert cost(4) is None
    cost.observe(1, 0.5)  # a cold first step (page faults, a build): not counted
    assert cost(1) is None
    cost.observe(1, 0.01)
    assert cost(1) == cost(50) == 0.01  # one bucket: more rows are assumed free until measured
    cost.observe(8, 0.008)
    cost.observe(8, 0.008)  # noise said 8 rows were cheaper than 1
    assert cost(8) == 0.01
    cost.observe(0, 1.0)  # an empty step teaches nothing
    cost.observe(8, 0.0)
    assert cost(8) == 0.01


def test_cost_follows_a_slower_machine_slowly_and_a_faster_one_at_once() -> None:
    cost = learned()
    cost.observe(8, 10 * weight_bound(8))  # one stall moves the estimate a tenth of the way
    assert cost(8) < 2 * weight_bound(8)
    for _ in range(60):
        cost.observe(8, 3 * weight_bound(8))
    assert cost(8) == pytest.approx(3 * weight_bound(8), rel=0.01)
    for _ in range(8):
        cost.observe(8, weight_bound(8))
    assert cost(8) == pytest.approx(weight_bound(8), rel=0.01)


def test_a_drafted_step_costs_its_learned_extra() -> None:
    cost = learned()
    assert cost(8, drafted=True) == cost(8)  # no drafted step seen: no extra assumed
    for _ in range(20):
        cost.observe(8, weight_bound(8) + 0.003, drafted=True)
    assert cost(8, drafted=True) == pytest.approx(weight_bound(8) + 0.003, rel=0.02)
    assert cost(8) == pytest.approx(weight_bound(8), rel=0.08)  # plain steps' buckets untouched
    assert cost(64, drafted=True) == pytest.approx(cost(64) + 0.003, rel=0.1)  # the nearest extra
    for _ in range(2):  # an extra counts from its second step, as a bucket does
        cost.observe(64, cast(float, cost(64)) + 0.001, drafted=True)
    assert cost(64, drafted=True) == pytest.approx(cost(64) + 0.001)  # each bucket its own
    assert cost(8, drafted=True) == pytest.approx(weight_bound(8) + 0.003, rel=0.02)
    budget = DraftBudget(cost)
    budget.start(rows=2, tokens=2)
    assert budget.rows_for(0.6, 8) == 0  # 3 ms for a drafted step: more than 0.6 of a token buys
    budget = DraftBudget(learned())
    budget.start(rows=2, tokens=2)
    assert budget.rows_for(0.6, 8) > 0


def test_a_first_slow_drafted_step_does_not_stop_drafting_at_its_row_count() -> None:
    """The first drafted step at 9 rows paid a one-off 25 ms (scratch memory faulted in): it is not
    what such a step costs, so 9-row drafts are still tried, and the next one's timing counts."""

    def wide(rows: int) -> float:  # a machine whose weights' stream hides 16 rows
        return 0.006 + 0.0015 * max(0, rows - 16)

    cost = learned(wide)
    for _ in range(2):
        cost.observe(3, wide(3), drafted=True)
    cost.observe(9, wide(9) + 0.025, drafted=True)
    assert cost(9, drafted=True) == pytest.approx(wide(9), rel=0.05)  # the 3-row steps' extra stands in
    budget = DraftBudget(cost)
    budget.start(rows=1, tokens=1)
    assert budget.rows_for(0.9, 8) == 8
    cost.observe(9, wide(9) + 0.0002, drafted=True)
    assert cost(9, drafted=True) == pytest.approx(wide(9) + 0.0002, rel=0.05)


def test_buckets_not_seen_for_long_are_dropped() -> None:
    cost = StepCost(stale_steps=64)
    for _ in range(2):
        cost.observe(1, 0.01)
        cost.observe(16, 0.05)
    for _ in range(200):
        cost.observe(1, 0.01)
    assert cost(16) == 0.01  # 16 rows unmeasured lately: tried again as if free


def test_drafts_while_weight_bound_and_none_when_decode_rows_fill_the_step() -> None:
    budget = DraftBudget(learned())
    budget.start(rows=1, tokens=1)
    assert budget.rows_for(0.9, 8) >= 3  # batch 1: rows ride the weights' stream
    budget.start(rows=48, tokens=48)
    assert budget.rows_for(0.9, 8) == 0  # a full step: a row costs what a decode row yields


def test_a_step_fills_up_as_drafts_are_taken() -> None:
    budget = DraftBudget(learned())
    budget.start(rows=2, tokens=2)
    first = budget.rows_for(0.8, 8)
    assert first > 0
    budget.take(0.8, first)
    assert budget.rows_for(0.8, 8) < first


def test_rarely_accepted_drafts_are_not_verified() -> None:
    budget = DraftBudget(learned())
    budget.start(rows=1, tokens=1)
    assert budget.rows_for(0.05, 8) == 3  # only the rows that cost nothing
    budget.start(rows=4, tokens=4)
    assert budget.rows_for(0.05, 8) == 0
    budget.start(rows=8, tokens=8)
    assert budget.rows_for(0.5, 8) == 0


def test_rows_follow_the_machine_not_a_constant() -> None:
    """A machine where rows are nearly free up to 32 (a GPU, a wide kernel) drafts at batch 16."""
    budget = DraftBudget(learned(lambda r: 0.01 + 0.00005 * r + 0.002 * max(0, r - 32)))
    budget.start(rows=16, tokens=16)
    assert budget.rows_for(0.7, 8) >= 4
    budget = DraftBudget(learned())
    budget.start(rows=16, tokens=16)
    assert budget.rows_for(0.7, 8) == 0


def test_nothing_measured_yet_drafts_all_it_may() -> None:
    budget = DraftBudget(StepCost())
    budget.start(rows=32, tokens=32)
    assert budget.rows_for(0.5, 6) == 6


def test_acceptance_per_sequence_with_the_pooled_rate_as_prior() -> None:
    acc = Acceptance()
    assert acc.rate(1) == 0.5  # nothing seen yet
    for _ in range(10):
        acc.update(1, 8, 8)  # a sequence copying text: every draft accepted whole
        acc.update(2, 4, 0)  # one that drafts and misses
    assert acc.rate(1) > 0.95
    assert acc.rate(2) < 0.3
    assert 0.5 < acc.rate(3) < acc.rate(1)  # a new one starts from the pool (mostly accepted tokens)
    acc.update(1, 4, 1)
    assert acc.rate(1) < 0.95  # recent verifications weigh most
    acc.keep_only({2})
    assert len(acc) == 1
    assert acc.rate(1) == acc.rate(3)
