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


def minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: minutes, 0 or more")
    return value


def add_idle_option(parser: argparse.ArgumentParser, meaning: str) -> None:
    parser.add_argument("--idle-minutes", type=minutes, metavar="N", help=meaning)
