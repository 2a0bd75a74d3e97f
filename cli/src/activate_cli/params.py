"""Arguments several commands take."""

from __future__ import annotations

import argparse


def parse_param(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def add_param_option(parser: argparse.ArgumentParser, *, what: str = "a scheduling field") -> None:
    """``--param KEY=VALUE`` (repeatable), as every command that asks for a worker takes it."""
    parser.add_argument(
        "--param",
        "-p",
        action="append",
        type=parse_param,
        metavar="KEY=VALUE",
        help=f"{what}, e.g. walltime=04:00:00 (repeatable)",
    )
