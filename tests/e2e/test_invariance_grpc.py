"""Batch invariance seen from outside (docs/batch-invariance.md): a daemon in the default mode
(`--dtype auto`, whatever it resolves to on this machine) answers each greedy request over gRPC with
the same tokens and logprobs whether it runs on an idle daemon, among concurrent requests, or again
from a warm cache. The in-process engine tests (tests/daemon/engine/test_invariance_*.py) pin every
case down in every mode; this is the regression test of what a client first saw."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_kit import RunningDaemon, serve_args, start_daemon, stop_daemon
from radixd_client import Chunk

from radixd.daemon.cli import build_parser
from radixd.daemon.loaders import load_model

pytestmark = pytest.mark.slow

TOPICS = ["rivers", "volcanoes", "bread", "chess", "owls", "glass"]
PROMPTS = [f"Write one sentence about {t}." for t in TOPICS] + [
    "You are a careful assistant. Answer briefly and precisely.\nUser: Why is the sky blue?\nAssistant:",
    "List three prime numbers:",
]
Reply = tuple[tuple[int, float], ...]


@pytest.fixture(scope="module")
def auto_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon whose model runs in `--dtype auto`, what `radixd serve` runs when not told otherwise
    (the suite's other daemons pin float32 through $RADIXD_DTYPE)."""
    args = serve_args(tmp_path_factory.mktemp("auto"), "--dtype", "auto", "--max-num-seqs", "16")
    d = start_daemon(load_model(dtype=args.dtype), args)
    try:
        yield d
    finally:
        stop_daemon(d)


def _ask(d: RunningDaemon, prompt: str) -> Reply:
    with d.client() as c:
        stream = c.generate(prompt, max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=1)
        pairs = tuple((tid, lp) for e in stream if isinstance(e, Chunk) for tid, lp, _ in e.logprobs)
    assert len(pairs) == 6, pairs
    return pairs


def _first_difference(got: Reply, want: Reply) -> str:
    """'' when equal, else where they part."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            return f"token {i}: got {g}, alone {w}"
    return ""


def test_concurrent_greedy_requests_answer_as_alone(auto_daemon: RunningDaemon) -> None:
    alone = [_ask(auto_daemon, p) for p in PROMPTS]  # one at a time: an idle daemon each time
    with auto_daemon.client() as c:
        c.flush("evict_unlocked")  # cold again: the concurrent round computes every prompt
    for round_ in ("concurrent", "concurrent, warm cache"):
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: _ask(auto_daemon, p), PROMPTS))
        bad = {PROMPTS[i]: _first_difference(together[i], alone[i]) for i in range(len(PROMPTS))}
        bad = {p: d for p, d in bad.items() if d}
        assert not bad, f"{round_}: {len(bad)} of {len(PROMPTS)} answers differ from alone: {bad}"


def test_serve_help_states_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    assert "docs/batch-invariance.md" in " ".join(capsys.readouterr().out.split())
