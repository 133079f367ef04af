"""The `laggard` console script: one verb per user task, each in laggard/commands/<verb>.py.

Every command module defines `register(subparsers)` (adds its parser, sets `func`) and is found
by name, so adding a verb never touches this file. Exit codes: 0 ok, 1 irregularity found with
--fail-on-irregular, 2 user error (one line on stderr), 3 internal error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from collector.inputs.errors import UserError
from collector.inputs.text import safe_text
from laggard import commands
from laggard.cliutil import emit

EPILOG = """\
examples:
  laggard simulate --gpus 256 --tp 8 --pp 4 --steps 30 --fault gpu:rank=77,factor=2 --out /tmp/t
  laggard timeline /tmp/t
  laggard localize /tmp/t --format json
  laggard report /tmp/t --out report.html

Exit codes: 0 ok, 1 irregularity found (with --fail-on-irregular), 2 bad input or usage.
Run `laggard VERB --help` for each verb's options and examples."""


#: Arrow's allocator, chosen before pyarrow is first imported (the user's ARROW_DEFAULT_MEMORY_POOL wins).
#: Its default, mimalloc, reserves ~30 MB a small run never uses (issue #14's budget of 10x input +
#: 300 MB; bench/memory.py); jemalloc, which pyarrow's Linux builds ship, peaks lowest on small and on
#: 5 M-row traces alike; elsewhere the system allocator (always built in, so no warning is printed).
ARROW_POOL = "jemalloc" if sys.platform == "linux" else "system"
#: jemalloc's settings: pages freed go back to the system at once. Its default keeps them for a second
#: or more, through `release_unused` too, so a 5 M-row read stood ~280 MB above its live data when the
#: analysis began (issue #14); the user's JE_ARROW_MALLOC_CONF wins.
JEMALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"


def _verb_modules() -> dict[str, str]:
    """verb -> module name: `import_` serves `import`, `train_detector` serves `train-detector`."""
    found = (Path(d).glob("*.py") for d in commands.__path__)  # pkgutil alone costs 15 ms of start-up
    return {
        f.stem.rstrip("_").replace("_", "-"): f.stem
        for files in found for f in files
        if not f.stem.startswith("_")
    }


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's contract for a wrong invocation: one line saying what is wrong and where
    the help is, exit 2 (argparse prints the whole usage first). Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {safe_text(message)} — see `{self.prog} --help`\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that verb's module is imported (heavy imports stay lazy); "" for none."""
    parser = Parser(
        prog="laggard",
        description="Find what makes a distributed training job slow or stuck, and why.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from laggard import __version__

    parser.add_argument("--version", action="version", version=f"laggard {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    modules = _verb_modules()
    if only == "":  # --version alone: no verb needs loading
        names: list[str] = []
    else:
        names = [modules[only]] if only in modules else [modules[v] for v in sorted(modules)]
    for name in names:
        importlib.import_module(f"laggard.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", JEMALLOC_CONF)
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only="" if verb is None and "--version" in argv else verb)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"laggard {args.verb}: error: {safe_text(str(exc)).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        emit(f"laggard {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # an internal bug: one line, traceback only when asked for
        if os.environ.get("LAGGARD_DEBUG"):
            raise
        print(
            f"laggard {args.verb}: internal error: {type(exc).__name__}: {safe_text(str(exc)).replace(chr(10), ' ')[:300]} "
            "(set LAGGARD_DEBUG=1 for the traceback and please report it)",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
