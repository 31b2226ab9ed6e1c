"""radixctl's structured-output flags (at most one constraint), sent as given: the daemon checks them."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import cast

from radixd_client.types import SamplingOptions

CONSTRAINT_FLAGS = ("json_schema", "json_object", "regex", "grammar", "choice")
"""The constraint options radixctl has flags for (all but structural_tag)."""


def add_constraint_flags(p: argparse.ArgumentParser) -> None:
    """The constraint flags, mutually exclusive (argparse refuses two with a usage error)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema",
        metavar="FILE",
        type=_read_file,
        help="the output is JSON valid against the JSON Schema in FILE",
    )
    group.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    group.add_argument("--regex", metavar="RE", help="the whole output matches this regular expression")
    group.add_argument(
        "--grammar",
        metavar="FILE",
        type=_read_file,
        help="the output matches the grammar in FILE: Lark (start rule `start`) or GBNF (`root ::= ...`)",
    )
    group.add_argument(
        "--choice", metavar="A,B,C", type=_split_choices, help="the output is exactly one of these strings"
    )


def flag_options(args: argparse.Namespace, names: Iterable[str]) -> SamplingOptions:
    """The options named ``names`` whose flags were given (an unset flag is None, False or [])."""
    given = {name: getattr(args, name) for name in names}
    return cast(
        SamplingOptions, {k: v for k, v in given.items() if v is not None and v is not False and v != []}
    )


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc}") from exc


def _split_choices(value: str) -> list[str]:
    choices = value.split(",")
    if not all(choices):
        raise argparse.ArgumentTypeError(f"{value!r} has an empty choice; write A,B,C")
    return choices
