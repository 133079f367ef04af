"""The CLI's own contract: a mistake in the invocation is one line on stderr and exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from laggard.cli import main
from tests.conftest import REPO


@pytest.mark.parametrize("argv, words", [
    (["localize", "--top", "abc", "t"], "argument --top: invalid int value: 'abc'"),
    (["localize"], "the following arguments are required: trace"),
    (["nosuchverb"], "invalid choice: 'nosuchverb'"),
    (["sidecar", "run", "t", "--window", "x"], "argument --window: invalid int value"),
    (["import", "nosuchsource", "d"], "invalid choice: 'nosuchsource'"),
    (["logs", "t", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_an_invocation_mistake_is_one_line_and_exit_2(argv: list[str], words: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err and "--help" in err, err


def test_what_validate_refuses_every_verb_refuses_even_one_that_does_not_read_it(tmp_path: Path, cli: Any) -> None:
    """`timeline` reads CommOps only, yet a trace whose flows file breaks the contract is refused
    there too, with validate's own line (the reliability corpus found it accepted)."""
    trace = tmp_path / "t"
    trace.mkdir()
    for name in ("meta.json", "commops.parquet"):
        shutil.copy(REPO / "traces" / "gpu-spike" / name, trace / name)
    (trace / "flows.csv").write_text("start_ns,end_ns,src_ip,dst_ip,src_port,dst_port,proto,qp,bytes,packets\n"
                                     "1760000000000000000,1760000000000001000,node-0,10.0.0.2,5000,4791,roce,17,4096,4\n")
    lines = set()
    for verb in ("validate", "timeline", "localize"):
        proc = cli(verb, trace)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (verb, proc.stderr)
        lines.add(proc.stderr.strip().split(": error: ")[-1])
    assert lines == {f"{trace / 'flows.csv'}: src_ip 'node-0' is not an IP address (1 distinct such value(s)) — "
                     "give each flow's addresses as IPv4 (10.0.0.1) or IPv6 (fd00::1)"}, lines
