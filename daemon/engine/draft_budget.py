"""The draft budget: how many draft rows each decoding sequence verifies in a step, from what a step
costs on this machine (learned from the engine's own step timings) and how often each sequence's
drafts are accepted.

A draft row is added while it raises the step's expected tokens per second: its chance of being
accepted must exceed the step's expected tokens times the row's added seconds over the step's
seconds. While a step is bound by reading the weights a row costs little and drafts go in; as decode
rows fill the step a row costs what a decode row costs and drafting stops. Rows go to the sequences
whose drafts are accepted most often first. NOTE: the budget only shortens drafts; it never changes
which tokens are emitted (verification does that), so outputs do not depend on it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field


def _key(rows: int) -> int:
    """The bucket of a row count: half-octaves."""
    return round(2 * math.log2(rows))


@dataclass(slots=True)
class _Bucket:
    rows: float  # decayed mean row count of the steps seen here
    seconds: float  # decayed low estimate of those steps' seconds
    seen: int  # the step count when it was last updated
    count: int = 1  # steps seen here (a bucket counts from its second: a first step pays for warm-up)


class StepCost:
    """Seconds of a step by its row count: per bucket of row counts (half-octaves), a decayed estimate
    that moves halfway to a faster step and a little towards a slower one (a stall, a page fault, a
    neighbour's burst is not what rows cost), counted from its second step (the lower of the first
    two); linear between the buckets' centres, never decreasing with rows. Buckets not updated in
    `stale_steps` steps are dropped. Beyond the largest row count measured, more rows are assumed free
    while a single bucket is known (so they get tried and measured), else they follow the last two
    buckets' slope. The buckets learn from steps without drafts; a step with drafts costs an extra
    beyond its rows (the drafted rows' separate verification), learned the same way from the drafted
    steps' excess over the buckets' estimate, per bucket of the drafted steps' row counts, also counted
    from its second step (the nearest one counted stands in; none assumed before one is).

    NOTE: a first step at a new row count pays one-off costs (scratch memory faulted in, a new shape);
    an estimate taken from it alone would stop drafting at that count for good, since only drafted
    steps there could correct it."""

    def __init__(self, rise: float = 0.1, stale_steps: int = 2048) -> None:
        self.rise = rise  # weight of a slower step in its bucket's estimate
        self.stale_steps = stale_steps
        # bucket -> a drafted step's seconds beyond its rows (`_Bucket.rows` unused)
        self._extra: dict[int, _Bucket] = {}
        self._steps = 0
        self._buckets: dict[int, _Bucket] = {}
        self._curve: list[tuple[float, float]] | None = None  # (rows, seconds), rows ascending

    def _toward(self, now: float, seen: float) -> float:
        """An estimate `now` after a step that took `seen`: halfway down, a little up."""
        return now + (0.5 if seen < now else self.rise) * (seen - now)

    def observe(self, rows: int, seconds: float, drafted: bool = False) -> None:
        """Record one step: `rows` tokens (drafts included) computed in `seconds`."""
        if rows < 1 or not seconds > 0:
            return
        if drafted:
            plain = self(rows)
            if plain is not None:
                key, excess = _key(rows), seconds - plain
                e = self._extra.get(key)
                if e is None:
                    self._extra[key] = _Bucket(float(rows), excess, self._steps)
                else:
                    e.seconds = min(e.seconds, excess) if e.count == 1 else self._toward(e.seconds, excess)
                    e.seen, e.count = self._steps, e.count + 1
            return
        self._steps += 1
        key = _key(rows)
        b = self._buckets.get(key)
        if b is None:
            self._buckets[key] = _Bucket(float(rows), seconds, self._steps)
        elif b.count == 1:
            b.rows, b.seconds = (b.rows + rows) / 2, min(b.seconds, seconds)
        else:
            b.rows += self.rise * (rows - b.rows)
            b.seconds = self._toward(b.seconds, seconds)
        if b is not None:
            b.seen, b.count = self._steps, b.count + 1
        if self._steps % self.stale_steps == 0:
            old = self._steps - self.stale_steps
            self._buckets = {k: b for k, b in self._buckets.items() if b.seen > old}
            self._extra = {k: e for k, e in self._extra.items() if e.seen > old}
        self._curve = None

    def _points(self) -> list[tuple[float, float]]:
        if self._curve is None:
            curve: list[tuple[float, float]] = []
            for _, b in sorted(self._buckets.items()):
                if b.count < 2:
                    continue
                # Monotone: more rows never cost less (noise on a shared machine would say otherwise).
                curve.append((b.rows, max(b.seconds, curve[-1][1]) if curve else b.seconds))
            self._curve = curve
        return self._curve

    def __call__(self, rows: int, drafted: bool = False) -> float | None:
        """The expected seconds of a step of `rows` rows (with drafts: plus `extra`); None before any
        bucket was measured."""
        pts = self._points()
        if not pts:
            return None
        plain = self._along(pts, rows)
        return plain + max(self.extra(rows), 0.0) if drafted else plain

    def extra(self, rows: int) -> float:
        """Seconds a step of `rows` rows with drafts costs beyond its rows (0 before any is counted)."""
        counted = [k for k, e in self._extra.items() if e.count > 1]
        if not counted:
            return 0.0
        key = _key(rows)
        return self._extra[min(counted, key=lambda k: (abs(k - key), k))].seconds

    @staticmethod
    def _along(pts: list[tuple[float, float]], rows: int) -> float:
        if rows <= pts[0][0]:
            return pts[0][1]
        for (r0, s0), (r1, s1) in itertools.pairwise(pts):
            if rows <= r1:
                return s0 + (s1 - s0) * (rows - r0) / (r1 - r0) if r1 > r0 else s1
        if len(pts) == 1:
            return pts[0][1]
        (r0, s0), (r1, s1) = pts[-2], pts[-1]
        return s1 + (s1 - s0) * (rows - r1) / (r1 - r0) if r1 > r0 else s1


@dataclass(slots=True)
class _Counts:
    accepted: float = 0.0  # decayed draft tokens accepted
    missed: float = 0.0  # decayed drafts cut short by a rejected token


@dataclass
class Acceptance:
    """Each sequence's recent chance that a draft token is accepted given the ones before it were:
    decayed accepted / (accepted + rejections), with the engine's pooled rate as a prior worth
    `prior_weight` tokens (a new sequence starts from what drafts have done lately)."""

    decay: float = 0.7  # per verification, for a sequence
    pool_decay: float = 0.98  # per verification, for the pooled rate
    prior_weight: float = 1.0
    _seqs: dict[int, _Counts] = field(default_factory=dict)
    _pool: _Counts = field(default_factory=lambda: _Counts(1.0, 1.0))  # one of each: 0.5 to start

    def rate(self, seq_id: int) -> float:
        """The chance that `seq_id`'s next draft token is accepted, given the ones before it were."""
        pool = self._pool.accepted / (self._pool.accepted + self._pool.missed)
        c = self._seqs.get(seq_id)
        if c is None:
            return pool
        return (c.accepted + self.prior_weight * pool) / (c.accepted + c.missed + self.prior_weight)

    def update(self, seq_id: int, drafted: int, accepted: int) -> None:
        """Record a verification: the first `accepted` of `drafted` tokens matched."""
        missed = 1.0 if accepted < drafted else 0.0
        c = self._seqs.setdefault(seq_id, _Counts())
        for counts, decay in ((c, self.decay), (self._pool, self.pool_decay)):
            counts.accepted = decay * counts.accepted + accepted
            counts.missed = decay * counts.missed + missed

    def keep_only(self, live: set[int]) -> None:
        """Forget sequences no longer running."""
        self._seqs = {s: c for s, c in self._seqs.items() if s in live}

    def __len__(self) -> int:
        return len(self._seqs)


class DraftBudget:
    """One step's draft rows: `start` with the step's planned rows, then `rows_for` each candidate (the
    most often accepted first) and `take` what it drafted. A draft must raise the step's expected
    tokens per second by `margin` (a fraction): gains smaller than that are within what the cost
    estimate gets wrong (prefill steps' rows are cheaper than verification rows, neighbours' load)."""

    def __init__(self, cost: StepCost, margin: float = 0.05) -> None:
        self.cost = cost
        self.margin = margin
        self._rows = 0  # rows in the step so far (planned + drafted)
        self._tokens = 0.0  # tokens the step is expected to emit so far
        self._drafted = False  # whether the step has drafts so far
        self._costs: list[float] = []  # seconds of the step with 1, 2, ... more drafted rows

    def start(self, rows: int, tokens: int) -> None:
        """A new step of `rows` planned rows that emit `tokens` tokens (its decodes and last chunks)."""
        self._rows, self._tokens, self._drafted = rows, float(tokens), False
        self._costs = []

    def rows_for(self, rate: float, most: int) -> int:
        """How many draft rows (at most `most`) a sequence whose draft tokens are accepted at `rate`
        should verify: the count that maximises the step's expected tokens per second. A rate no
        higher than one that got none gets none (the step is the same until `take`)."""
        now = self.cost(self._rows, self._drafted)
        if now is None:
            return most  # nothing measured yet: draft, and the timings come
        costs = self._costs  # the same for every candidate of this step until `take`
        while len(costs) < most:
            seconds = self.cost(self._rows + len(costs) + 1, True)
            assert seconds is not None
            costs.append(seconds)
        best, best_n, gain = (1 + self.margin) * self._tokens / now, 0, 0.0
        for n in range(1, most + 1):
            gain += rate**n
            speed = (self._tokens + gain) / costs[n - 1]
            if speed > best:
                best, best_n = speed, n
        return best_n

    def take(self, rate: float, rows: int) -> None:
        """A sequence drafted `rows` rows at acceptance `rate`."""
        self._tokens += sum(rate**n for n in range(1, rows + 1))
        self._rows += rows
        self._drafted = self._drafted or rows > 0
        self._costs = []
