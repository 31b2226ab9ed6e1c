"""radixctl's structured-output flags: at most one constraint for `generate` and `chat`.

    radixctl generate "A colour:" --choice red,green,blue
    radixctl generate "Describe a user as JSON:" --json-schema user.schema.json
    radixctl generate "Today's date:" --regex '[0-9]{4}-[0-9]{2}-[0-9]{2}'
    radixctl generate "An answer:" --grammar answer.lark      # Lark, or GBNF (rules with ::=)

The files are sent as they are; the daemon checks them (INVALID_ARGUMENT with what to fix).
"""

from __future__ import annotations

import argparse

from radixd_client.types import SamplingOptions


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


def constraint_options(args: argparse.Namespace, opts: SamplingOptions) -> None:
    """Copy the one constraint flag given (if any) into `opts`."""
    if args.json_schema is not None:
        opts["json_schema"] = args.json_schema
    elif args.json_object:
        opts["json_object"] = True
    elif args.regex is not None:
        opts["regex"] = args.regex
    elif args.grammar is not None:
        opts["grammar"] = args.grammar
    elif args.choice is not None:
        opts["choice"] = args.choice


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
