"""radixctl against a real daemon: every subcommand runs and prints what it did."""

from __future__ import annotations

import io
import sys

import pytest
from e2e_kit import ADMIN_TOKEN, RunningDaemon
from radixd_client.cli import build_parser, main

pytestmark = pytest.mark.slow


def ctl(
    d: RunningDaemon, capsys: pytest.CaptureFixture[str], *argv: str, token: str = ADMIN_TOKEN
) -> tuple[int, str]:
    base = ["--address", d.address, "--admin-address", d.admin_address, "--admin-token", token]
    code = main([*base, *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    commands = ("generate", "chat", "fork", "sessions", "stats", "evict", "flush", "pin", "unpin", "health")
    for name in commands:
        with pytest.raises(SystemExit) as done:
            build_parser().parse_args([name, "--help"])
        assert done.value.code == 0
        assert "usage: radixctl" in capsys.readouterr().out


def test_radixctl_session(
    daemon: RunningDaemon, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ctl(daemon, capsys, "health") == (0, "SERVING\n")
    code, out = ctl(
        daemon, capsys, "generate", "The capital of France is", "--max-tokens", "4", "--temperature", "0"
    )
    assert code == 0 and "completion=4" in out and "finish=length" in out
    code, out = ctl(daemon, capsys, "stats")
    assert (
        code == 0
        and "evictable_blocks:" in out
        and "cached_blocks:" not in out
        and "running_requests:" in out
    )
    long_prompt = "Pinned by radixctl: " + "the quick brown fox jumps over the lazy dog. " * 4
    assert ctl(daemon, capsys, "generate", long_prompt, "--max-tokens", "2")[0] == 0
    code, out = ctl(daemon, capsys, "pin", long_prompt)
    assert code == 0 and "\npinned " in "\n" + out
    assert ctl(daemon, capsys, "unpin", long_prompt)[1].endswith("unpinned\n")
    code, out = ctl(daemon, capsys, "unpin", long_prompt)
    assert code == 2 and "NOT_FOUND" in out
    code, out = ctl(daemon, capsys, "evict", "--blocks", "1")
    assert code == 0 and "\nevicted " in "\n" + out
    assert "flushed " in ctl(daemon, capsys, "flush", "--mode", "refuse_if_busy")[1]

    monkeypatch.setattr(sys, "stdin", io.StringIO("Say hi.\n/quit\n"))
    code, out = ctl(daemon, capsys, "chat", "--keep", "--max-tokens", "3", "--temperature", "0")
    assert code == 0 and "completion=3" in out
    session_id = out.split("session ", 1)[1].split()[0]
    code, out = ctl(daemon, capsys, "fork", session_id, "-k", "2")
    assert code == 0 and len(out.split()) == 2
    code, out = ctl(daemon, capsys, "sessions")
    assert session_id in out and f"parent={session_id}" in out
    assert ctl(daemon, capsys, "sessions", "--close", session_id)[0] == 0


def test_radixctl_reports_errors_with_their_code(
    daemon: RunningDaemon, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = ctl(daemon, capsys, "stats", token="wrong")
    assert code == 2 and "PERMISSION_DENIED" in out
    code, out = ctl(daemon, capsys, "generate", "x", "--temperature", "-2")
    assert code == 2 and "INVALID_ARGUMENT" in out and "temperature" in out
