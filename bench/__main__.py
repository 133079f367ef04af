"""Run every benchmark module in bench/ in turn (each in its own process, so peak memory is its own)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path


def main() -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))
    failed = []
    for name in names:
        print(f"\n=== bench.{name} ===", flush=True)
        if subprocess.call([sys.executable, "-m", f"bench.{name}", *sys.argv[1:]]) != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
