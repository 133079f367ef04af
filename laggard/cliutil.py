"""Helpers shared by the CLI verbs: output formats, step ranges, trace opening."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from collector.errors import UserError


def add_format(parser: argparse.ArgumentParser, choices: tuple[str, ...] = ("text", "json")) -> None:
    parser.add_argument(
        "--format", choices=choices, default=choices[0],
        help=f"output format (default {choices[0]}); json is stable for scripts",
    )


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """'A:B' (inclusive), 'A:' or ':B' -> (A, B); None stays None."""
    if not text:
        return None
    try:
        lo, _, hi = text.partition(":")
        a = int(lo) if lo else 0
        b = int(hi) if hi else 2**31 - 1
    except ValueError as exc:
        raise UserError(f"--steps '{text}' is not A:B", "give two step numbers, e.g. --steps 100:200") from exc
    if b < a:
        raise UserError(f"--steps '{text}' ends before it starts", "give A:B with A <= B")
    return a, b


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written."""


def verb_parser(sub: Any, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """A subparser with a teaching --help: a description and worked examples."""
    return sub.add_parser(  # type: ignore[no-any-return]
        name, help=help, description=description,
        epilog="examples:\n" + examples.strip("\n"), formatter_class=Formatter,
    )


@contextmanager
def progress(label: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr for long work; silent when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
