"""Scheduling policy, free of radix and model calls: orderings, victim choice, prefix comparisons."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from radixd.daemon.engine.sequence import Sequence


def running_order(seqs: Iterable[Sequence]) -> list[Sequence]:
    """Order in which running sequences get this step's budget: decodes (one token due) before prefill
    chunks, then higher priority, then older arrival, so the oldest work always progresses."""
    return sorted(seqs, key=_running_key)


def _running_key(s: Sequence) -> tuple[bool, int, float, int]:
    r = s.request
    return (s.remaining > 1, -r.req.priority, r.arrival, s.seq_id)


def waiting_order(
    seqs: Iterable[Sequence], policy: str, cached_len: Callable[[Sequence], int] | None = None
) -> list[Sequence]:
    """Admission order. "fcfs": priority, then arrival (preempted sequences keep their old arrival, so
    they resume first). "lpm": longest cached prefix first, FCFS among equals (SGLang-style)."""
    base = sorted(seqs, key=lambda s: (-s.request.req.priority, s.request.arrival, s.seq_id))
    if policy != "lpm" or cached_len is None:
        return base
    lens = {id(s): cached_len(s) for s in base}
    return sorted(base, key=lambda s: (-s.request.req.priority, -lens[id(s)]))


def pick_victim(candidates: Iterable[Sequence], max_preemptions: int) -> Sequence | None:
    """Preemption victim: the lowest priority, then newest sequence that has not yet used up its
    preemptions (so one request cannot be preempted forever)."""
    eligible = [s for s in candidates if s.preemptions < max_preemptions]
    if not eligible:
        return None
    return max(eligible, key=lambda s: (-s.request.req.priority, s.request.arrival, s.seq_id))


def common_prefix_len(a: list[int], b: list[int], step: int) -> int:
    """Length of the common prefix of `a` and `b`, compared `step` tokens at a time then exactly."""
    n = min(len(a), len(b))
    i = 0
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shares_pending_prefix(
    waiting: Sequence, cached: int, producers: Iterable[Sequence], block_size: int
) -> Sequence | None:
    """A running sequence still prefilling at least one more full block of `waiting`'s prompt beyond
    what is cached (`cached` tokens): admitting `waiting` now would compute that prefix twice, so it
    is held until the producer has inserted it."""
    want = waiting.tokens[: len(waiting.tokens) - 1]
    for p in producers:
        if p.request.req.namespace != waiting.request.req.namespace:
            continue
        shared = common_prefix_len(want, p.tokens, block_size)
        shared -= shared % block_size  # only full blocks are shared while the producer runs
        if shared >= cached + block_size and p.num_computed < shared:
            return p
    return None
