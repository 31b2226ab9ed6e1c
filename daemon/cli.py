"""The ``radixd`` console script: ``radixd serve`` (the gRPC daemon), ``radixd generate`` (offline, in
process) and ``radixd cluster`` (replicas behind the smg gateway, which speaks the OpenAI API)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser; each subcommand's module contributes its own flags."""
    # Imported here, so `radixd --help` stays fast and a broken subcommand cannot break the others.
    from radixd.daemon import cluster as cluster_main
    from radixd.daemon.engine import offline
    from radixd.daemon.server import main as server_main

    parser = argparse.ArgumentParser(
        prog="radixd", description="A prefix-caching LLM serving daemon (paged KV blocks in a radix tree)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,generate,cluster}")
    serve = sub.add_parser(
        "serve",
        help="serve a model over gRPC",
        description="Serve a model over gRPC. A greedy request's tokens and logprobs do not depend on the "
        "load: bitwise the same alone, batched, cached, chunked or preempted, in every mode --dtype auto "
        "picks, on one machine, build and thread count (docs/batch-invariance.md).",
    )
    server_main.add_arguments(serve)
    serve.set_defaults(run=server_main.run)
    generate = sub.add_parser(
        "generate",
        help="generate offline, in-process (no server)",
        description="Run the engine in-process on one prompt or a JSONL file of requests.",
    )
    offline.add_arguments(generate)
    generate.set_defaults(run=offline.run)
    cluster = sub.add_parser(
        "cluster",
        help="N replicas behind the smg gateway (OpenAI API)",
        description="Start N `radixd serve` replicas on free loopback ports and Shepherd Model Gateway in"
        " front of them; flags after `--` go to every replica.",
    )
    cluster_main.add_arguments(cluster)
    cluster.set_defaults(run=cluster_main.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``radixd`` console script."""
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
