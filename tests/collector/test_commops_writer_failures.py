"""The sidecar's writer when nothing can be written (issue #14): it says so plainly, counts what it
drops, keeps a bounded backlog, retries on every flush, and recovers when the directory does."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from collector.commops import writer
from collector.commops.recorder import Recorder, make_collective
from collector.commops.writer import ShardWriter


@pytest.fixture(scope="module")
def world1() -> Iterator[None]:
    if not dist.is_initialized():
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(21000 + os.getpid() % 20000)
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_unwritable_directory_drops_plainly_counts_and_retries(world1: None, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(writer, "MAX_BUFFER_ROWS", 20)
    rec = Recorder(1 << 8)
    rec.rank = 0
    wrapped = make_collective(rec, lambda tensor, op=None, group=None, async_op=False: None, "all_reduce", 0, 2)
    (tmp_path / "commops").write_text("not a directory")  # every shard write now fails with an OSError
    w = ShardWriter(rec, tmp_path, 0, 1, 60, "j")
    t = torch.ones(1)
    for _ in range(100):
        wrapped(t)
    w.flush()
    w.flush()  # a retry: still failing, said once
    err = capfd.readouterr().err
    assert err.count("cannot write to") == 1 and "DROPPED" in err
    assert w.write_failures == 2 and w.rows == 0 and w.buffered == 20 and w.dropped == 80
    (tmp_path / "commops").unlink()
    (tmp_path / "commops").mkdir()
    w.flush()  # the directory is back: the held backlog is written, the loss stays counted
    assert "writing to" in capfd.readouterr().err
    assert w.rows == 20 and w.rows + w.dropped == 100 and not w.failing
    df = pd.read_parquet(next((tmp_path / "commops").glob("*.parquet")))
    assert df["seq"].tolist() == list(range(81, 101))  # the newest records survive
