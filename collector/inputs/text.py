"""Text from inputs (log lines, host and job names, file names) made safe to show: the one sanitiser
that every terminal output and every rendered report uses, so a hostile log line cannot recolour,
retitle or clear a terminal, nor put raw control characters into a report page."""

from __future__ import annotations

import re

#: C0 controls but tab and newline, DEL, C1 controls, and the bidi overrides that reorder what a reader sees
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe_text(text: str) -> str:
    """`text` with control, escape and bidi-override characters shown as \\xNN (\\uNNNN) instead of
    being obeyed; tab and newline are kept."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                       text)
