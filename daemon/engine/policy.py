"""Scheduling policy, free of radix and model calls: orderings, victim choice, prefix comparisons."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from radixd.daemon.engine.sequence import Sequence


def running_rank(s: Sequence) -> tuple[int, float, int]:
    """A running sequence's rank, fixed for its life: priority, then arrival, then admission order."""
    r = s.request
    return (-r.req.priority, r.arrival, s.seq_id)


def running_order(ranked: list[Sequence], remaining: list[int]) -> list[Sequence]:
    """Who gets this step's budget first: decodes before chunks, each in rank order (a stable partition
    of `ranked`, no sort)."""
    pairs = list(zip(ranked, remaining, strict=True))
    return [s for s, r in pairs if r <= 1] + [s for s, r in pairs if r > 1]


def waiting_order(
    seqs: Iterable[Sequence], policy: str, cached_len: Callable[[Sequence], int] | None = None
) -> list[Sequence]:
    """Admission order: "fcfs" (priority, then arrival) or "lpm" (longest cached prefix, then FCFS)."""
    base = sorted(seqs, key=lambda s: (-s.request.req.priority, s.request.arrival, s.seq_id))
    if policy != "lpm" or cached_len is None:
        return base
    lens = {id(s): cached_len(s) for s in base}
    return sorted(base, key=lambda s: (-s.request.req.priority, -lens[id(s)]))


def pick_victim(candidates: Iterable[Sequence], max_preemptions: int) -> Sequence | None:
    """Preemption victim: the lowest priority, newest sequence with preemptions left."""
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
    """Whether a running sequence still prefills a full block of `waiting`'s prompt beyond `cached`
    (admitting now would compute it twice)."""
    want = waiting.tokens[: len(waiting.tokens) - 1]
    for p in producers:
        if p.request.req.namespace != waiting.request.req.namespace:
            continue
        shared = common_prefix_len(want, p.tokens, block_size)
        shared -= shared % block_size  # only full blocks are shared while the producer runs
        if shared >= cached + block_size and p.num_computed < shared:
            return p
    return None
