"""Simulation settings, fault specs (`--fault SPEC`) and named scenarios."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from collector.inputs.errors import UserError
from collector.inputs.limits import ENV, limits

if TYPE_CHECKING:
    import numpy as np

FAULT_KINDS = ("gpu", "pcie", "host", "nic", "link", "switch", "stage", "seqlen")
PATTERNS = ("persistent", "spike", "fluctuation")
#: point-to-point semantics: eager (a send ends after its transfer, whatever the receiver does),
#: rendezvous (a transfer starts once both sides posted: NCCL/gloo for large messages), batched
#: (Megatron's batch_isend_irecv: a stage's send and receive posted together, waited together)
P2P_MODES = ("rendezvous", "eager", "batched")
#: which ranks write rows: all of them, or one per tensor-parallel group (its tp rank 0), as many
#: real Megatron jobs log
LOGGED_RANKS = ("all", "one-per-tp")
MAX_CLOCK_SKEW_MS = 10_000.0
MAX_GRAD_BUCKETS = 64
MAX_SIM_ROWS = 200_000_000  # three times issue 17's 16,384 GPUs x 20 steps
MAX_FAULT_FACTOR = 1000.0  # a thousand times slower is already a hang; far more overflows the int64 times
#: settings added after traces were shipped: left out of truth.json while at their default, so
#: existing traces regenerate byte for byte
LATE_SETTINGS = {"grad_overlap": False, "grad_buckets": 3, "param_gather_overlap": False}


@dataclass(frozen=True)
class FaultSpec:
    """One injected irregularity: what, where, how strong, when, and in what pattern."""

    kind: str
    factor: float
    rank: int | None = None
    host: str | None = None
    hosts: tuple[str, str] | None = None
    switch: str | None = None
    stage: int | None = None
    steps: tuple[int, int] | None = None  # inclusive window; None = whole run
    pattern: str = "persistent"

    @classmethod
    def parse(cls, spec: str) -> FaultSpec:
        """`gpu:rank=R,factor=F[,steps=A:B][,pattern=P]` and the other kinds of docs/traces.md and `laggard simulate --help`."""
        kind, _, rest = spec.partition(":")
        if kind not in FAULT_KINDS:
            raise UserError(f"--fault '{spec}': unknown kind '{kind}'", f"use one of {', '.join(FAULT_KINDS)}")
        kv: dict[str, str] = {}
        for part in filter(None, rest.split(",")):
            key, eq, val = part.partition("=")
            if not eq:
                raise UserError(f"--fault '{spec}': '{part}' is not key=value", "e.g. gpu:rank=3,factor=2")
            kv[key.strip()] = val.strip()
        try:
            factor = float(kv.pop("factor", "2"))
            steps = None
            if "steps" in kv:
                a, _, b = kv.pop("steps").partition(":")
                steps = (int(a), int(b))
            pattern = kv.pop("pattern", "persistent")
            args: dict[str, Any] = {}
            if "rank" in kv:
                args["rank"] = int(kv.pop("rank"))
            if "host" in kv:
                args["host"] = kv.pop("host")
            if "hosts" in kv:
                pair = kv.pop("hosts").split("+")
                if len(pair) != 2:
                    raise ValueError("hosts=A+B names two hosts")
                args["hosts"] = (pair[0], pair[1])
            if "switch" in kv:
                args["switch"] = kv.pop("switch")
            if "stage" in kv:
                args["stage"] = int(kv.pop("stage"))
        except ValueError as exc:
            raise UserError(f"--fault '{spec}': {exc}", "numbers for rank/factor/stage, steps=A:B") from exc
        if kv:
            raise UserError(f"--fault '{spec}': unknown key(s) {sorted(kv)}", "see `laggard simulate --help`")
        if pattern not in PATTERNS:
            raise UserError(f"--fault '{spec}': unknown pattern '{pattern}'", f"use one of {', '.join(PATTERNS)}")
        if not 0 < factor <= MAX_FAULT_FACTOR:  # also false for nan
            raise UserError(f"--fault '{spec}': factor must be a finite number in (0, {MAX_FAULT_FACTOR:g}]",
                            "e.g. factor=2 for twice as slow")
        need = {"gpu": "rank", "pcie": "rank", "host": "host", "nic": "host", "link": "hosts", "switch": "switch", "stage": "stage"}
        if kind in need and need[kind] not in args:
            raise UserError(f"--fault '{spec}': {kind} needs {need[kind]}=...", "see `laggard simulate --help`")
        return cls(kind=kind, factor=factor, steps=steps, pattern=pattern, **args)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "factor": self.factor, "pattern": self.pattern}
        for key in ("rank", "host", "switch", "stage"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.hosts:
            d["hosts"] = list(self.hosts)
        if self.steps:
            d["start_step"], d["end_step"] = self.steps
        return d


@dataclass
class SimConfig:
    """Everything that determines a simulated trace; same config + seed = same bytes."""

    gpus: int
    dp: int = 0  # 0 = inferred from gpus / (tp*pp*cp)
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    steps: int = 20
    seed: int = 0
    microbatches: int = 0  # 0 = 2*pp (at least 4)
    virtual_stages: int = 1  # >1 = interleaved 1F1B
    layers_per_chunk: int = 2
    gpus_per_host: int = 8
    hosts_per_switch: int = 4
    faults: list[FaultSpec] = field(default_factory=list)
    job: str = "sim-job"
    p2p: str = "rendezvous"  # one of P2P_MODES
    mp_sync: bool = False  # an all_reduce over each model-parallel group (tp x cp x pp) at every iteration's end
    # Megatron's overlap_grad_reduce / DDP buckets: the DP reduce-scatter runs in `grad_buckets` async
    # pieces launched during the last microbatch's backward; off = one blocking reduce-scatter at the end
    grad_overlap: bool = False
    grad_buckets: int = 3
    # Megatron's overlap_param_gather: the DP all-gather is launched after the optimizer and waited for by
    # the next step's first forward, layer by layer (off = blocking after the optimizer)
    param_gather_overlap: bool = False
    # physics (milliseconds, GB/s)
    layer_fwd_ms: float = 1.5
    activation_mb: float = 32.0
    grad_mb: float = 256.0
    nvlink_gbps: float = 300.0
    net_gbps: float = 25.0
    compute_noise: float = 0.03
    net_noise: float = 0.05
    drift: float = 0.0  # relative change of compute time from first to last step (e.g. 0.2)
    clock_skew_ms: float = 50.0  # per-host clock offsets, uniform in +-this
    logged_ranks: str = "all"  # one of LOGGED_RANKS
    sample_steps: float = 0.0  # 0/1: every step; K >= 2: every K-th step; 0 < f <= 0.5: that fraction, never two in a row
    row_loss: float = 0.0  # fraction of rows the logger loses
    missing_ranks: int = 0  # ranks whose logs are lost entirely
    hide_steps: bool = False  # write step=-1, as a logger without step markers would
    opaque_groups: bool = False  # name groups like a runtime does ("pg-3f2a..."), and leave parallelism out of meta
    start_ns: int = 1_760_000_000_000_000_000

    def resolved(self) -> SimConfig:
        """Fill derived sizes and check that the layout fits the GPU count."""
        c = replace(self)
        for name in ("tp", "pp", "ep", "cp", "steps", "gpus_per_host", "hosts_per_switch", "layers_per_chunk", "grad_buckets"):
            if getattr(c, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be >= 1", f"got {getattr(c, name)}")
        if c.grad_buckets > MAX_GRAD_BUCKETS:
            raise UserError(f"--grad-buckets {c.grad_buckets} is too many", f"use 1..{MAX_GRAD_BUCKETS} (Megatron's 40M-parameter buckets give a few per stage)")
        if c.logged_ranks not in LOGGED_RANKS:
            raise UserError(f"--logged-ranks {c.logged_ranks!r} is not known", f"use one of {', '.join(LOGGED_RANKS)}")
        if not 0.0 <= c.clock_skew_ms <= MAX_CLOCK_SKEW_MS:
            raise UserError(f"--clock-skew-ms {c.clock_skew_ms} is out of range", f"use 0..{MAX_CLOCK_SKEW_MS:g} (offsets are +- this)")
        k = c.sample_steps
        if not (k in (0.0, 1.0) or 0.0 < k <= 0.5 or (k >= 2 and float(k).is_integer())):
            raise UserError(f"--sample-steps {k:g} is neither a step interval nor a fraction",
                            "use an integer K >= 2 (every K-th step) or a fraction in (0, 0.5] (random, never consecutive)")
        if c.p2p not in P2P_MODES:
            raise UserError(f"--p2p {c.p2p!r} is not a p2p semantics", f"use one of {', '.join(P2P_MODES)}")
        mp = c.tp * c.pp * c.cp
        if c.gpus < 1 or c.gpus % mp:
            raise UserError(f"--gpus {c.gpus} is not a multiple of tp*pp*cp = {mp}", "pick sizes whose product divides the GPU count")
        lim = limits()  # a trace the readers would refuse is not worth building (nor its memory)
        if c.gpus > lim.world_size:
            raise UserError(f"--gpus {c.gpus} is over the {lim.world_size}-rank limit",
                            f"raise {ENV['world_size']} for a larger job")
        if c.gpus * c.steps > lim.step_cells:
            raise UserError(f"--gpus {c.gpus} x --steps {c.steps} is over the {lim.step_cells} step-rank cells the "
                            "analysis reads", f"simulate fewer steps, or raise {ENV['step_cells']}")
        if c.dp == 0:
            c.dp = c.gpus // mp
        if c.dp * mp != c.gpus:
            raise UserError(f"dp*tp*pp*cp = {c.dp * mp} but --gpus is {c.gpus}", "make the product equal the GPU count")
        if c.dp % c.ep:
            raise UserError(f"--ep {c.ep} does not divide dp = {c.dp}", "expert parallelism splits the data-parallel ranks")
        if c.microbatches == 0:
            c.microbatches = max(4, 2 * c.pp)
        if c.virtual_stages > 1 and (c.pp < 2 or c.microbatches % c.pp):
            raise UserError("interleaved schedule needs pp >= 2 and microbatches a multiple of pp", "adjust --microbatches")
        if c.rows_estimate() > MAX_SIM_ROWS:
            raise UserError(f"this job would be about {c.rows_estimate():,} operator rows, over {MAX_SIM_ROWS:,}",
                            "simulate fewer steps, microbatches or virtual stages")
        if c.gpus % c.gpus_per_host and c.gpus > c.gpus_per_host:
            raise UserError(f"--gpus {c.gpus} is not a multiple of {c.gpus_per_host} GPUs per host", "use whole hosts")
        return c

    def rows_estimate(self) -> int:
        """Operator rows the resolved job writes, about (each microbatch's chunks, forward and backward)."""
        return self.gpus * self.steps * self.microbatches * self.virtual_stages * 2 * self.layers_per_chunk * 3

    def logged_steps(self) -> list[int]:
        """The steps a sampling logger writes (all of them without sampling); drawn from the seed."""
        k, n = self.sample_steps, self.steps
        if k in (0.0, 1.0):
            return list(range(n))
        import numpy as np  # here, not at the top: `laggard simulate --help` reads this module

        rng = np.random.default_rng([self.seed, 6])
        if k >= 2:
            phase = int(rng.integers(int(k)))
            return list(range(phase, n, int(k)))
        count = max(1, min(round(k * n), (n + 1) // 2))
        slots = np.sort(rng.choice(n - count + 1, size=count, replace=False))
        return [int(x) for x in slots + np.arange(count)]  # spread apart: never two consecutive steps

    def logged_rank_mask(self) -> np.ndarray:
        """Which ranks write rows: all, or the first rank of each tensor-parallel group."""
        import numpy as np

        ranks = np.arange(self.gpus)
        return np.ones(self.gpus, dtype=bool) if self.logged_ranks == "all" else ranks % self.tp == 0

    def truth_settings(self) -> dict[str, Any]:
        """The settings truth.json records: all but the faults, less late settings left at their default
        (so traces made before a setting existed regenerate byte for byte)."""
        d = {k: v for k, v in asdict(self).items() if k != "faults"}
        if not self.grad_overlap and not self.param_gather_overlap:
            d.pop("grad_buckets")
        return {k: v for k, v in d.items() if k not in LATE_SETTINGS or v != LATE_SETTINGS[k] or k == "grad_buckets"}

    def parallelism(self) -> dict[str, int]:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": self.cp}


def _f(spec: str) -> FaultSpec:
    return FaultSpec.parse(spec)


#: name -> (description, config overrides). Scales and layouts vary on purpose.
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "healthy": ("no fault; noise, skew and mild drift only", {"gpus": 64, "tp": 8, "pp": 2, "drift": 0.05}),
    "gpu-straggler": ("one GPU computes 2x slower from step 8", {"gpus": 64, "tp": 8, "pp": 2, "faults": [_f("gpu:rank=13,factor=2,steps=8:19")]}),
    "gpu-spike": ("one GPU has spikes of 3x", {"gpus": 32, "tp": 4, "pp": 2, "faults": [_f("gpu:rank=5,factor=3,steps=6:14,pattern=spike")]}),
    "host-contention": ("CPU contention on one host", {"gpus": 64, "tp": 4, "pp": 2, "faults": [_f("host:host=node-5,factor=1.8,steps=5:19")]}),
    "nic-degraded": ("one host's NIC at a third of its rate", {"gpus": 64, "tp": 8, "pp": 2, "faults": [_f("nic:host=node-3,factor=3,steps=6:19")]}),
    "link-slow": ("one host pair's link is slow", {"gpus": 64, "tp": 8, "faults": [_f("link:hosts=node-2+node-3,factor=4,steps=5:19")]}),
    "switch-congestion": ("a ToR switch is congested", {"gpus": 128, "tp": 8, "pp": 2, "faults": [_f("switch:switch=tor-1,factor=3,steps=5:19")]}),
    "pcie-downgrade": ("one GPU's PCIe link is downgraded", {"gpus": 64, "tp": 8, "pp": 2, "faults": [_f("pcie:rank=21,factor=4,steps=5:19")]}),
    "two-faults": ("a slow GPU and a slow NIC at once", {"gpus": 128, "tp": 8, "pp": 4, "faults": [_f("gpu:rank=40,factor=2,steps=4:19"), _f("nic:host=node-9,factor=3,steps=4:19")]}),
    "fluctuation": ("a GPU that fluctuates", {"gpus": 64, "tp": 4, "pp": 4, "faults": [_f("gpu:rank=30,factor=2.5,steps=5:19,pattern=fluctuation")]}),
    "drift-straggler": ("a straggler under 20% drift", {"gpus": 64, "tp": 8, "pp": 2, "drift": 0.2, "faults": [_f("gpu:rank=50,factor=2,steps=10:19")]}),
    "moe-6d": ("6-D layout with EP and CP, slow GPU", {"gpus": 128, "tp": 2, "pp": 2, "cp": 2, "ep": 4, "virtual_stages": 2, "faults": [_f("gpu:rank=77,factor=2,steps=6:19")]}),
    "stage-imbalance": ("the last pipeline stage has more layers", {"gpus": 64, "tp": 8, "pp": 4, "faults": [_f("stage:stage=3,factor=1.6")]}),
    "seqlen-imbalance": ("some data-parallel ranks get long sequences", {"gpus": 64, "tp": 4, "pp": 2, "faults": [_f("seqlen:factor=2,steps=5:19,pattern=fluctuation")]}),
}


def scenario_config(name: str, **overrides: Any) -> SimConfig:
    if name not in SCENARIOS:
        raise UserError(f"unknown scenario '{name}'", f"choose one of {', '.join(SCENARIOS)}")
    base = dict(SCENARIOS[name][1])
    base.update({k: v for k, v in overrides.items() if v is not None})
    base.setdefault("job", name)
    return SimConfig(**base)
