"""`radixctl`: command line for a running radixd daemon.

    radixctl generate "The capital of France is" --max-tokens 16
    radixctl chat                       # interactive REPL over a session
    radixctl --ready-file ready.json --admin-token T stats   # addresses from `radixd serve --ready-file`

Global flags come before the subcommand; `radixctl <command> --help` lists each command's flags.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import grpc
from google.protobuf import json_format

from radixd_client.client import Client, GenerationStream
from radixd_client.constraint_flags import CONSTRAINT_FLAGS, add_constraint_flags, flag_options
from radixd_client.options import FLUSH_MODES
from radixd_client.types import Chunk, End, SamplingOptions, Start

DEFAULT_ADDRESS = "127.0.0.1:50051"
DEFAULT_ADMIN_ADDRESS = "127.0.0.1:50052"
ADMIN_COMMANDS = frozenset({"stats", "evict", "flush", "pin", "unpin"})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixctl", description="Talk to a radixd daemon over gRPC.")
    p.add_argument("--address", help=f"daemon host:port (or RADIXD_ADDRESS; default {DEFAULT_ADDRESS})")
    p.add_argument(
        "--admin-address",
        help=f"admin (cache) service host:port (or RADIXD_ADMIN_ADDRESS; default {DEFAULT_ADMIN_ADDRESS},"
        " the port `make serve` pins; `radixd serve` prints its own in the ready line)",
    )
    p.add_argument(
        "--ready-file",
        metavar="PATH",
        default=os.environ.get("RADIXD_READY_FILE"),
        help="take both addresses from this `radixd serve --ready-file` (or RADIXD_READY_FILE);"
        " --address / --admin-address still win",
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get("RADIXD_ADMIN_TOKEN"),
        help="admin bearer token (or RADIXD_ADMIN_TOKEN)",
    )
    p.add_argument(
        "--api-key", default=os.environ.get("RADIXD_API_KEY"), help="tenant API key (or RADIXD_API_KEY)"
    )
    p.add_argument("--tls-ca", metavar="PEM", help="CA certificate to verify a TLS daemon (enables TLS)")
    p.add_argument("--timeout", type=float, default=None, help="deadline in seconds for each call")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = sub.add_parser("generate", help="stream a completion", description="Stream a completion to stdout.")
    gen.add_argument("prompt", help="prompt text (or comma-separated ids with --token-ids)")
    gen.add_argument("--token-ids", action="store_true", help="treat the prompt as comma-separated token ids")
    gen.add_argument("--json", action="store_true", help="print every stream event as a JSON line")
    _sampling_flags(gen)

    chat = sub.add_parser(
        "chat",
        help="interactive chat over a session",
        description="Read lines from stdin and answer each as a chat turn of one session. /quit or EOF ends.",
    )
    chat.add_argument("--session", help="continue this session id instead of creating one")
    chat.add_argument("--system", help="system prompt for a new session")
    chat.add_argument("--keep", action="store_true", help="leave the session open on exit")
    _sampling_flags(chat, max_tokens=256)

    fork = sub.add_parser(
        "fork", help="fork a session", description="Fork a session into K copy-on-write children."
    )
    fork.add_argument("session_id")
    fork.add_argument("--count", "-k", type=int, default=1, help="number of children")

    sessions = sub.add_parser(
        "sessions", help="list or close sessions", description="List (or close) sessions."
    )
    sessions.add_argument("--page-size", type=int, default=0, help="sessions per request page")
    sessions.add_argument("--close", metavar="ID", help="close this session instead of listing")
    sessions.add_argument("--drop", action="store_true", help="with --close: drop its cached blocks now")

    stats = sub.add_parser(
        "stats", help="cache statistics and load (admin)", description="Print cache stats and load."
    )
    stats.add_argument("--json", action="store_true", help="print JSON")

    evict = sub.add_parser("evict", help="evict cached blocks (admin)", description="Evict cached blocks.")
    what = evict.add_mutually_exclusive_group(required=True)
    what.add_argument("--blocks", type=int, help="evict this many least recently used blocks")
    what.add_argument("--prefix", help="evict the cached continuation of this prompt text")
    what.add_argument("--session", help="evict this session's cached context")
    evict.add_argument("--namespace", default="", help="tenant namespace")

    flush = sub.add_parser(
        "flush", help="flush the cache (admin)", description="Evict every unlocked cached block."
    )
    flush.add_argument("--mode", choices=sorted(FLUSH_MODES), default="evict_unlocked")
    flush.add_argument("--wait-timeout", type=float, default=30.0, help="seconds for --mode wait_for_idle")

    for name, verb in (("pin", "Pin"), ("unpin", "Unpin")):
        cmd = sub.add_parser(
            name, help=f"{name} a cached prefix (admin)", description=f"{verb} a cached prefix."
        )
        cmd.add_argument("prefix", help="prompt text whose cached prefix to " + name)
        cmd.add_argument("--namespace", default="", help="tenant namespace")

    health = sub.add_parser(
        "health", help="grpc.health.v1 check", description="Exit 0 when the daemon is SERVING."
    )
    health.add_argument("--service", default="", help="service name ('' = whole server)")
    return p


def _sampling_flags(p: argparse.ArgumentParser, max_tokens: int = 64) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, help="0 = greedy")
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_constraint_flags(p)


def _sampling(args: argparse.Namespace) -> SamplingOptions:
    """The options the flags set; unset ones stay unset (the daemon's defaults)."""
    given = flag_options(args, ("temperature", "top_p", "top_k", "seed", "stop", *CONSTRAINT_FLAGS))
    return SamplingOptions(max_tokens=args.max_tokens, **given)


def _stream(stream: GenerationStream, as_json: bool = False) -> None:
    for event in stream:
        if as_json:
            print(json.dumps({"type": type(event).__name__.lower(), **event.__dict__}), flush=True)
        elif isinstance(event, Chunk):
            print(event.text, end="", flush=True)
        elif isinstance(event, End):
            print(flush=True)  # end the streamed text's line on stdout
            if event.error:
                print(f"[error: {event.error}]", file=sys.stderr)
            print(
                f"[prompt={event.prompt_tokens} cached={event.cached_tokens}"
                f" completion={event.completion_tokens}"
                f" finish={event.finish_reason} ttft={event.ttft_s * 1000:.1f}ms]",
                file=sys.stderr,
                flush=True,
            )
        elif isinstance(event, Start):
            pass


def _run(args: argparse.Namespace, client: Client) -> int:
    cmd = args.command
    if cmd == "generate":
        prompt: str | list[int] = args.prompt
        if args.token_ids:
            prompt = [int(t) for t in args.prompt.split(",") if t.strip()]
        _stream(client.generate(prompt, timeout=args.timeout, **_sampling(args)), args.json)
    elif cmd == "chat":
        return _chat(args, client)
    elif cmd == "fork":
        for child in client.fork(args.session_id, args.count):
            print(child.id)
    elif cmd == "sessions":
        if args.close:
            print(f"closed {args.close}; freed {client.close_session(args.close, args.drop)} blocks")
        else:
            for s in client.list_sessions(args.page_size):
                parent = f" parent={s.parent_id}" if s.parent_id else ""
                print(f"{s.session_id} tokens={s.num_tokens} turns={s.num_turns}{parent}")
    elif cmd == "stats":
        stats = json_format.MessageToDict(
            client.cache_stats(), always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        # cached_blocks is the deprecated name of evictable_blocks: the latter takes its place.
        names = ["evictable_blocks" if k == "cached_blocks" else k for k in stats if k != "evictable_blocks"]
        stats = {k: stats[k] for k in names}
        load = json_format.MessageToDict(
            client.load(), always_print_fields_with_no_presence=True, preserving_proto_field_name=True
        )
        if args.json:
            print(json.dumps({"cache": stats, "load": load}, indent=2))
        else:
            for key, value in {**stats, **load}.items():
                print(f"{key}: {_plain(value)}")
    elif cmd == "evict":
        n = client.evict(
            num_blocks=args.blocks, prefix=args.prefix, session_id=args.session, namespace=args.namespace
        )
        print(f"evicted {n} blocks")
    elif cmd == "flush":
        print(f"flushed {client.flush(args.mode, args.wait_timeout)} blocks")
    elif cmd == "pin":
        print(f"pinned {client.pin(args.prefix, args.namespace)} tokens")
    elif cmd == "unpin":
        client.unpin(args.prefix, args.namespace)
        print("unpinned")
    elif cmd == "health":
        status = client.health(args.service, timeout=args.timeout or 5.0)
        print(status)
        return 0 if status == "SERVING" else 1
    return 0


def _plain(value: object) -> str:
    """A stats value for people: proto3 JSON spells 64-bit integers as strings and maps as dicts."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
    return str(value)


def _chat(args: argparse.Namespace, client: Client) -> int:
    if args.session:
        session_id = args.session
    else:
        context = [{"role": "system", "content": args.system}] if args.system else None
        session_id = client.create_session(context).id
    print(f"session {session_id} (/quit or Ctrl-D to end)", file=sys.stderr)
    try:
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if line.strip() in ("/quit", "/exit"):
                break
            if not line.strip():
                continue
            turn = [{"role": "user", "content": line}]
            _stream(client.session_generate(session_id, turn, timeout=args.timeout, **_sampling(args)))
    finally:
        if not args.keep and not args.session:
            client.close_session(session_id)
    return 0


def resolve_addresses(args: argparse.Namespace) -> tuple[str, str]:
    """(address, admin address): the flags, else the ready file, else the environment, else defaults."""
    ready: dict[str, object] = {}
    if args.ready_file:
        try:
            with open(args.ready_file) as f:
                ready = json.load(f)
        except (OSError, ValueError) as exc:
            raise SystemExit(
                f"radixctl: cannot read the ready file {args.ready_file!r} ({exc}); pass the path given to"
                " `radixd serve --ready-file`, once the daemon printed its `radixd ready:` line"
            ) from exc
    address = args.address or ready.get("address") or os.environ.get("RADIXD_ADDRESS") or DEFAULT_ADDRESS
    admin = (
        args.admin_address
        or ready.get("admin_address")
        or os.environ.get("RADIXD_ADMIN_ADDRESS")
        or DEFAULT_ADMIN_ADDRESS
    )
    return str(address), str(admin)


def _unreachable_admin_hint(admin_address: str) -> str:
    return (
        f"radixctl: no admin service answered at {admin_address}. `radixd serve` picks a free admin port"
        " unless given --admin-port: pass --admin-address with the admin_address of the daemon's"
        " `radixd ready:` line, or --ready-file with the file it was started with"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    address, admin_address = resolve_addresses(args)
    root = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as f:
            root = f.read()
    client = Client(
        address,
        api_key=args.api_key,
        admin_address=admin_address,
        admin_token=args.admin_token,
        root_certificates=root,
    )
    try:
        return _run(args, client)
    except grpc.RpcError as err:
        print(f"radixctl: {err.code().name}: {err.details()}", file=sys.stderr)
        # Only for a failed connection; a draining daemon also answers UNAVAILABLE, with its reason.
        unreachable = err.code() == grpc.StatusCode.UNAVAILABLE and "connect" in (err.details() or "")
        if unreachable and args.command in ADMIN_COMMANDS:
            print(_unreachable_admin_hint(admin_address), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `radixctl stats | head`: the reader left. Point stdout at /dev/null so the flush at exit
        # does not raise a second time, and end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
