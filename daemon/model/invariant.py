"""Row-invariant projections: a row's result never depends on how many rows its call has, nor on them.

GEMMs pick their reduction order from the shape, so a load-time probe finds each kernel's *floor* (from
which all probed row counts agree bitwise); `RowPlan.run` pads smaller calls and splits larger ones.
NOTE: plans hold per machine, build and thread count; `RowInvariant` re-probes when threads change."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

Kernel = Callable[[torch.Tensor], torch.Tensor]

# Decode batches (1..64 and a bit beyond), then prefill chunk sizes up to the engine's default step
# budget of 512 tokens.
PROBE_ROWS: tuple[int, ...] = (
    *range(1, 25),
    28,
    31,
    32,
    40,
    47,
    48,
    56,
    63,
    64,
    65,
    70,
    96,
    127,
    128,
    255,
    256,
    512,
)
# Very wide matrices (the lm_head: ~50k outputs) probe fewer counts: a probe of PROBE_ROWS there costs
# seconds. The lm_head's calls have one row per sampled sequence; larger ones run in chunks of 64.
WIDE_PROBE_ROWS: tuple[int, ...] = (*range(1, 14), 16, 31, 32, 64)
WIDE_OUTPUTS = 16384
# Rows whose results the probe compares at each count (all of them at smaller counts); a wide matrix
# gives each row ~50k outputs to compare, so fewer rows there.
COMPARED_ROWS = 64
WIDE_COMPARED_ROWS = 16


@dataclass(frozen=True)
class RowPlan:
    """How a kernel's calls are shaped: at least `floor` rows, at most `cap` rows per call."""

    floor: int
    cap: int
    fallback: bool = False

    def run(self, kernel: Kernel, x: torch.Tensor) -> torch.Tensor:
        """`kernel(x)` computed in calls of `floor`..`cap` rows (x: [M, in] -> [M, out])."""
        m = x.shape[0]
        if self.floor <= m <= self.cap:
            return kernel(x)
        if m < self.floor:
            return kernel(_pad(x, self.floor))[:m]
        outs = [self.run(kernel, x[i : i + self.cap]) for i in range(0, m, self.cap)]
        return torch.cat(outs)


def _pad(x: torch.Tensor, rows: int) -> torch.Tensor:
    out = x.new_zeros(rows, x.shape[1])
    out[: x.shape[0]] = x
    return out


def probe_rows_for(out_features: int) -> tuple[int, ...]:
    """The row counts probed for a matrix with `out_features` outputs."""
    return WIDE_PROBE_ROWS if out_features >= WIDE_OUTPUTS else PROBE_ROWS


def probe_floor(
    kernel: Kernel,
    in_features: int,
    dtype: torch.dtype,
    device: torch.device,
    rows: Sequence[int],
    compared: int = COMPARED_ROWS,
) -> RowPlan:
    """Measure `kernel`'s plan: the smallest count of `rows` from which `compared` rows agree."""
    g = torch.Generator().manual_seed(0)
    top = max(rows)
    n = min(compared, top)
    probe = torch.randn(n + top, in_features, generator=g).to(device=device, dtype=dtype)
    found: dict[int, torch.Tensor | None] = {}
    with torch.inference_mode():
        for m in rows:
            # A 16-bit output rounds most order differences away, so a count is judged on `n` rows at
            # once; counts above n also put the rows last, where blocked kernels take a short block.
            got = torch.cat([kernel(probe[s : s + m])[: min(m, n - s)] for s in range(0, n, m)])
            if m > n and not torch.equal(kernel(torch.cat([probe[n:m], probe[:n]]))[m - n :], got):
                found[m] = None
            else:
                found[m] = got
    counts = sorted(found)
    ref = found[top]

    def agrees(m: int) -> bool:
        r = found[m]
        return r is not None and ref is not None and torch.equal(r, ref)

    floor_at = len(counts) - 1
    while floor_at > 0 and agrees(counts[floor_at - 1]):
        floor_at -= 1
    if ref is None or floor_at == len(counts) - 1:
        return RowPlan(top, top, fallback=True)
    return RowPlan(counts[floor_at], top)


_PLANS: dict[tuple[str, int, int, torch.dtype, str, int], RowPlan] = {}


def plan_for(
    name: str, kernel: Kernel, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device
) -> RowPlan:
    """The plan of kernel kind `name` at this shape, probed on the first matrix of that shape.

    NOTE: the plan depends on shape, dtype and threads, never on weight values: one probe per shape."""
    key = (name, in_features, out_features, dtype, str(device), torch.get_num_threads())
    plan = _PLANS.get(key)
    if plan is None:
        wide = out_features >= WIDE_OUTPUTS
        compared = WIDE_COMPARED_ROWS if wide else COMPARED_ROWS
        plan = probe_floor(kernel, in_features, dtype, device, probe_rows_for(out_features), compared)
        _PLANS[key] = plan
    return plan


class RowInvariant:
    """`kernel` behind its plan, probed at construction (and again if the thread count changes)."""

    def __init__(
        self,
        name: str,
        kernel: Kernel,
        in_features: int,
        out_features: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self._args = (name, kernel, in_features, out_features, dtype, device)
        self._threads = torch.get_num_threads()
        self.plan = plan_for(*self._args)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.get_num_threads() != self._threads:
            self._threads = torch.get_num_threads()
            self.plan = plan_for(*self._args)
        return self.plan.run(self._args[1], x)
