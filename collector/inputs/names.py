"""The one check for every name that may reach a command: host names, NIC names, GPU indexes.

A name from meta.json ends up as an ssh target, a `scontrol ... NodeName=` value or an `ethtool`
argument, so each must be exactly what it claims to be: a host name per RFC 1123 (letters,
digits, hyphens, dot-separated labels of at most 63 characters, none starting or ending with a
hyphen), with one relaxation: an underscore inside a label (`gpu_node_01`), which real clusters use
and which ssh, Slurm and Kubernetes node names accept — never a Slurm host list (`node[0-9]`),
`user@host`, an option (`--all`) or anything with whitespace; a NIC name per the kernel's `dev_valid_name()` (at most 15 bytes, no `/`, `:` or
whitespace, not `.` or `..`) that does not start with a dash; a GPU index a non-negative integer.
Each function returns None for a good name, else one phrase saying what is wrong.
"""

from __future__ import annotations

import re
from typing import Any

#: a label starts and ends with a letter or digit; '-' and '_' only inside (fullmatch: no newline slips by)
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?")
MAX_GPU_INDEX = 1023  # nvidia-smi indexes; no node has more GPUs


def host_problem(name: Any) -> str | None:
    """Why `name` is not an RFC 1123 host name (underscores inside labels allowed), or None."""
    if not isinstance(name, str):
        return f"host {name!r} is not a string"
    if not name or len(name) > 253:
        return f"host {name[:40]!r} must be 1 to 253 characters"
    if not all(_LABEL.fullmatch(label) for label in name.removesuffix(".").split(".")):
        return (f"host {name[:60]!r} is not an RFC 1123 host name (letters, digits, '-' and '.', '_' inside "
                "a label; no leading '-', no '@', brackets or whitespace)")
    return None


def nic_problem(name: Any) -> str | None:
    """Why `name` is not a kernel network interface name usable as an argument, or None."""
    if not isinstance(name, str):
        return f"NIC {name!r} is not a string"
    if not 1 <= len(name.encode()) <= 15 or name in (".", ".."):
        return f"NIC {name[:40]!r} must be 1 to 15 bytes and not '.' or '..'"
    if name.startswith("-") or any(c in name for c in "/:") or any(c.isspace() or ord(c) < 0x21 for c in name) \
            or not name.isprintable():
        return f"NIC {name[:40]!r} is not an interface name (no leading '-', '/', ':' or whitespace)"
    return None


def gpu_problem(index: Any) -> str | None:
    """Why `index` is not a GPU index (an int in 0..MAX_GPU_INDEX, not a bool), or None."""
    if isinstance(index, bool) or not isinstance(index, int):
        return f"GPU index {index!r} is not an integer"
    if not 0 <= index <= MAX_GPU_INDEX:
        return f"GPU index {index} is outside 0..{MAX_GPU_INDEX}"
    return None
