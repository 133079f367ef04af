"""collector.logs: masking, plain/gzip reading, the shape cache in front of Drain3, iterations."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import numpy as np
import pytest

from collector.inputs.errors import TraceError
from collector.logs import SHAPE_BYTES, TemplateCache, mask, parse_logs

LOG = """\
node-3:1234:1275 [4] NCCL INFO Bootstrap : Using eth0:10.0.3.14<0>
[rank12]: 2026-11-22 07:00:01,100 INFO > building train, validation, and test datasets ...

[rank12]: 2026-11-22 07:00:02,100 INFO iteration        1/     100 | lm loss: 7.1234 |
[rank12]: 2026-11-22 07:00:02,300 INFO saving checkpoint at iteration       1 to /mnt/ckpt/run7
[rank12]: 2026-11-22 07:00:03,100 INFO iteration        2/     100 | lm loss: 7.0012 |
Nov 22 07:00:03 node-3 kernel: [ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus.
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_mask_replaces_ips_hex_paths_and_numbers() -> None:
    assert mask("Using eth0:10.0.3.14<0>") == "Using eth<NUM>:<IP><<NUM>>"
    assert mask("comm 0x7f3c2a1b rank 3") == "comm <HEX> rank <NUM>"
    assert mask("loading /data/pile/x_doc.idx now") == "loading <PATH> now"
    assert mask("[rank12]: lm loss: 7.1234") == "[rank<NUM>]: lm loss: <NUM>"
    assert mask("NET/IB : Got completion") == "NET/IB : Got completion"  # not a path


def test_parse_numbers_lines_and_keeps_empty_lines(tmp_path: Path) -> None:
    f = write(tmp_path / "logs" / "node-3.log", LOG)
    logs = parse_logs([f], root=tmp_path)
    assert len(logs) == 7
    assert logs.hosts == ["node-3"] and logs.files == ["logs/node-3.log"]
    assert logs.line.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert logs.where(6) == "logs/node-3.log:7" and "Xid" in logs.text(6)
    # the two iteration lines share one template; the Xid line has its own
    ev = logs.event
    assert ev[3] == ev[5] and ev[6] not in (ev[3], ev[0])


def test_gzip_reads_like_plain(tmp_path: Path) -> None:
    plain = parse_logs([write(tmp_path / "a" / "node-3.log", LOG)])
    g = tmp_path / "b" / "node-3.log.gz"
    g.parent.mkdir()
    g.write_bytes(gzip.compress(LOG.encode()))
    zipped = parse_logs([g])
    assert zipped.hosts == ["node-3"]
    assert [zipped.templates[e] for e in zipped.event] == [plain.templates[e] for e in plain.event]
    assert zipped.iteration.tolist() == plain.iteration.tolist()


def test_iterations_come_from_progress_lines_only(tmp_path: Path) -> None:
    logs = parse_logs([write(tmp_path / "node-3.log", LOG)])
    assert logs.progress.tolist() == [False, False, False, True, False, True, False]
    assert logs.iteration.tolist() == [-1, -1, -1, 1, 1, 2, 2]


def test_iterations_restart_per_host(tmp_path: Path) -> None:
    a = write(tmp_path / "node-0.log", "[rank0]: step: 40 loss: 1.0\n[rank0]: step: 41 loss: 1.0\nbye\n")
    b = write(tmp_path / "node-1.log", "hello\n[rank8]: step: 3 loss: 1.0\n")
    logs = parse_logs([a, b])
    assert logs.iteration.tolist() == [40, 41, 41, -1, 3]


def test_cache_sends_only_new_shapes_to_drain(tmp_path: Path) -> None:
    lines = [f"[rank{r}]: step: {i} loss: {i * 0.1:.3f}" for i in range(300) for r in range(4)]
    lines += [f"node-1:{i}:{i + 41} [{i % 8}] NCCL INFO Using network IB" for i in range(200)]
    f = write(tmp_path / "node-1.log", "\n".join(lines) + "\n")
    cache = TemplateCache()
    first = parse_logs([f], cache)
    assert len(first) == 1400
    n_shapes = len(cache.shapes)
    assert n_shapes <= 4 and len(cache.drain.id_to_cluster) <= n_shapes
    again = parse_logs([f], cache)
    assert len(cache.shapes) == n_shapes
    np.testing.assert_array_equal(first.event, again.event)


def test_a_long_line_is_mined_from_its_start_and_kept_whole(tmp_path: Path) -> None:
    """60 KiB state dumps made template mining ~5x slower per byte than a normal log (masking, Drain
    and the stage rules cost in proportion to a shape's length): a shape is cut to its first
    SHAPE_BYTES, so dumps that differ only further on are one event, and the line itself is kept."""
    rng = np.random.default_rng(5)
    words = ["layer_w", "grad_b", "opt_state", "attn_mean", "norm_var"]
    start = "[rank0]: INFO state dump: " + " ".join(rng.choice(words, 400))
    dumps = [start + " " + " ".join(rng.choice(words, 6400)) for _ in range(3)]
    assert len(start) > SHAPE_BYTES and min(map(len, dumps)) > 50_000
    f = write(tmp_path / "node-0.log", LOG + "\n".join(dumps) + "\n")
    logs = parse_logs([f])
    assert logs.shapes[logs.shape[7]] == mask(start[:SHAPE_BYTES])  # (its only digit is rank0's)
    assert len(set(logs.event[7:].tolist())) == 1  # one event: they start alike
    assert logs.event[6] != logs.event[7]  # the Xid line stays its own event
    assert [logs.text(i) for i in range(7, 10)] == dumps  # shown, and read for kinds, as written


def test_corrupt_gzip_is_a_trace_error(tmp_path: Path) -> None:
    g = tmp_path / "node-0.log.gz"
    g.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceError, match="corrupt gzip"):
        parse_logs([g])


