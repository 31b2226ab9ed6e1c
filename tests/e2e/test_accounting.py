"""What the daemon reports about requests agrees with what clients see: TTFT and queue time count
from the RPC's arrival."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from e2e_kit import RunningDaemon
from radixd_client import Chunk, End

pytestmark = pytest.mark.slow


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
