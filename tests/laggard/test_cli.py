"""The CLI's own contract: a mistake in the invocation is one line on stderr and exit 2."""

from __future__ import annotations

import pytest

from laggard.cli import main


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
