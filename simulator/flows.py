"""Network flow bursts (and a RoCEv2 pcap of the whole job) consistent with a simulated trace's CommOps.

Every collective instance becomes bursts on the edges its algorithm uses between members on
different hosts (ring neighbours for all-reduce, reduce-scatter, all-gather, broadcast, reduce;
every pair for all-to-all), every send a burst to its peer; traffic inside a host never reaches
the network. Times are converted back to true time with truth.json's clock offsets, as a capture
point on the fabric would see them. Inside a collective the data moves once the last member has
arrived; before that, a member that is present already pushes its first chunk into its
neighbour's buffers and stalls (so a late member's own sends start last). When a network fault slows one edge, the ring runs at
that edge's pace: the slow edge is busy the whole time, the others send each chunk at line rate
and wait.
"""

from __future__ import annotations

import json
import tempfile
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from collector.inputs.errors import UserError
from collector.network.flows import DEFAULT_GAP_NS, Bursts, bursts_table, coalesce
from collector.network.pcap import write_pcap
from collector.trace.meta import JobMeta
from collector.trace.schema import FLOW_PROTOS, FLOWS_SCHEMA, ROCE_UDP_PORT
from collector.trace.traceio import Trace, write_table
from simulator.cluster import Layout
from simulator.config import FaultSpec, SimConfig
from simulator.faults import FaultModel, resolve_faults
from simulator.writer import simulate_trace

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")
ROCE_MTU = 4096
CHUNK_STEPS = 8  # chunk rounds drawn per ring transfer when an edge has to wait for a slower one
PCAP_MAX_PACKETS = 2_000_000  # about 290 MB of 128-byte packets: past that, flows.parquet is the format
PCAP_SNAPLEN = 128


def _ip_words(ips: np.ndarray) -> np.ndarray:
    """Dotted quads -> v4-mapped low words, as collector.network.pcap encodes addresses."""
    parts = np.array([list(map(int, ip.split("."))) for ip in ips], dtype=np.uint64).reshape(-1, 4)
    v4 = (parts[:, 0] << np.uint64(24)) | (parts[:, 1] << np.uint64(16)) | (parts[:, 2] << np.uint64(8)) | parts[:, 3]
    return np.uint64(0xFFFF_0000_0000) | v4


def _config(truth: dict) -> SimConfig | None:
    """The simulated job's config, faults included, from truth.json (None for a trace not simulated)."""
    cfg_raw = truth.get("config")
    if not cfg_raw:
        return None
    specs = []
    for f in truth.get("faults", []):
        steps = (int(f["start_step"]), int(f["end_step"])) if "start_step" in f else None
        specs.append(FaultSpec(kind=f["kind"], factor=float(f["factor"]), rank=f.get("rank"), host=f.get("host"),
                               hosts=tuple(f["hosts"]) if f.get("hosts") else None, switch=f.get("switch"),
                               stage=f.get("stage"), steps=steps, pattern=f.get("pattern", "persistent")))
    known = set(SimConfig.__dataclass_fields__)
    return SimConfig(**{k: v for k, v in cfg_raw.items() if k in known and k != "faults"}, faults=specs).resolved()


def _fault_model(truth: dict) -> tuple[FaultModel | None, Layout | None]:
    """Rebuild the simulator's fault model from truth.json, to know which edges were slow."""
    cfg = _config(truth)
    if cfg is None:
        return None, None
    layout = Layout.build(cfg)
    return FaultModel(cfg, layout, resolve_faults(cfg, layout)), layout


def _edges(meta: JobMeta) -> pd.DataFrame:
    """Network edges of every group: (group, src, dst, pairwise) for ring and all-to-all use."""
    host = {r: i.host for r, i in meta.ranks.items()}
    rows = []
    for g, mem in meta.groups.items():
        if len({host[m] for m in mem}) < 2:
            continue
        k = len(mem)
        for i in range(k):  # ring neighbours
            a, b = mem[i], mem[(i + 1) % k]
            if host[a] != host[b] and a != b:
                rows.append((g, a, b, False))
        for a in mem:  # every ordered pair, for all-to-all
            for b in mem:
                if a != b and host[a] != host[b]:
                    rows.append((g, a, b, True))
    return pd.DataFrame(rows, columns=["group", "src", "dst", "pairwise"])


