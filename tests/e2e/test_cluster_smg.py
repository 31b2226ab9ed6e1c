"""Two radixd replicas behind the real smg gateway (`radixd cluster`), driven over its OpenAI API.

Every answer is compared with radixd's own API on a replica; routing is observed through the
replicas' admin services (which replica holds which prefix) and their logs.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_kit import (
    MODEL,
    Cluster,
    SseStream,
    cached_on,
    get,
    post,
    start_cluster,
    stream_chat,
    wait_released,
)
from e2e_kit import wait_until

from radixd.daemon.loaders import LoadedModel

pytestmark = pytest.mark.slow
SERVE = ("--num-blocks", "160", "--default-max-tokens", "16", "--max-num-seqs", "8")
QUESTION = [{"role": "user", "content": "Name a fruit and its colour."}]


def _system(topic: str) -> str:
    return f"You are an assistant for {topic}. " + " ".join(
        f"Rule {i}: always answer questions about {topic} briefly and politely." for i in range(12)
    )


@pytest.fixture(scope="module")
def cluster(loaded_model: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"), 2, *SERVE)
    try:
        yield c
    finally:
        c.ensure_stopped()


def test_cluster_lists_the_served_model(cluster: Cluster) -> None:
    models = get(cluster.base, "/models")
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert len(cluster.info["replicas"]) == 2
    assert cluster.info["replicas"][0]["admin_address"] != cluster.info["replicas"][1]["admin_address"]


def test_cluster_answers_equal_radixd_api_for_greedy_requests(cluster: Cluster) -> None:
    # NOTE: compared warm: with the prompt cached on both replicas, whichever one smg picks computes
    # exactly what radixd's own API computed (a cold prefill may round differently near a tie).
    for i in (0, 1):
        cluster.replica(i).complete(QUESTION, max_tokens=1, temperature=0.0)
    own = cluster.replica(0).complete(QUESTION, max_tokens=12, temperature=0.0)
    assert own.cached_tokens > 0
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 12, "temperature": 0}
    chat = post(cluster.base, "/chat/completions", body)
    assert chat["choices"][0]["message"]["content"] == own.texts[0]
    assert chat["usage"]["prompt_tokens"] == own.prompt_tokens
    assert chat["usage"]["completion_tokens"] == own.ends[0].completion_tokens
    text, usage, _ = stream_chat(cluster.base, body)
    assert text == own.texts[0]
    assert usage["prompt_tokens"] == own.prompt_tokens
    assert usage["completion_tokens"] == own.ends[0].completion_tokens
    prompt = "The capital of France is"
    for i in (0, 1):
        cluster.replica(i).complete(prompt, max_tokens=1, temperature=0.0)
    own_text = cluster.replica(1).complete(prompt, max_tokens=8, temperature=0.0)
    done = post(
        cluster.base, "/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    )
    assert done["choices"][0]["text"] == own_text.texts[0]
    assert done["usage"]["prompt_tokens"] == own_text.prompt_tokens
    assert done["usage"]["completion_tokens"] == own_text.ends[0].completion_tokens == 8


def test_cluster_conversations_stick_to_one_replica_and_hit_from_turn_two(cluster: Cluster) -> None:
    replicas = [cluster.replica(0), cluster.replica(1)]
    for topic in ("gardening", "astronomy"):
        messages = [{"role": "system", "content": _system(topic)}]
        homes = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"Question {turn} about {topic}?"})
            body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
            reply = post(cluster.base, "/chat/completions", body)
            cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            if turn:
                assert cached > len(messages[0]["content"]) // 8, (topic, turn, reply["usage"])
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            # more than a shared chat-template opening: the conversation's own system prompt
            held = [cached_on(r, messages[:1]) for r in replicas]
            homes.append([i for i, n in enumerate(held) if n > 64])
        assert len(homes[0]) == 1 and all(h == homes[0] for h in homes), (topic, homes)


def test_cluster_stream_disconnect_leaves_no_block_held(cluster: Cluster) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to one thousand, in words."}],
        "max_tokens": 600,
        "ignore_eos": True,
        "stream": True,
    }
    stream = SseStream(cluster.base, "/chat/completions", body)
    events = stream.events()
    for _ in range(3):
        next(events)
    stream.close()
    wait_released([cluster.replica(0), cluster.replica(1)])

    def aborted() -> bool:
        # smg turns the disconnect into an Abort (or a cancelled call): the request ends early, aborted
        return any(
            line.get("event") == "engine.finished" and line.get("reasons") == {"abort": 1}
            for i in (0, 1)
            for line in cluster.replica_logs(i)
        )

    wait_until(aborted, timeout=10, what="the replica to abort the disconnected stream")


def test_cluster_flush_on_the_holding_replica_is_seen_by_the_router(cluster: Cluster) -> None:
    replicas = [cluster.replica(0), cluster.replica(1)]
    messages = [{"role": "system", "content": _system("chess")}, *QUESTION]
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    post(cluster.base, "/chat/completions", body)
    second = post(cluster.base, "/chat/completions", body)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    home = next(i for i, r in enumerate(replicas) if cached_on(r, messages) > 64)
    replicas[home].flush("wait_for_idle")
    assert all(cached_on(r, messages) <= 16 for r in replicas)
    after = post(cluster.base, "/chat/completions", body)
    # Nobody holds the prefix any more (beyond a template opening another test may have left on the
    # other replica): whichever replica serves it must say so.
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] <= 16
    again = post(cluster.base, "/chat/completions", body)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 64  # the new home was learned


def test_cluster_sigint_drains_everything_and_exits_0(cluster: Cluster) -> None:
    code = cluster.stop(signal.SIGINT)
    assert code == 0, cluster.out.read_text()
    assert "stopping" in cluster.out.read_text()


def test_cluster_keeps_serving_when_a_replica_is_killed_mid_stream(
    loaded_model: LoadedModel, tmp_path: Path
) -> None:
    c = start_cluster(tmp_path, 2, *SERVE)
    try:
        replicas = [c.replica(0), c.replica(1)]
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell a very long story about a lighthouse."}],
            "max_tokens": 600,
            "ignore_eos": True,
            "stream": True,
        }
        stream = SseStream(c.base, "/chat/completions", body)
        events = stream.events()
        next(events)
        victim = next(i for i, r in enumerate(replicas) if r.cache_stats().in_use_blocks > 0)
        info = json.loads((Path(c.info["logs"]) / f"replica-{victim}.json").read_text())
        os.kill(info["pid"], signal.SIGKILL)
        rest: list[dict[str, object]] = []
        finished = threading.Event()

        def read() -> None:
            try:
                rest.extend(events)
            except Exception as exc:  # a dropped connection is also a clean end for the client
                rest.append({"error": str(exc)})
            finished.set()

        threading.Thread(target=read, daemon=True).start()
        assert finished.wait(30), "the interrupted stream did not end"
        assert rest and "error" in rest[-1], rest[-3:]
        survivor = 1 - victim
        for i in range(3):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4}
            reply = post(c.base, "/chat/completions", body)
            assert reply["choices"][0]["message"]["content"] is not None
        assert replicas[survivor].cache_stats().cached_blocks > 0
        code = c.stop(signal.SIGINT)
    finally:
        c.ensure_stopped()
    assert code == 1, "a replica was lost during the run, so the cluster reports it"
