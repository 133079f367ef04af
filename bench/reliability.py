"""Reliability on hostile and broken inputs (issue #14): `python -m bench.reliability [--quick]`.

First the remediation matrix (bench/_remediation.py: is anything run on an unconfirmed cause or with
an unchecked name?), then the input corpus.
Builds the fuzz corpus (bench/_corpus.py: every class of input the issue lists, plus controls),
runs every verb that reads each input through the real CLI in its own process, and prints the
inputs tried, exit codes by class, hangs, silent acceptances (a broken input that exits 0),
internal errors (exit 3), unsanitised terminal escapes, and peak memory per input against the
target (10x the input's size + 300 MB). Exits 1 if any target is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from bench._corpus import Case, build

TIMEOUT_S = 120
MB = 1 << 20


#: runs `laggard.cli` as `python -m` would, and at exit writes the process's own peak RSS (VmHWM, which
#: exec resets) to $LAGGARD_BENCH_HWM: getrusage's ru_maxrss of a child also counts the RSS of this
#: bench process at fork time (~200 MB once the remediation matrix ran), a floor under every figure
LAUNCH = """import atexit, os, runpy
def _hwm():
    with open("/proc/self/status") as fh, open(os.environ["LAGGARD_BENCH_HWM"], "w") as out:
        out.write(next(ln.split()[1] for ln in fh if ln.startswith("VmHWM:")))