def flow_intervals(trace: Trace, truth: dict) -> pd.DataFrame:
    """Per network edge and operator instance: [start, end] in true ns, bytes, plus fault factors."""
    meta = trace.meta
    ops = trace.commops(columns=["rank", "group", "op", "seq", "peer", "nbytes", "start_ns", "end_ns", "step"])
    hosts = meta.hosts()
    off = truth.get("clock_offsets_ns", {})
    rank_off = pd.Series({r: int(off.get(i.host, 0)) for r, i in meta.ranks.items()})
    ops["start_ns"] -= rank_off.reindex(ops["rank"]).to_numpy()
    ops["end_ns"] -= rank_off.reindex(ops["rank"]).to_numpy()
    host_idx = {h: i for i, h in enumerate(hosts)}
    rank_host = pd.Series({r: host_idx[i.host] for r, i in meta.ranks.items()})
    eager = (truth.get("config") or {}).get("p2p", "eager") == "eager"  # traces older than the setting were eager
    out = [_collective_intervals(ops, _edges(meta)), _p2p_intervals(ops, rank_host, eager)]
    iv = pd.concat([o for o in out if len(o)], ignore_index=True) if any(len(o) for o in out) else pd.DataFrame()
    return iv


def _collective_intervals(ops: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    coll = ops[ops["peer"] < 0]
    coll = coll[coll["group"].isin(set(edges["group"]))]
    if coll.empty:
        return pd.DataFrame()
    inst = coll.groupby(["group", "seq"], sort=False).agg(
        op=("op", "first"), nbytes=("nbytes", "first"), step=("step", "first"),
        last=("start_ns", "max"), done=("end_ns", "min"), k=("rank", "size")).reset_index()
    inst["pairwise"] = inst["op"] == "all_to_all"
    x = inst.merge(edges, on=["group", "pairwise"])
    arrive = coll.set_index(["group", "seq", "rank"])["start_ns"]
    x["arr_src"] = arrive.reindex(pd.MultiIndex.from_arrays([x["group"], x["seq"], x["src"]])).to_numpy()
    x["arr_dst"] = arrive.reindex(pd.MultiIndex.from_arrays([x["group"], x["seq"], x["dst"]])).to_numpy()
    k = x["k"].to_numpy(dtype=np.float64)
    coef = np.select([x["op"] == "all_reduce", x["op"] == "all_to_all", x["op"].isin(["broadcast", "reduce"])],
                     [2 * (k - 1) / k, 1 / k, 1.0], (k - 1) / k)
    x["bytes"] = np.maximum(coef * x["nbytes"].to_numpy(), 1).astype(np.int64)
    x["t1"] = np.maximum(x["done"], x["last"] + 1)
    x["early"] = x["arr_src"] < x["last"]
    x["kind"] = "coll"
    return x[["group", "seq", "step", "src", "dst", "bytes", "last", "t1", "early", "arr_src", "arr_dst", "kind", "k"]]


def _p2p_intervals(ops: pd.DataFrame, rank_host: pd.Series, eager: bool) -> pd.DataFrame:
    """Each inter-host send's data on the wire: from its post (eager) or from the later of the two posts
    (rendezvous, batched: the data waits for the receiver) until the earlier side completed."""
    send = ops[ops["op"] == "send"]
    send = send[rank_host.reindex(send["rank"]).to_numpy() != rank_host.reindex(send["peer"]).to_numpy()]
    if send.empty:
        return pd.DataFrame()
    start, end = send["start_ns"].to_numpy(), send["end_ns"].to_numpy()
    if not eager:
        recv = ops[ops["op"] == "recv"].set_index(["group", "seq", "peer", "rank"])
        idx = pd.MultiIndex.from_arrays([send["group"], send["seq"], send["rank"], send["peer"]])
        r_start = recv["start_ns"].reindex(idx).to_numpy(dtype=np.float64)
        r_end = recv["end_ns"].reindex(idx).to_numpy(dtype=np.float64)
        start = np.where(np.isnan(r_start), start, np.maximum(start, r_start)).astype(np.int64)
        end = np.where(np.isnan(r_end), end, np.maximum(np.minimum(end, r_end), start + 1)).astype(np.int64)
    return pd.DataFrame({
        "group": send["group"].to_numpy(), "seq": send["seq"].to_numpy(), "step": send["step"].to_numpy(),
        "src": send["rank"].to_numpy(), "dst": send["peer"].to_numpy(), "bytes": send["nbytes"].to_numpy(),
        "last": start, "t1": end, "early": False,
        "arr_src": start, "arr_dst": start, "kind": "p2p", "k": 2,
    })


def _shape(iv: pd.DataFrame, model: FaultModel | None, layout: Layout | None, meta: JobMeta) -> pd.DataFrame:
    """Split transfers into the sub-bursts a capture would see (early chunk, waits on a slow edge)."""
    src, dst = iv["src"].to_numpy(), iv["dst"].to_numpy()
    f_edge = np.ones(len(iv))
    if model is not None and layout is not None:
        for step in np.unique(iv["step"].to_numpy()):
            m = iv["step"].to_numpy() == step
            if step >= 0:
                f_edge[m] = model.edge_factor(("flows", int(step)), src[m], dst[m], int(step))
    iv = iv.assign(f=f_edge)
    bottleneck = iv.groupby(["group", "seq", "kind"])["f"].transform("max").to_numpy()
    iv = iv.assign(busy=np.where(iv["kind"] == "coll", iv["f"].to_numpy() / bottleneck, 1.0))
    parts = []
    # first chunk: a sender present before the last member pushes its first chunk into the
    # receiver's pre-posted buffers (NCCL FIFO slots, TCP socket buffers) -> an early burst, then a stall
    rounds = np.maximum(2 * (iv["k"].to_numpy() - 1), 1)
    first = np.where(iv["early"].to_numpy(), iv["bytes"].to_numpy() // rounds, 0)
    iv = iv.assign(bytes=iv["bytes"].to_numpy() - first)  # the rest moves once everyone is there
    early = iv[first > 0]
    if len(early):
        t = early["arr_src"].to_numpy()
        dur = (early["t1"] - early["last"]).to_numpy() / rounds[first > 0]
        parts.append(pd.DataFrame({"src": early["src"], "dst": early["dst"], "group": early["group"],
                                   "start": t, "end": t + dur * early["busy"].to_numpy(),
                                   "bytes": first[first > 0]}))
    whole = iv["busy"].to_numpy() >= 0.999
    w = iv[whole]
    parts.append(pd.DataFrame({"src": w["src"], "dst": w["dst"], "group": w["group"],
                               "start": w["last"].to_numpy(), "end": w["t1"].to_numpy(), "bytes": w["bytes"].to_numpy()}))
    wait = iv[~whole]
    if len(wait):  # chunk rounds: busy for a fraction of each round, then wait for the slow edge
        r = np.arange(CHUNK_STEPS)
        span = (wait["t1"] - wait["last"]).to_numpy()[:, None] / CHUNK_STEPS
        s = wait["last"].to_numpy()[:, None] + r * span
        e = s + span * wait["busy"].to_numpy()[:, None]
        parts.append(pd.DataFrame({"src": np.repeat(wait["src"].to_numpy(), CHUNK_STEPS),
                                   "dst": np.repeat(wait["dst"].to_numpy(), CHUNK_STEPS),
                                   "group": np.repeat(wait["group"].to_numpy(), CHUNK_STEPS),
                                   "start": s.ravel(), "end": e.ravel(),
                                   "bytes": np.repeat((wait["bytes"] // CHUNK_STEPS).to_numpy(), CHUNK_STEPS)}))
    return pd.concat(parts, ignore_index=True)


def _qp(group: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """One RoCE queue pair per (group, src rank, dst rank) connection: a stable 24-bit number."""
    key = pd.DataFrame({"g": group, "s": src, "d": dst})
    uniq = key.drop_duplicates()
    qps = [(zlib.crc32(f"{g}:{s}:{d}".encode()) & 0xFFFFFF) | 1 for g, s, d in uniq.itertuples(index=False)]
    lut = pd.Series(qps, index=pd.MultiIndex.from_frame(uniq))
    return lut.reindex(pd.MultiIndex.from_frame(key)).to_numpy(dtype=np.int64)


def _whole_job_config(truth: dict) -> SimConfig | None:
    """The job's config with every rank and step written, where its logger wrote only part of them.

    A capture on the fabric sees all of the job's traffic whatever its logger kept (one rank per
    TP group, sampled steps, lost rows or ranks), so the flows come from the whole job: the same
    seed simulates the same job, and the logger's choices are applied only when rows are written.
    """
    cfg = _config(truth)
    if cfg is None:
        return None
    partial = (cfg.logged_ranks != "all" or cfg.sample_steps not in (0.0, 1.0) or cfg.missing_ranks
               or cfg.row_loss > 0)
    return replace(cfg, logged_ranks="all", sample_steps=0.0, missing_ranks=0, row_loss=0.0) if partial else None


def sim_bursts(trace_dir: Path, gap_ns: int = DEFAULT_GAP_NS) -> Bursts:
    """Every network burst of a simulated job, as a capture on the fabric would see them."""
    truth = Trace.open(trace_dir).truth() or {}
    whole = _whole_job_config(truth)
    if whole is None:
        return _bursts_of(trace_dir, gap_ns)
    with tempfile.TemporaryDirectory(prefix="laggard-whole-job-") as tmp:
        simulate_trace(whole, Path(tmp), counterfactual=False)
        return _bursts_of(Path(tmp), gap_ns)


def _bursts_of(trace_dir: Path, gap_ns: int) -> Bursts:
    trace = Trace.open(trace_dir)
    truth = trace.truth() or {}
    iv = flow_intervals(trace, truth)
    if iv.empty:
        return Bursts.empty()
    model, layout = _fault_model(truth)
    sub = _shape(iv, model, layout, trace.meta)
    ranks = sorted(trace.meta.ranks)
    words = pd.Series(_ip_words(np.array([trace.meta.ranks[r].ip for r in ranks])), index=ranks)
    qp = _qp(sub["group"].to_numpy(), sub["src"].to_numpy(), sub["dst"].to_numpy())
    start = np.rint(sub["start"].to_numpy()).astype(np.int64)
    end = np.maximum(np.rint(sub["end"].to_numpy()).astype(np.int64), start)
    nbytes = np.maximum(sub["bytes"].to_numpy(dtype=np.int64), 1)
    n = start.size
    b = Bursts({
        "src_hi": np.zeros(n, dtype=np.uint64), "src_lo": words.reindex(sub["src"]).to_numpy(dtype=np.uint64),
        "dst_hi": np.zeros(n, dtype=np.uint64), "dst_lo": words.reindex(sub["dst"]).to_numpy(dtype=np.uint64),
        "sport": (49152 + qp % 16384).astype(np.int32), "dport": np.full(n, ROCE_UDP_PORT, dtype=np.int32),
        "proto": np.full(n, FLOW_PROTOS.index("roce"), dtype=np.int8), "qp": qp,
        "start_ns": start, "end_ns": end, "bytes": nbytes, "packets": -(-nbytes // ROCE_MTU),
    })
    order = np.argsort(start, kind="stable")
    return coalesce(Bursts({k: v[order] for k, v in b.cols.items()}), gap_ns)


def emit_flows(trace_dir: Path, pcap: bool) -> None:
    """Write flows.parquet for a simulated trace, and with pcap=True a RoCEv2 capture.pcap of all of it."""
    trace_dir = Path(trace_dir)
    bursts = sim_bursts(trace_dir)
    write_table(bursts_table(bursts), trace_dir / "flows.parquet", FLOWS_SCHEMA)
    packets = write_roce_pcap(bursts, trace_dir / "capture.pcap") if pcap else 0
    truth_path = trace_dir / "truth.json"
    if truth_path.exists():
        truth = json.loads(truth_path.read_text())
        truth["flows"] = {"bursts": len(bursts), "burst_gap_ns": DEFAULT_GAP_NS, "pcap": bool(pcap),
                          **({"pcap_packets": packets} if pcap else {})}
        truth_path.write_text(json.dumps(truth, indent=1))


def write_roce_pcap(bursts: Bursts, path: Path, max_packets: int = PCAP_MAX_PACKETS) -> int:
    """A capture of every burst of the job as scapy-built RoCEv2 packets (snaplen 128).

    Each burst is drawn as packets spaced at most half a burst gap apart, first at its start and
    last at its end, so reading the capture back gives the same bursts (fewer packets, same bytes)
    over the whole job. One template frame per (endpoints, QP); the packets are a vectorized
    gather of those templates. A job that would need more than `max_packets` is refused.
    """
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    c = bursts.cols
    order = np.argsort(c["start_ns"], kind="stable")
    start, end = c["start_ns"][order], c["end_ns"][order]
    per = np.clip((end - start) // (DEFAULT_GAP_NS // 2) + 2, 2, None)
    per = np.minimum(per, np.maximum(c["packets"][order], 1)).astype(np.int64)
    total = int(per.sum())
    if total > max_packets:
        raise UserError(f"--pcap: this job's {len(bursts):,} bursts need {total:,} packets "
                        f"(~{total * (PCAP_SNAPLEN + 16) / 1e6:,.0f} MB), over the {max_packets:,} a capture file may hold",
                        "use --flows (flows.parquet holds the same bursts) or simulate fewer GPUs or steps")
    if total == 0:
        write_pcap(path, np.zeros(0, dtype=np.int64), [], snaplen=PCAP_SNAPLEN)
        return 0
    key = pd.DataFrame({"src": c["src_lo"][order], "dst": c["dst_lo"][order], "qp": c["qp"][order],
                        "sport": c["sport"][order]})
    uniq = key.drop_duplicates().reset_index(drop=True)
    rows = []
    for src_w, dst_w, qp, sport in uniq.itertuples(index=False):
        src = ".".join(str((int(src_w) >> s) & 255) for s in (24, 16, 8, 0))
        dst = ".".join(str((int(dst_w) >> s) & 255) for s in (24, 16, 8, 0))
        pkt = (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src=src, dst=dst)
               / UDP(sport=int(sport), dport=ROCE_UDP_PORT) / BTH(opcode=4, dqpn=int(qp)) / Raw(b"\0" * 64))
        rows.append(np.frombuffer(bytes(pkt)[:PCAP_SNAPLEN], dtype=np.uint8))
    templates = np.stack(rows)
    tmpl = key.merge(uniq.assign(t=np.arange(len(uniq))), on=list(key.columns), how="left")["t"].to_numpy(np.int64)
    burst = np.repeat(np.arange(per.size), per)
    k = np.arange(total) - np.repeat(np.cumsum(per) - per, per)  # packet index inside its burst
    span = np.where(per > 1, per - 1, 1)[burst]
    ts = start[burst] + ((end - start)[burst] * k) // span
    nbytes = c["bytes"][order]
    size = (nbytes // per)[burst] + np.where(k == 0, (nbytes % per)[burst], 0)
    frames = templates[tmpl[burst]]
    o = np.argsort(ts, kind="stable")
    write_pcap(path, ts[o], frames[o], wirelen=np.maximum(size[o], templates.shape[1]), snaplen=PCAP_SNAPLEN)
    return total


def merge_fabric(trace_dirs: list[Path], out: Path) -> dict[str, list[str]]:
    """Place several simulated jobs (with flows) on disjoint hosts of one fabric, as one capture.

    Hosts are renumbered so the jobs do not overlap, addresses follow the new hosts, and the
    fabric's meta.json lists every rank; returns, per job, the endpoints that are truly its own
    (the answer job recognition must find).
    """
    from simulator.cluster import rank_ip

    out.mkdir(parents=True, exist_ok=True)
    tables: list[pd.DataFrame] = []
    ranks: dict[str, dict] = {}
    topology: dict[str, dict] = {}
    truth: dict[str, list[str]] = {}
    offset = 0
    for d in trace_dirs:
        t = Trace.open(d)
        hosts = t.meta.hosts()
        new_host = {h: f"node-{offset + i}" for i, h in enumerate(hosts)}
        ip_map = {}
        for _, info in sorted(t.meta.ranks.items()):
            ip_map[info.ip] = rank_ip(offset + hosts.index(info.host), info.gpu)
            ranks[str(len(ranks))] = {"host": new_host[info.host], "gpu": info.gpu, "ip": ip_map[info.ip]}
        switches = sorted({str(t.meta.switch_of(h)) for h in hosts})
        sw_base = len({v["switch"] for v in topology.values()})
        for name in hosts:
            topology[new_host[name]] = {"switch": f"tor-{sw_base + switches.index(str(t.meta.switch_of(name)))}"}
        f = t.flows()
        f["src_ip"], f["dst_ip"] = f["src_ip"].map(ip_map), f["dst_ip"].map(ip_map)
        tables.append(f)
        truth[t.meta.job] = sorted(ip_map.values())
        offset += len(hosts)
    flows = pd.concat(tables, ignore_index=True).sort_values("start_ns", kind="stable")
    write_table(flows, out / "flows.parquet", FLOWS_SCHEMA)
    JobMeta.from_dict({"job": "fabric", "world_size": len(ranks), "ranks": ranks, "topology": topology}).save(out / "meta.json")
    return truth
