"""Sampling parameters, per-request sampling state and the batched sampler.

NOTE: batch invariance: rows use row-local operations only, and a sampled row draws exactly one uniform
per step from its own CPU generator (inverse CDF): a seeded request yields the same tokens alone or
batched, on any device."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixd.daemon.structured.spec import Constraint

if TYPE_CHECKING:
    from radixd.daemon.structured.matcher import Matcher

# A large finite negative instead of -inf keeps softmax free of NaN when a row is fully masked.
MASKED_LOGIT = -1e30
# `logit_bias` values, as OpenAI and vLLM: -100 bans a token in practice, +100 all but forces it.
MAX_ABS_LOGIT_BIAS = 100.0
# Top alternatives `logprobs` and `prompt_logprobs` may ask for per token.
MAX_TOP_LOGPROBS = 20


def _check_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop (vLLM semantics). Invalid values raise ValueError.

    temperature 0: greedy. top_k 0/-1, top_p 1.0, min_p 0.0, repetition_penalty 1.0: off. logit_bias:
    sorted (id, bias in [-100, 100]) pairs, added before penalties. logprobs=n: the chosen token's and the
    top n. prompt_logprobs=k: each prompt token's raw logprob and the top k."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    n: int = 1
    constraint: Constraint | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        _check_finite("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check_int("top_k", self.top_k, -1)
        _check_finite("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_finite("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        _check_finite("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_finite(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.seed is not None:
            _check_int("seed", self.seed, 0)
            if self.seed >= 2**63:
                raise ValueError(f"seed must be < 2**63, got {self.seed}")
        stop: object = self.stop
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a sequence of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        for t in self.stop_token_ids:
            _check_int("stop_token_ids entry", t, 0)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, 0)
                if value > MAX_TOP_LOGPROBS:
                    raise ValueError(f"{name} must be <= {MAX_TOP_LOGPROBS}, got {value}")
        _check_int("n", self.n, 1)
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _logit_bias(value: object) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as sorted (token id, bias) pairs; ValueError naming the bad entry."""
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if isinstance(pairs, str) or not isinstance(pairs, Sequence):
        raise ValueError(f"logit_bias must map token ids to biases, got {value!r}")
    out: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ValueError(f"logit_bias entries must be (token id, bias) pairs, got {pair!r}")
        tid, bias = pair
        _check_int("logit_bias token id", tid, 0)
        _check_finite(f"logit_bias[{tid}]", bias)
        if not -MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS:
            raise ValueError(f"logit_bias[{tid}] must be in [-100, 100], got {bias}")
        if tid in out:
            raise ValueError(f"logit_bias names token id {tid} twice")
        out[tid] = float(bias)
    return tuple(sorted(out.items()))


@dataclass(slots=True)
class SampleResult:
    """One sampled token: its id, its logprob (if asked) and the top-n (token_id, logprob) pairs."""

    token_id: int
    logprob: float | None = None
    # A tuple default, not a list factory: built once per sequence per step.
    top_logprobs: tuple[tuple[int, float], ...] = ()


class SamplingState:
    """One request's sampling state: params, own generator, token history, and constraint matcher."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_token_ids: Sequence[int] = (),
        eos_token_ids: Sequence[int] = (),
        seed: int | None = None,
    ) -> None:
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.eos_token_ids = tuple(eos_token_ids)
        self.seed = params.seed if seed is None else seed
        # Greedy with nothing to apply or report: the sampler's fast path (one argmax for the batch).
        self.plain = (
            params.greedy
            and not params.uses_penalties
            and params.logprobs is None
            and not params.min_tokens
            and not params.logit_bias
        )
        self.grammar: Matcher | None = None
        # The bias as (ids, values) tensors, built once per request (see `_apply_logit_bias`).
        self.bias: tuple[torch.Tensor, torch.Tensor] | None = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias, strict=True)
            self.bias = (torch.tensor(ids, dtype=torch.long), torch.tensor(values, dtype=torch.float32))
        self.generator = torch.Generator(device="cpu")
        if self.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(self.seed)

    def append(self, token_id: int) -> None:
        """Record a generated token and advance the grammar; `GrammarRefused` records nothing.
        NOTE: the grammar has consumed exactly `output_token_ids`, so forks and preemption keep it right."""
        if self.grammar is not None:
            self.grammar.consume(token_id)
        self.output_token_ids.append(token_id)

    def finish_reason(self, token_id: int) -> str | None:
        """Finish reason after `token_id` was appended: "stop", "length", or None (not stop strings)."""
        n_out = len(self.output_token_ids)
        if n_out >= self.params.min_tokens:
            if token_id in self.params.stop_token_ids:
                return "stop"
            if not self.params.ignore_eos and token_id in self.eos_token_ids:
                return "stop"
        if n_out >= self.params.max_tokens:
            # A grammar complete at the last token is a whole document, cut short of nothing.
            return "stop" if self.grammar is not None and self.grammar.stopped else "length"
        return None

    def fork(self, seed: int | None) -> SamplingState:
        """A child for n > 1: same params and history, its own generator seeded with `seed`."""
        child = SamplingState(self.params, self.prompt_token_ids, self.eos_token_ids, seed=seed)
        if seed is None and self.seed is None:
            child.generator.seed()
        child.output_token_ids = list(self.output_token_ids)
        child.grammar = self.grammar.fork() if self.grammar is not None else None
        return child


def _apply_logit_bias(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    """In place, only rows with a bias: add each listed token's bias to its logit (row-local)."""
    for row, st in enumerate(states):
        if st.bias is None:
            continue
        ids, values = st.bias
        # Ids were checked against the vocabulary (engine validator); the sampler trusts them.
        logits[row].index_add_(0, ids.to(logits.device), values.to(logits.device, logits.dtype))


