"""Live packet capture through tshark (the engine behind pyshark), written as a pcap file (microsecond timestamps: live captures cannot be written in the nanosecond format).

tshark is driven directly (pyshark would decode every packet in Python, far too slow for
RoCE rates); the capture file is then read by the vectorized reader in collector.network.pcap.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from collector.inputs.errors import UserError


def capture_to_pcap(iface: str, duration_s: float, out: Path, snaplen: int = 128,
                    bpf: str | None = None) -> Path:
    """Capture `duration_s` seconds on `iface` into `out` (pcap)."""
    tshark = shutil.which("tshark")
    if tshark is None:
        raise UserError("tshark is not installed", "install it (apt-get install tshark) or capture with tcpdump and use --read")
    if duration_s <= 0:
        raise UserError(f"--duration {duration_s} must be > 0", "give the capture length in seconds, e.g. --duration 30")
    cmd = [tshark, "-i", iface, "-a", f"duration:{duration_s:g}", "-s", str(snaplen), "-F", "pcap",
           "-w", str(out), "-q"]
    if bpf:
        cmd += ["-f", bpf]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60)
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"tshark did not stop after {duration_s:g} s", "check the interface and try again") from exc
    if proc.returncode != 0 or not out.exists():
        lines = [x for x in proc.stderr.strip().splitlines() if x and not x.startswith("Capturing on")]
        said = [x for x in lines if x.startswith(("tshark:", "dumpcap:"))] or lines
        why = said[0] if said else f"exit code {proc.returncode}"
        raise UserError(f"capture on '{iface}' failed: {why}", "check the interface name (ip link) and that you may capture (root or the wireshark group)")
    return out
