"""Helpers shared by the CLI verbs: output formats, step ranges, exit codes, progress bars."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from collector.inputs.errors import UserError
from collector.inputs.text import safe_text

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


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


def emit(text: str = "", file: TextIO | None = None) -> None:
    """print() for text that may hold input-derived strings: sanitised by safe_text."""
    print(safe_text(text), file=file or sys.stdout)


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


def add_fail_on_irregular(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on-irregular", action="store_true",
        help="exit 1 when the job is irregular or stuck (for CI and cron checks)",
    )


def exit_status(status: str, args: argparse.Namespace) -> int:
    """0, or 1 when an irregularity (or hang) was found and --fail-on-irregular was given."""
    return 1 if getattr(args, "fail_on_irregular", False) and status in ("irregular", "hang") else 0


class Stages:
    """Advances a rich progress bar (call it with a count) and names the stage running; with no bar
    (stderr is not a terminal) it does nothing."""

    def __init__(self, bar: Progress | None, task: TaskID | None) -> None:
        self._bar = bar
        self._task = task
        self._started = False

    def next(self, what: str) -> None:
        """Finish the current stage and show `what` as the one now running."""
        if self._bar is None or self._task is None:
            return
        self._bar.update(self._task, description=what, advance=1 if self._started else 0)
        self._started = True

    def __call__(self, n: float = 1) -> None:
        if self._bar is None or self._task is None:
            return
        self._bar.update(self._task, advance=n)


@contextmanager
def progress(label: str, total: float | None = None) -> Iterator[Stages]:
    """A rich progress bar on stderr for long work; silent when stderr is not a terminal.

    Yields a `Stages`: call it with a count to advance (`bar(len(batch))`), or `.next(what)`
    to finish one named stage and start the next. rich is imported only when a bar will be shown:
    it costs ~8 MB of a verb's peak memory (issue #14's budget) for a bar nobody sees.
    """
    if not (sys.stderr.isatty() or os.environ.get("FORCE_TERMINAL")):
        yield Stages(None, None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(
        SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
        console=console, transient=True, disable=not console.is_terminal,
    )
    with bar:
        task = bar.add_task(label, total=total)
        stages = Stages(bar, task)
        yield stages
        bar.update(task, completed=total or 0)