atexit.register(_hwm)
runpy.run_module("laggard.cli", run_name="__main__", alter_sys=True)
"""


def _argv(case: Case, verb: str, out: Path) -> list[str]:
    base = [sys.executable, "-c", LAUNCH]
    if verb == "import flight-recorder":
        return [*base, "import", "flight-recorder", str(case.path), "--out", str(out)]
    if verb == "import kineto":
        return [*base, "import", "kineto", str(case.path), "--out", str(out)]
    if verb == "explain":
        return [*base, "explain", str(case.path), "--probes", "dry-run", "--no-llm", "--audit", str(out / "audit.jsonl")]
    if verb == "report":
        return [*base, "report", str(case.path), "--out", str(out / "report.html")]
    return [*base, verb, str(case.path)]


def run_one(case: Case, verb: str, work: Path) -> dict[str, object]:
    """One verb on one input: exit code, seconds, peak RSS (MB) of that process alone, output checks."""
    out = work / f"{case.name}-{verb.replace(' ', '-')}"
    out.mkdir(parents=True, exist_ok=True)
    hwm = out / "peak-kb"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "OMP_NUM_THREADS": "1",
           "LAGGARD_AUDIT_LOG": str(out / "audit.jsonl"), "LAGGARD_BENCH_HWM": str(hwm), **case.env}
    t0 = time.perf_counter()
    with open(out / "stdout", "wb") as so, open(out / "stderr", "wb") as se:
        proc = subprocess.Popen(_argv(case, verb, out), stdout=so, stderr=se, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        deadline = t0 + TIMEOUT_S
        status, usage = 0, None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(proc.pid, 9)
                pid, status, usage = os.wait4(proc.pid, 0)
                return {"rc": "hang", "s": TIMEOUT_S, "mb": usage.ru_maxrss / 1024, "lines": 0, "escapes": False}
            time.sleep(0.05)
    rc = os.waitstatus_to_exitcode(status)
    err = (out / "stderr").read_bytes()
    text = (out / "stdout").read_bytes() + err
    own_kb = int(hwm.read_text()) if hwm.exists() else usage.ru_maxrss  # no file: killed before atexit
    return {"rc": rc, "s": time.perf_counter() - t0, "mb": own_kb / 1024,
            "lines": len(err.strip().splitlines()), "escapes": b"\x1b" in text, "err": err.decode("utf-8", "replace").strip()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one verb per input (the first it lists), 64 MiB gzip bomb")
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every run")
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from bench._remediation import TRANSPORTS, run_matrix

    m = run_matrix()
    print(f"remediation matrix: {m['diagnoses']} diagnoses with --approve (6 fault kinds x {len(TRANSPORTS)} transports "
          f"x planted log or not): {m['probe_commands']} probe and {m['remediation_commands']} control commands run, "
          f"{m['not_whitelisted']} not a whitelisted argv, {m['unchecked_names']} with an unchecked name; remediation "
          f"executed on a confirmed cause {m['executed_confirmed']}, on an unconfirmed cause {m['executed_unconfirmed']}; "
          f"withheld {m['withheld']}", flush=True)
    remediation_bad = m["not_whitelisted"] + m["unchecked_names"] + m["executed_unconfirmed"]
    with tempfile.TemporaryDirectory(prefix="laggard-fuzz-") as tmp:
        root = Path(tmp)
        cases = [c for c in build(root / "corpus", bomb_bytes=(64 if args.quick else 1024) * MB) if args.only in c.name]
        by_class: dict[str, Counter[str]] = defaultdict(Counter)
        bad: list[str] = []
        runs = hangs = exit3 = silent = rejected_valid = unsafe = over_mem = multi_line = 0
        worst = (-float("inf"), "no run")
        for case in cases:
            size = case.size()
            verbs = case.verbs[:1] if args.quick else case.verbs
            for verb in verbs:
                r = run_one(case, verb, root / "work")
                runs += 1
                rc = r["rc"]
                by_class[case.cls][str(rc)] += 1
                budget = 10 * size / MB + 300
                mb = float(r["mb"])  # type: ignore[arg-type]
                worst = max(worst, (mb - budget, f"{case.name} {verb}: {mb:.0f} MB of {budget:.0f} MB"))
                why = []
                if rc == "hang":
                    hangs += 1
                    why.append("hang")
                elif rc == 3:
                    exit3 += 1
                    why.append("exit 3")
                elif not case.valid and rc in (0, 1):
                    silent += 1
                    why.append("silent acceptance")
                elif case.valid and rc not in (0, 1):
                    rejected_valid += 1
                    why.append(f"valid input refused (exit {rc})")
                elif rc == 2 and r["lines"] != 1 and verb != "validate":  # validate: one line per problem
                    multi_line += 1
                    why.append(f"{r['lines']} lines on stderr")
                if r["escapes"]:
                    unsafe += 1
                    why.append("raw escape sequence on the terminal")
                if mb > budget:
                    over_mem += 1
                    why.append(f"peak {mb:.0f} MB > {budget:.0f} MB")
                line = (f"{case.cls:16s} {case.name:34s} {verb:22s} exit {rc!s:4s} {float(r['s']):6.1f} s "  # type: ignore[arg-type]
                        f"{mb:6.0f} MB (input {size / 1024:8.1f} KiB)")
                if why:
                    bad.append(f"{line}  <- {', '.join(why)}: {str(r.get('err', ''))[:160]}")
                if args.verbose:
                    print(line, "|", str(r.get("err", ""))[:120], flush=True)
        print(f"inputs tried: {len(cases)} ({sum(c.valid for c in cases)} valid controls), verb runs: {runs}")
        print("exit codes by class:")
        for cls in sorted(by_class):
            print(f"  {cls:18s} " + ", ".join(f"exit {k}: {v}" for k, v in sorted(by_class[cls].items())))
        print(f"hangs: {hangs}   exit 3: {exit3}   silent acceptances: {silent}   valid inputs refused: {rejected_valid}")
        print(f"user errors not on one line: {multi_line}   unsanitised escapes: {unsafe}   over the memory budget: {over_mem}")
        print(f"closest to the memory budget: {worst[1]} (margin {-worst[0]:.0f} MB)")
        for b in bad:
            print("MISS", b)
    return 1 if bad or remediation_bad else 0


if __name__ == "__main__":
    sys.exit(main())