def _apply_penalties(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    """In place, only rows that use penalties (row-local, so batch invariant)."""
    vocab = logits.shape[1]
    for row, st in enumerate(states):
        p = st.params
        if not p.uses_penalties:
            continue
        x = logits[row]
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(st.prompt_token_ids + st.output_token_ids, dtype=torch.long)
            seen = torch.unique(seen[(seen >= 0) & (seen < vocab)]).to(logits.device)
            if seen.numel():
                vals = x[seen]
                x[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        if (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0) and st.output_token_ids:
            out = torch.tensor(st.output_token_ids, dtype=torch.long, device=logits.device)
            out = out[(out >= 0) & (out < vocab)]
            counts = torch.zeros(vocab, dtype=logits.dtype, device=logits.device)
            counts.scatter_add_(0, out, torch.ones_like(out, dtype=logits.dtype))
            x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _apply_min_tokens(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    vocab = logits.shape[1]
    for row, st in enumerate(states):
        if len(st.output_token_ids) < st.params.min_tokens:
            banned = [t for t in (*st.params.stop_token_ids, *st.eos_token_ids) if 0 <= t < vocab]
            if banned:
                logits[row, banned] = MASKED_LOGIT


def _draw(states: Sequence[SamplingState], device: torch.device) -> torch.Tensor:
    """One uniform number per row from that row's own CPU generator: [R, 1] float64."""
    u = torch.stack([torch.rand((), generator=s.generator, dtype=torch.float64) for s in states])
    return u.to(device).unsqueeze(1)


def _pick(probs: torch.Tensor, keep: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF pick per row over `probs` [R, W] (zeros where dropped) -> column index [R, 1]."""
    width = probs.shape[1]
    cdf = torch.cumsum(probs, dim=1)
    target = (u * cdf[:, -1:].double()).to(cdf.dtype)
    pick = torch.searchsorted(cdf, target, right=True).clamp_(max=width - 1)
    if keep is not None:
        # NOTE: rounding can land a pick just past the last kept slot: step back, so a filtered token
        # is never emitted.
        rank = torch.arange(width, device=probs.device).unsqueeze(0)
        last_kept = (keep.long() * rank).amax(dim=1, keepdim=True)
        pick = torch.minimum(pick, last_kept)
    return pick


def _sample_group(x: torch.Tensor, states: Sequence[SamplingState], width: int) -> torch.Tensor:
    """Rows sharing one processing width (so every op has the same shape alone or batched)."""
    u = _draw(states, x.device)
    probs, keep, top_idx = _distribution(x, states, width)
    if top_idx is None:
        return _pick(probs, None, u).squeeze(1)
    return top_idx.gather(1, _pick(probs, keep, u)).squeeze(1)


def _distribution(
    x: torch.Tensor, states: Sequence[SamplingState], width: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(probabilities [R, W], the kept mask, each column's id); the last two None when nothing is cut."""
    vocab = x.shape[1]
    truncating = any(s.params.top_p < 1.0 or s.params.min_p > 0.0 for s in states) or width < vocab
    if not truncating:
        return torch.softmax(x, dim=1), None, None
    if width < vocab:
        top_x, top_idx = torch.topk(x, width, dim=1, sorted=True)
    else:
        top_x, top_idx = torch.sort(x, dim=1, descending=True)
    probs = torch.softmax(top_x, dim=1)
    top_p = torch.tensor([s.params.top_p for s in states], dtype=probs.dtype, device=x.device)
    # Keep a token while the mass before it is < top_p (the first token always stays).
    drop = (torch.cumsum(probs, dim=1) - probs) >= top_p.unsqueeze(1)
    min_p = torch.tensor([s.params.min_p for s in states], dtype=probs.dtype, device=x.device)
    drop |= probs < (min_p.unsqueeze(1) * probs[:, :1])
    drop[:, 0] = False
    return probs.masked_fill(drop, 0.0), ~drop, top_idx


def distribution(logits: torch.Tensor, state: SamplingState) -> torch.Tensor:
    """The distribution `sample` draws from for a sampled `state` without penalties (rejection sampling)."""
    rows, vocab = logits.shape
    x = logits.float().clone()
    states = [state] * rows
    _apply_logit_bias(x, states)
    x = x / state.params.temperature
    k = state.params.top_k
    probs, _keep, idx = _distribution(x, states, k if 0 < k < vocab else vocab)
    if idx is not None:
        probs = torch.zeros_like(x).scatter_(1, idx, probs)
    return probs / probs.sum(dim=1, keepdim=True)


def _sample_rows(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Temperature / top-k / top-p / min-p, then an inverse-CDF draw with each row's own generator.
    NOTE: rows go in groups of one (top-k width, truncation kind), so nothing depends on the batch."""
    vocab = logits.shape[1]
    temps = torch.tensor([s.params.temperature for s in states], dtype=logits.dtype, device=logits.device)
    x = logits / temps.unsqueeze(1)
    groups: dict[tuple[int, bool], list[int]] = {}
    for i, s in enumerate(states):
        k = s.params.top_k if 0 < s.params.top_k < vocab else vocab
        trunc = k < vocab or s.params.top_p < 1.0 or s.params.min_p > 0.0
        groups.setdefault((k, trunc), []).append(i)
    if len(groups) == 1:
        ((width, _),) = groups
        return _sample_group(x, states, width)
    out = torch.empty(len(states), dtype=torch.int64, device=x.device)
    for (width, _), rows in groups.items():
        idx = torch.tensor(rows, device=x.device)
        out[idx] = _sample_group(x.index_select(0, idx), [states[i] for i in rows], width)
    return out


# Width of the column groups greedy_argmax reduces first (a multiple of the CPU's vector width):
# nearly a flat amax's speed, with a small second stage.
_ARGMAX_GROUP = 256


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(logits, dim=1)``, same result, via vectorized group maxima (torch's CPU argmax is
    a scalar loop)."""
    rows, vocab = logits.shape
    groups = vocab // _ARGMAX_GROUP
    if logits.device.type != "cpu" or groups < 2:
        return torch.argmax(logits, dim=1)
    whole = groups * _ARGMAX_GROUP
    group_max = logits[:, :whole].reshape(rows, groups, _ARGMAX_GROUP).amax(dim=2)
    if whole < vocab:
        group_max = torch.cat((group_max, logits[:, whole:].amax(dim=1, keepdim=True)), dim=1)
    g = torch.argmax(group_max, dim=1)
    # The last group may be short: clamping repeats its final column after the real one, and argmax
    # returns the first maximum, so a repeat never wins over its original.
    cols = (g.unsqueeze(1) * _ARGMAX_GROUP + torch.arange(_ARGMAX_GROUP)).clamp_(max=vocab - 1)
    return torch.argmax(logits.gather(1, cols), dim=1) + g * _ARGMAX_GROUP


def sample(logits: torch.Tensor, states: Sequence[SamplingState]) -> list[SampleResult]:
    """Sample one token per row of `logits` [B, V] for the matching `states`. Does not append."""
    if logits.dim() != 2 or logits.shape[0] != len(states):
        raise ValueError(f"logits must be [len(states), vocab], got {tuple(logits.shape)} for {len(states)}")
    if not states:
        return []
    logits = logits.float()
    if all(s.plain for s in states):
        return [SampleResult(t) for t in greedy_argmax(logits).tolist()]
    if any(s.params.uses_penalties or s.bias is not None for s in states) or any(
        len(s.output_token_ids) < s.params.min_tokens for s in states
    ):
        logits = logits.clone()
        _apply_logit_bias(logits, states)
        _apply_penalties(logits, states)
        _apply_min_tokens(logits, states)
    sampled_rows = [i for i, s in enumerate(states) if not s.params.greedy]
    if not sampled_rows:
        chosen = greedy_argmax(logits)
    elif len(sampled_rows) == len(states):
        chosen = _sample_rows(logits, list(states))
    else:
        chosen = greedy_argmax(logits)
        idx = torch.tensor(sampled_rows, device=logits.device)
        picked = _sample_rows(logits.index_select(0, idx), [states[i] for i in sampled_rows])
        chosen = chosen.index_copy(0, idx, picked)
    chosen_list: list[int] = chosen.tolist()
    results = [SampleResult(token_id=t) for t in chosen_list]
    lp_rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
    if lp_rows:
        # Logprobs are after bias and penalties, before temperature / truncation, so a greedy token
        # is always the top logprob (vLLM v1 defaults to raw ones).
        idx = torch.tensor(lp_rows, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, idx), dim=1)
        chosen_lp = lp.gather(1, chosen.index_select(0, idx).unsqueeze(1)).squeeze(1).tolist()
        max_n = max(states[i].params.logprobs or 0 for i in lp_rows)
        top_v, top_i = torch.topk(lp, max_n, dim=1) if max_n else (None, None)
        for j, row in enumerate(lp_rows):
            res = results[row]
            res.logprob = float(chosen_lp[j])
            n = states[row].params.logprobs or 0
            if n and top_v is not None and top_i is not None:
                res.top_logprobs = tuple(
                    zip(top_i[j, :n].tolist(), [float(v) for v in top_v[j, :n].tolist()], strict=True)
                )
    return results
