"""What the daemon reports about requests agrees with what clients see: TTFT and queue time count
from the RPC's arrival, and cache hits + misses add up to the prompt tokens."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from e2e_kit import RunningDaemon
from radixd_client import Chunk, Completion, End

pytestmark = pytest.mark.slow
CONTEXT = "You are a terse assistant. Answer in one short sentence and never use lists or examples."


@pytest.fixture
def slow_next_step(daemon: RunningDaemon, monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The engine's next step that has work to do takes 0.5 s longer; the yielded event is set when
    that step begins."""
    core = daemon.state.engine.core
    real_step = core.step
    started = threading.Event()

    def step() -> bool:
        if core.has_work() and not started.is_set():
            started.set()
            time.sleep(0.5)
        return real_step()

    monkeypatch.setattr(core, "step", step)
    yield started


def test_server_ttft_agrees_with_the_client_when_a_step_is_in_progress(
    daemon: RunningDaemon, slow_next_step: threading.Event
) -> None:
    with daemon.client() as c:
        assert c.health() == "SERVING"  # connected: the measurement below holds no connection setup
        busy = threading.Thread(target=c.complete, args=("Keep the engine busy.",), kwargs={"max_tokens": 2})
        busy.start()
        assert slow_next_step.wait(30)
        sent = time.monotonic()
        first_chunk: float | None = None
        end: End | None = None
        for event in c.generate("The capital of France is", max_tokens=3, temperature=0.0):
            if isinstance(event, Chunk) and first_chunk is None:
                first_chunk = time.monotonic() - sent
            elif isinstance(event, End):
                end = event
        busy.join(30)
    assert first_chunk is not None and end is not None and end.finish_reason == "length"
    assert first_chunk > 0.3  # most of the slow step was still to run when the request arrived
    assert end.queue_s > 0.3, end
    # A couple of ms on an idle loopback; the margin is for a loaded test machine.
    assert abs(end.ttft_s - first_chunk) < 0.05, (end.ttft_s, first_chunk)


def test_hit_and_miss_tokens_add_up_to_the_prompt_tokens(daemon: RunningDaemon) -> None:
    """Lookups, session relocks and shared prefixes do not count; the last prompt token is a miss."""
    with daemon.client() as c:
        before = c.cache_stats()
        done: list[Completion] = []
        prompt = CONTEXT + " What is the capital of Italy?"
        for _ in range(2):  # the second one hits the first one's prefix
            done.append(c.complete(prompt, max_tokens=4, temperature=0.0))
            c.lookup_prefix(prompt)
        session = c.create_session(CONTEXT)
        for question in ("Name a river.", "Name a mountain."):
            done.append(session.send(question, max_tokens=4, temperature=0.0).collect())
        session.close()
        after = c.cache_stats()
        metrics = _scrape(daemon)
    prompt_tokens = sum(d.prompt_tokens for d in done)
    cached = sum(d.cached_tokens for d in done)
    hits, misses = after.hit_tokens - before.hit_tokens, after.miss_tokens - before.miss_tokens
    assert cached > 0 and hits == cached
    assert hits + misses == prompt_tokens
    assert metrics["radixd_cache_hit_tokens_total"] == after.hit_tokens
    assert metrics["radixd_cache_miss_tokens_total"] == after.miss_tokens


def _scrape(d: RunningDaemon) -> dict[str, float]:
    """The daemon's unlabelled Prometheus samples by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{d.daemon.metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples
