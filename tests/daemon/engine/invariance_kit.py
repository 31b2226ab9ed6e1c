"""Helpers of the batch-invariance tests (docs/batch-invariance.md): the execution modes `auto` can
pick, one real SmolLM2 per mode, a greedy request's answer (its tokens and per-token logprobs) and the
answer of the same request run alone.

The contract is bitwise: two answers are equal when every token and every logprob is `==`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from engine_kit import SYSTEM, Collector, make_core, run

from radixd.daemon.engine.core import EngineCore
from radixd.daemon.engine.types import GenerateRequest
from radixd.daemon.executor.runner import DecodeRows, StepSeq
from radixd.daemon.executor.sampling import SampleResult, SamplingParams
from radixd.daemon.loaders import LoadedModel, load_model
from radixd.daemon.model.precision import cpu_has_native_bf16, resolve_precision

# NOTE: the embedded GGUF is Q4_1, so its layers lie on the int4 grid: what `auto` resolves to for it
# here. The "auto" rig loads with dtype="auto" and checks it got this.
AUTO = resolve_precision("auto", "cpu", lambda: True).name
# Every mode `auto` can pick on a CPU (int4, bfloat16, w4a8, float32), each once: "auto" stands for the one
# it picks on this machine.
MODES = ("auto", *(m for m in ("int4", "bfloat16", "w4a8", "float32") if m != AUTO))
# The default mode and the reference: one rig where `auto` is the reference here.
AUTO_AND_REFERENCE = ("auto",) if AUTO == "float32" else ("auto", "float32")

Answer = tuple[tuple[int, float], ...]
"""A greedy request's answer: (token id, its logprob) for every generated token, in order."""


def ask(max_tokens: int) -> SamplingParams:
    """Greedy, a fixed length, and the chosen token's logprob with every token."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)


def answer(col: Collector, rid: str, index: int = 0) -> Answer:
    """The finished answer of `rid` in `col`."""
    final = col.final(rid, index)
    assert final.finish_reason == "length", (rid, final.finish_reason, final.error)
    pairs = tuple((lp.token_id, lp.logprob) for o in col.outs[(rid, index)] for lp in o.logprobs or [])
    assert [t for t, _ in pairs] == col.tokens(rid, index), f"{rid}: a logprob per token"
    return pairs


def first_difference(got: Answer, want: Answer) -> str:
    """Where two answers part (for assertion messages)."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g != w:
            return f"token {i}: got {g}, want {w}"
    return f"lengths {len(got)} vs {len(want)}"


def assert_same(got: dict[str, Answer], want: dict[str, Answer], what: str) -> None:
    """Every answer in `got` bitwise equal to the one in `want`; the message lists each that differs."""
    assert got.keys() == want.keys()
    bad = {rid: first_difference(got[rid], want[rid]) for rid in got if got[rid] != want[rid]}
    assert not bad, f"{len(bad)} of {len(got)} answers differ {what}: {bad}"


def text_tokens(lm: LoadedModel) -> list[int]:
    """~300 tokens of real text, to cut prompts of any length from."""
    text = " ".join([SYSTEM] * 3) + "\nUser: Tell me about the history of maps and how sailors used them.\n"
    ids = lm.tokenizer.encode(text * 3)
    assert len(ids) >= 300, len(ids)
    return ids


@dataclass
class StepShapes:
    """What each step a core ran looked like: (prefill chunks, prefill tokens, decode rows)."""

    steps: list[tuple[int, int, int]] = field(default_factory=list)

    def mixed(self) -> int:
        """Steps that ran prefill chunks and decode rows together."""
        return sum(1 for c, _, r in self.steps if c and r)


def record_shapes(core: EngineCore) -> StepShapes:
    """Record the shape of every step `core` runs from now on (a spy around its runner's `run`)."""
    shapes = StepShapes()
    inner: Callable[[Sequence[StepSeq], DecodeRows], list[SampleResult | None]] = core.runner.run

    def spy(chunks: Sequence[StepSeq], rows: DecodeRows) -> list[SampleResult | None]:
        shapes.steps.append((len(chunks), sum(len(c.token_ids) for c in chunks), len(rows)))
        return inner(chunks, rows)

    core.runner.run = spy  # type: ignore[method-assign]
    return shapes


@dataclass
class Rig:
    """One execution mode: its model and the answers of requests run alone.

    `small`: this mode's bf16 arithmetic is emulated on this CPU (no AVX512-BF16/AMX), ~10x slower
    than fp32, so its tests run fewer and shorter requests (still the real model, every scenario)."""

    mode: str
    lm: LoadedModel
    small: bool
    _alone_core: EngineCore | None = None
    _alone: dict[tuple[tuple[int, ...], int], Answer] = field(default_factory=dict)

    def alone(self, prompt: Sequence[int], max_tokens: int) -> Answer:
        """`prompt`'s answer run alone: no other request, no prefix cache, its prompt in one prefill."""
        key = (tuple(prompt), max_tokens)
        if key not in self._alone:
            if self._alone_core is None:
                self._alone_core = make_core(self.lm, num_blocks=96, prefix_caching=False)
            col = run(self._alone_core, [GenerateRequest("alone", list(prompt), ask(max_tokens))])
            self._alone[key] = answer(col, "alone")
        return self._alone[key]

    def alone_all(self, reqs: Iterable[GenerateRequest]) -> dict[str, Answer]:
        return {r.request_id: self.alone(r.prompt_token_ids, r.sampling.max_tokens) for r in reqs}


def make_rig(mode: str, fp32: LoadedModel) -> Rig:
    """The rig of `mode` ("auto": what `auto` resolves to here); `fp32` is the session's fp32 model."""
    want = AUTO if mode == "auto" else mode
    # The session's fp32 model stands for "auto" where auto resolves to float32 (one load fewer).
    lm = fp32 if want == "float32" else load_model(dtype=mode)
    assert lm.model.precision.name == want, (mode, lm.model.precision.name)
    small = lm.model.precision.dtype == torch.bfloat16 and not cpu_has_native_bf16()
    return Rig(mode, lm, small)
