from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from explain.actions.backends import LocalBackend, ProbeBackend, SSHBackend
from explain.actions.probes import ProbeCall, interpret


def test_ssh_backend_builds_argv_not_strings() -> None:
    b = SSHBackend(user="ops")
    cmd = b.command("node-3", ["nvidia-smi", "--format=csv,noheader,nounits", "-i", "5"])
    assert cmd[-6:] == ["ops@node-3", "--", "nvidia-smi", "--format=csv,noheader,nounits", "-i", "5"]
    assert cmd[0] == "ssh" and "BatchMode=yes" in cmd


@pytest.mark.parametrize("argv", [["cat", "/etc/passwd; reboot"], ["echo", "$(id)"], ["ls", "a b"], ["x", ""]])
def test_ssh_backend_refuses_shell_metacharacters(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        SSHBackend().command("node-1", argv)


def test_ssh_backend_refuses_option_like_host() -> None:
    with pytest.raises(ValueError):
        SSHBackend().command("-oProxyCommand=reboot", ["df", "-P"])


def test_backends_match_the_protocol() -> None:
    from simulator.virtual_cluster import VirtualCluster

    assert isinstance(LocalBackend(), ProbeBackend) and isinstance(SSHBackend(), ProbeBackend)
    assert hasattr(VirtualCluster, "run")


def test_dry_run_executes_nothing() -> None:
    b = LocalBackend(dry_run=True)
    assert b.run(None, ["touch", "/tmp/should-not-exist-laggard"], 5) == (-1, "")
    assert b.ran == [["touch", "/tmp/should-not-exist-laggard"]]


@pytest.mark.skipif(shutil.which("df") is None, reason="df not installed")
def test_local_backend_runs_a_real_probe() -> None:
    rc, out = LocalBackend().run(None, ["df", "-P"], 10)
    assert rc == 0 and "Mounted on" in out
    res = interpret(ProbeCall("disk_space", "localhost", {}, ["df", "-P"]), rc, out, "P1")
    assert res.rc == 0 and res.summary


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 not installed")
def test_local_ip_link_parses() -> None:
    rc, out = LocalBackend().run(None, ["ip", "-j", "-s", "-s", "link", "show"], 10)
    res = interpret(ProbeCall("nic_link", "localhost", {}, []), rc, out, "P1")
    assert (rc == 0 and "interface" in res.summary) or res.findings


def test_missing_command_is_reported_not_raised() -> None:
    assert LocalBackend().run(None, ["laggard-no-such-tool"], 5)[0] == 127


@pytest.mark.timeout(30)
@pytest.mark.parametrize("truth, words", [(None, "not a regular file"), (b"[", "not valid JSON"),
                                          (b"[1]", "not the simulator's ground truth")])
def test_virtual_probes_refuse_a_truth_json_they_cannot_read(tmp_path: Path, truth: bytes | None,
                                                             words: str) -> None:
    from collector.inputs.errors import UserError
    from laggard.backends import choose_backend

    (tmp_path / "meta.json").write_text('{"job": "j", "world_size": 1, "ranks": {"0": {"host": "node-0"}}}')
    if truth is None:
        os.mkfifo(tmp_path / "truth.json")
    else:
        (tmp_path / "truth.json").write_bytes(truth)
    with pytest.raises(UserError, match=words):
        choose_backend(tmp_path, "virtual")
