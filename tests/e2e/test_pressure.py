"""KV pressure over gRPC: a 64-block pool, 16 concurrent greedy requests and a session's turns. Both
preemption modes finish everything within a bounded time with the outputs of an uncontended run, and
GetLoad shows requests while they are swapped out."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e_kit import RunningDaemon, serve_args, start_daemon, stop_daemon, wait_until
from radixd_client import Client

from radixd.daemon.engine.commands import GetStats
from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
TOPICS = [
    "rivers", "mountains", "deserts", "forests", "oceans", "glaciers", "volcanoes", "islands",
    "caves", "lakes", "canyons", "prairies", "reefs", "swamps", "tundras", "valleys",
]  # fmt: skip
# About 560 tokens: after its first turn the session's lease locks 37 of the 63 usable blocks.
CONTEXT = "You are a patient geography tutor. " + " ".join(
    f"Lesson {i + 1} is about {t}: the student should learn how {t} form, where the largest {t} are, "
    f"how people depend on them, and which explorers first described them."
    for i, t in enumerate(TOPICS)
)
MAX_TOKENS = 16
TIMEOUT_S = 120.0


def _prompt(topic: str) -> str:
    return (
        f"Write a short paragraph for a school textbook about {topic}: how they form, where on Earth "
        f"the largest {topic} are found, which animals and plants live around {topic}, and why people "
        f"should protect them. Start with a sentence a ten-year-old would understand."
    )


def _workload(c: Client) -> tuple[dict[str, list[int]], float]:
    """A session's first turn, then the 16 requests at once and, while they run, two more turns;
    -> every output's tokens, and the seconds it all took.

    NOTE: the later turns are the newest work, so under pressure they are preempted first. Swapping
    such a turn back in needs fresh blocks for its whole context while its own (busy) session still
    locks that context in the pool: more than the pool holds, so it must fall back to recompute.
    """
    session = c.create_session(CONTEXT)
    turns: dict[str, list[int]] = {}

    def turn(k: int) -> None:
        done = session.send(
            f"Question {k + 1}: compare two of them.",
            max_tokens=MAX_TOKENS,
            temperature=0.0,
            ignore_eos=True,
            timeout=TIMEOUT_S,
        ).collect()
        assert done.finish_reason == "length", done
        turns[f"turn{k}"] = done.token_ids[0]

    def one(topic: str) -> list[int]:
        done = c.complete(
            _prompt(topic), max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, timeout=TIMEOUT_S
        )
        assert done.finish_reason == "length", done
        return done.token_ids[0]

    t0 = time.monotonic()
    turn(0)
    with ThreadPoolExecutor(len(TOPICS)) as pool:
        futures = [pool.submit(one, topic) for topic in TOPICS]
        wait_until(
            lambda: c.load().running_requests > 0 or all(f.done() for f in futures),
            timeout=TIMEOUT_S,
            what="the requests to run",
        )
        turn(1)
        turn(2)
        outs = {topic: f.result(TIMEOUT_S) for topic, f in zip(TOPICS, futures, strict=True)}
    elapsed = time.monotonic() - t0
    session.close()
    return {**outs, **turns}, elapsed


@pytest.fixture(scope="module")
def uncontended(daemon: RunningDaemon) -> dict[str, list[int]]:
    """The workload on a pool that holds all of it at once (no preemption)."""
    with daemon.client() as c:
        outs, _ = _workload(c)
        assert c.cache_stats().preemptions == 0
    return outs


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_64_block_pool_finishes_the_load_like_an_uncontended_one(
    loaded_model: LoadedModel, tmp_path: Path, uncontended: dict[str, list[int]], mode: str
) -> None:
    extra = ["--preemption-mode", "swap", "--swap-blocks", "64"] if mode == "swap" else []
    d = start_daemon(loaded_model, serve_args(tmp_path, "--num-blocks", "64", *extra))
    try:
        with d.client() as c:
            outs, elapsed = _workload(c)
            load = c.load()
        stats = d.state.engine.execute(GetStats()).result(10)
    finally:
        stop_daemon(d)
    assert elapsed < TIMEOUT_S
    assert stats.preemptions > 0, "the pool was not under pressure"
    if mode == "swap":
        # A later turn was swapped out while its session locked its context (see `_workload`).
        assert stats.preemptions_swap > 0 and stats.swap_fallbacks > 0, stats
    assert outs == uncontended
    assert load.running_requests == load.waiting_requests == load.swapped_requests == 0


def test_get_load_counts_swapped_out_requests(loaded_model: LoadedModel, tmp_path: Path) -> None:
    """Two requests outgrow a 23-block pool: the newer is swapped out and stays out while the older
    one runs on; GetLoad must show it."""
    d = start_daemon(
        loaded_model,
        serve_args(tmp_path, "--num-blocks", "24", "--preemption-mode", "swap", "--swap-blocks", "32"),
    )
    try:
        with d.client() as c:
            with ThreadPoolExecutor(2) as pool:
                older = pool.submit(
                    c.complete, [7 + i % 90 for i in range(150)], max_tokens=120, ignore_eos=True
                )
                time.sleep(0.2)
                newer = pool.submit(
                    c.complete, [200 + i % 90 for i in range(100)], max_tokens=120, ignore_eos=True
                )
                seen = []

                def swapped() -> bool:
                    seen.append(c.load())
                    return seen[-1].swapped_requests == 1

                wait_until(swapped, timeout=TIMEOUT_S, what="a swapped-out request in GetLoad")
                assert seen[-1].running_requests == 1 and seen[-1].waiting_requests == 0
                assert (
                    older.result(TIMEOUT_S).finish_reason == newer.result(TIMEOUT_S).finish_reason == "length"
                )
            assert c.load().swapped_requests == 0
    finally:
        stop_daemon(d)
