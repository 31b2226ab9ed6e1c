"""SessionService end to end: turns hit the cache, forks share it copy-on-write, paging, closing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from e2e_kit import RunningDaemon
from radixd_client import Session

from radixd.daemon.engine.commands import GetSession

pytestmark = pytest.mark.slow
SYSTEM = [{"role": "system", "content": "You are a terse assistant. Answer in one short sentence."}]


def test_second_turn_reports_cached_tokens(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        s = c.create_session(SYSTEM)
        assert s.info.num_tokens > 0
        first = s.send(
            [{"role": "user", "content": "Name a fruit."}], max_tokens=8, temperature=0.0
        ).collect()
        after_first = s.refresh().num_tokens
        assert after_first == first.prompt_tokens + first.completion_tokens
        second = s.send(
            [{"role": "user", "content": "Another one?"}], max_tokens=8, temperature=0.0
        ).collect()
        # Everything before this turn (context, turn 1 prompt and reply) was computed already: only the
        # partial last block may be recomputed.
        assert second.cached_tokens >= after_first - daemon.state.block_size
        assert second.prompt_tokens > after_first
        info = s.refresh()
        assert info.num_turns == 2 and info.resident_tokens > 0
        s.close()


def test_fork_children_share_the_parent_context(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        parent = c.create_session([*SYSTEM, {"role": "user", "content": "Plan a trip to Rome in 4 steps."}])
        parent.send("Step 0:", max_tokens=6, temperature=0.0).collect()
        base = parent.refresh().num_tokens
        children = parent.fork(4)
        assert len({ch.id for ch in children}) == 4
        assert all(ch.info.parent_id == parent.id and ch.info.num_tokens == base for ch in children)

        def step(i_child: tuple[int, Session]) -> int:
            i, child = i_child
            return child.send(f" Step {i + 1}:", max_tokens=6, temperature=0.0).collect().cached_tokens

        with ThreadPoolExecutor(4) as pool:
            cached = list(pool.map(step, enumerate(children)))
        assert all(n >= base - daemon.state.block_size for n in cached), cached
        for ch in children:
            assert ch.refresh().num_turns == 1
            ch.close()
        parent.close()


def test_list_sessions_pages_and_close(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        made = [c.create_session(f"ctx {i}").id for i in range(5)]
        listed = [s.session_id for s in c.list_sessions(page_size=2)]
        assert set(made) <= set(listed) and len(listed) == len(set(listed))
        for sid in made:
            assert c.close_session(sid, drop_cache=True) >= 0
        with pytest.raises(grpc.RpcError) as err:
            c.get_session(made[0])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_close_session_drop_frees_its_blocks(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        s = c.create_session("A session whose context we drop. " * 6)
        s.send(" More.", max_tokens=4, temperature=0.0).collect()
        assert s.close(drop_cache=True) > 0


def test_bad_fork_count_is_invalid(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        s = c.create_session("x")
        with pytest.raises(grpc.RpcError) as err:
            s.fork(0)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        s.close()


def test_session_context_matches_the_chat_template(daemon: RunningDaemon) -> None:
    """Turn deltas add up to the template's rendering of the whole conversation."""
    tok = daemon.state.tokenizer
    user1, user2 = "Name a colour.", "And a number?"
    with daemon.client() as c:
        s = c.create_session(SYSTEM)
        reply = s.send([{"role": "user", "content": user1}], max_tokens=6, temperature=0.0).collect().text
        second = s.send([{"role": "user", "content": user2}], max_tokens=2, temperature=0.0).collect()
        sid = s.id
        tokens = daemon.state.engine.execute(GetSession(sid)).result(10).tokens
        s.close()
    conversation = [
        *SYSTEM,
        {"role": "user", "content": user1},
        {"role": "assistant", "content": reply.removesuffix("<|im_end|>")},
        {"role": "user", "content": user2},
    ]
    expected = tok.apply_chat_template(conversation, add_generation_prompt=True)
    assert tok.decode(list(tokens[: second.prompt_tokens])) == expected


def test_one_turn_at_a_time(daemon: RunningDaemon) -> None:
    with daemon.client() as c:
        s = c.create_session("Busy session.")
        busy = s.send(" Go on:", max_tokens=200, ignore_eos=True)
        first = iter(busy)
        next(first)  # the turn has started
        with pytest.raises(grpc.RpcError) as err:
            s.send(" Second turn.", max_tokens=2).collect()
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "busy" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            s.send(" n>1", max_tokens=2, n=2).collect()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        busy.cancel()
        s.close()