def test_missing_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"cannot (be )?read"):
        parse_logs([tmp_path / "nope.log"])


def test_random_bytes_are_refused_not_judged(tmp_path: Path) -> None:
    """A log of random bytes is not a log: one line saying so, never a verdict."""
    rng = np.random.default_rng(7)
    path = tmp_path / "logs" / "node-0.log"
    path.parent.mkdir(parents=True)
    path.write_bytes(rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes())
    with pytest.raises(TraceError, match="not a text log"):
        parse_logs([path])
    gz = tmp_path / "logs" / "node-1.log.gz"
    gz.write_bytes(gzip.compress(rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes()))
    with pytest.raises(TraceError, match="not a text log"):
        parse_logs([gz])


def test_random_printable_text_is_refused_but_json_lines_and_hashes_in_words_are_logs(tmp_path: Path) -> None:
    """Base64 of random bytes is printable but no log: every line would be an unknown event, and a
    host would be blamed for it. JSON lines without spaces and lines that carry a hash are logs."""
    rng = np.random.default_rng(8)
    blobs = "".join(base64.b64encode(rng.bytes(60)).decode() + "\n" for _ in range(500))
    with pytest.raises(TraceError, match=r"not a log .* encoded data"):
        parse_logs([write(tmp_path / "logs" / "node-0.log", blobs)])
    hexes = "".join(rng.bytes(24).hex() + "\n" for _ in range(500))
    with pytest.raises(TraceError, match="encoded data"):
        parse_logs([write(tmp_path / "logs" / "node-1.log", hexes)])
    jsonl = '{"ts":1700000000,"level":"INFO","rank":0,"msg":"step=12,loss=2.31"}\n' * 200
    assert len(parse_logs([write(tmp_path / "logs" / "node-2.log", jsonl)])) == 200
    hashed = "".join(f"[rank0]: saved checkpoint {rng.bytes(20).hex()}\n" for _ in range(200))
    assert len(parse_logs([write(tmp_path / "logs" / "node-3.log", hashed)])) == 200


def test_text_with_utf8_and_colour_is_text(tmp_path: Path) -> None:
    path = write(tmp_path / "logs" / "node-0.log", LOG + "[rank0]: ═══ épochs \x1b[31mwarning\x1b[0m\n" * 50)
    assert len(parse_logs([path])) > 50
