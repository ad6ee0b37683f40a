"""Simulation scenarios: the job (parallel degrees, schedule, timing, noise), what is sampled,
and the faults to inject. Scenarios come from named presets (defined here, in Python) or from
small YAML / TOML files, which may start from a preset (``preset: demo``) and override keys.

File format (YAML; TOML has the same keys)::

    preset: healthy              # optional base; its keys are deep-merged under this file's
    job: my-job
    parallel: {tp: 2, pp: 4, dp: 8, cp: 1}
    microbatches: 8
    schedule: 1f1b               # or gpipe
    iterations: 40
    timing: {forward_ms: 8.0, backward_ratio: 2.0, ...}     # see Timing
    noise: {compute_jitter: 0.02, gc_prob: 0.001, ...}      # see Noise
    sampling: {progress_ms: 50, link_ms: 100, gpu_ms: 1000, hang_tail_s: null}
    faults:                      # replaces the preset's list when given
      - cause: compute           # compute | communication | mixed | not_entered
        ranks: [21]              #   | inconsistent | hardware
        start: 15                # iteration; or "12.5s" (seconds after the job start)
        duration: 10             # iterations; or "5s"; absent/null: until the end
        severity: 1.5            # compute: duration factor; link: transfer-time factor

The cause names follow diagnosis.md (CCL-D's taxonomy, §2.2: S1-S3 slow, H1-H3 hang).
"""

from __future__ import annotations

import copy
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

SCHEDULES = ("1f1b", "gpipe")
CAUSES = ("compute", "communication", "mixed", "not_entered", "inconsistent", "hardware")
CAUSE_ALIASES = {"link": "communication", "slow_link": "communication", "comm": "communication",
                 "not-entered": "not_entered", "h1": "not_entered", "h2": "inconsistent",
                 "h3": "hardware"}
SLOW_CAUSES = ("compute", "communication", "mixed")
HANG_CAUSES = ("not_entered", "inconsistent", "hardware")
HANG_COMMS = ("tp", "cp", "dp", "pp")


class ScenarioError(ValueError):
    """A scenario file or preset that cannot be simulated; says which key is wrong."""


@dataclass
class Parallel:
    """Parallel degrees; Megatron's rank order rank = tp + TP*(cp + CP*(dp + DP*pp))."""

    tp: int = 2
    pp: int = 4
    dp: int = 8
    cp: int = 1


@dataclass
class Timing:
    """Healthy durations and sizes of one micro-batch's work on one pipeline stage."""

    forward_ms: float = 8.0          # forward compute of one micro-batch on one stage
    backward_ratio: float = 2.0      # backward = forward x this
    optimizer_ms: float = 4.0        # optimizer step after grads-sync
    last_stage_factor: float = 1.15  # the last stage is heavier (loss, output layer)
    tp_colls_forward: int = 2        # TP all-reduces inside one forward (after attention, MLP)
    tp_colls_backward: int = 2
    cp_colls_forward: int = 1        # CP all-gather inside one forward (keys/values)
    cp_colls_backward: int = 1       # CP reduce-scatter inside one backward
    tp_bytes: int = 16 << 20         # all-reduce buffer
    cp_bytes: int = 8 << 20          # this rank's all-gather / reduce-scatter buffer
    pp_bytes: int = 16 << 20         # activation / gradient sent between stages
    dp_bytes: int = 1 << 30          # a stage's whole gradient buffer (per-rank: / dp)
    nvlink_gbps: float = 200.0       # GB/s inside a node
    ib_gbps: float = 25.0            # GB/s per rank across nodes
    latency_us: float = 8.0          # per ring step / per p2p message
    launch_us: float = 6.0           # host overhead between consecutive operations
    chunk_bytes: int = 512 << 10     # one send/recv step (CCL-D SendCount) and one RDMA WR


@dataclass
class Noise:
    """Realistic noise (what-if §5.2-5.4: stage imbalance, sequence lengths, GC)."""

    compute_jitter: float = 0.02     # sigma of the log-normal factor of every compute op
    comm_jitter: float = 0.03        # sigma of the log-normal factor of every transfer
    seqlen_sigma: float = 0.05       # per (iteration, micro-batch, dp replica) compute factor
    gc_prob: float = 0.001           # chance per rank and iteration of a Python GC pause
    gc_ms: tuple[float, float] = (20.0, 80.0)
    clock_skew_ms: float = 1.0       # per-node constant clock offset, uniform in +-this
    start_jitter_ms: float = 1.0     # ranks start within this much of each other


@dataclass
class Sampling:
    """What is sampled besides the ``coll`` and ``span`` records (0 disables a kind)."""

    progress_ms: float = 50.0        # progress rows every this much of in-flight time
    link_ms: float = 100.0           # link rows (per queue pair) period
    gpu_ms: float = 1000.0           # gpu rows period
    hang_tail_s: float | None = None  # after a hang; None: max(30 s, 10 iterations)
    spans: bool = True


@dataclass
class Fault:
    """One injected fault. Windows: iterations [start_iteration, +duration_iterations) and/or
    seconds since the job start [start_s, +duration_s); both given means both must hold."""

    cause: str
    ranks: list[int] = field(default_factory=list)
    nodes: list[int] | None = None        # the two nodes of a slow link (communication/mixed)
    start_iteration: int | None = None
    start_s: float | None = None
    duration_iterations: int | None = None
    duration_s: float | None = None
    severity: float = 1.5                 # compute factor (compute, mixed) or link factor
    link_severity: float | None = None    # mixed: the link factor (default 4)
    stage: str | None = None              # compute: only "forward" or "backward" compute
    comm: str | None = None               # hangs: tp | cp | dp | pp (default by cause)
    op: str | None = None                 # dp hangs: allgather | reducescatter; pp: send | recv
    phase: str = "forward"                # tp/cp/pp hangs: in the forward or backward pass
    microbatch: int = 0                   # tp/cp/pp hangs: which micro-batch
    index: int = 0                        # tp/cp hangs: which collective inside the pass
    mismatch: str = "bytes"               # inconsistent: "bytes" (half) or "op" (other op)
    gpu_throttle: bool = False            # compute: show it in gpu rows (clocks, reasons)
    id: str | None = None

    @property
    def is_hang(self) -> bool:
        return self.cause in HANG_CAUSES


@dataclass
class Scenario:
    """A whole simulated job."""

    name: str = "custom"
    job: str = "sim-job"
    parallel: Parallel = field(default_factory=Parallel)
    microbatches: int = 8
    schedule: str = "1f1b"
    iterations: int = 50
    gpus_per_node: int = 8
    nics_per_node: int = 8
    start_time_ns: int = 1_750_000_000_000_000_000
    timing: Timing = field(default_factory=Timing)
    noise: Noise = field(default_factory=Noise)
    sampling: Sampling = field(default_factory=Sampling)
    faults: list[Fault] = field(default_factory=list)
    description: str = ""
    seed: int | None = None          # used when no seed is given on the command line

    @property
    def world_size(self) -> int:
        p = self.parallel
        return p.tp * p.pp * p.dp * p.cp

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def rank_of(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        p = self.parallel
        return tp + p.tp * (cp + p.cp * (dp + p.dp * pp))

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(self)


# ---------------------------------------------------------------------------------------------
# parsing


def _to_plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, list | tuple):
        return [_to_plain(x) for x in obj]
    return obj


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|ms|it|iter|iterations?)?\s*$")


def _window_value(value: Any, where: str) -> tuple[int | None, float | None]:
    """``10`` -> iteration 10; ``"12.5s"`` / ``"300ms"`` -> seconds; ``{"iteration": 3}`` too."""
    if value is None:
        return None, None
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: expected an iteration number or a time like '12.5s'")
    if isinstance(value, int):
        return value, None
    if isinstance(value, float):
        if value.is_integer():
            return int(value), None
        raise ScenarioError(f"{where}: {value!r}: iterations are whole numbers; "
                            "write seconds as '12.5s'")
    if isinstance(value, Mapping):
        unknown = set(value) - {"iteration", "iterations", "s", "seconds"}
        if unknown:
            raise ScenarioError(f"{where}: unknown key(s) {sorted(unknown)}")
        it = value.get("iteration", value.get("iterations"))
        sec = value.get("s", value.get("seconds"))
        return (None if it is None else int(it)), (None if sec is None else float(sec))
    if isinstance(value, str):
        m = _DURATION.match(value)
        if not m:
            raise ScenarioError(f"{where}: cannot read {value!r} (e.g. 10, '10it', '12.5s')")
        number, unit = m.group(1), m.group(2)
        if unit == "s":
            return None, float(number)
        if unit == "ms":
            return None, float(number) / 1e3
        if "." in number:
            raise ScenarioError(f"{where}: {value!r}: iterations are whole numbers")
        return int(number), None
    raise ScenarioError(f"{where}: expected an iteration number or a time like '12.5s'")


def _build(cls: Any, data: Mapping[str, Any], where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, found {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(known)})")
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for key, value in data.items():
        default = getattr(defaults, key)
        kwargs[key] = _coerce(value, default, f"{where}.{key}", str(known[key].type))
    return cls(**kwargs)


def _coerce(value: Any, default: Any, where: str, hint: str = "") -> Any:
    if value is None:
        if default is None:
            return None
        raise ScenarioError(f"{where}: must not be null")
    if default is None:   # an optional field: check against its annotation
        base = hint.replace(" ", "").split("|")[0]
        sample = {"int": 0, "float": 0.0, "str": ""}.get(base)
        if sample is not None:
            return _coerce(value, sample, where)
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true or false, found {value!r}")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not value.is_integer()):
            raise ScenarioError(f"{where}: expected an integer, found {value!r}")
        return int(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ScenarioError(f"{where}: expected a number, found {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, list | tuple) or len(value) != len(default):
            raise ScenarioError(f"{where}: expected a list of {len(default)} numbers")
        return tuple(float(v) for v in value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string, found {value!r}")
        return value
    return value


def _fault(data: Mapping[str, Any], where: str) -> Fault:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    d = dict(data)
    if "cause" not in d:
        raise ScenarioError(f"{where}: missing key 'cause' (one of {', '.join(CAUSES)})")
    cause = str(d.pop("cause")).lower()
    cause = CAUSE_ALIASES.get(cause, cause)
    if cause not in CAUSES:
        raise ScenarioError(f"{where}.cause: {cause!r} is not one of {', '.join(CAUSES)}")
    if "rank" in d:
        d.setdefault("ranks", [d.pop("rank")])
    if "link" in d:
        d.setdefault("nodes", d.pop("link"))
    start_it, start_s = _window_value(d.pop("start", None), f"{where}.start")
    dur_it, dur_s = _window_value(d.pop("duration", None), f"{where}.duration")
    known = {f.name for f in fields(Fault)}
    unknown = [k for k in d if k not in known]
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                            f"(known: cause, rank(s), start, duration, "
                            f"{', '.join(sorted(known - {'cause', 'ranks'}))})")
    ranks = d.pop("ranks", [])
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool)
                                              and r >= 0 for r in ranks):
        raise ScenarioError(f"{where}.ranks: expected a list of global ranks")
    nodes = d.pop("nodes", None)
    if nodes is not None:
        if not isinstance(nodes, list) or len(nodes) != 2:
            raise ScenarioError(f"{where}.nodes: expected two nodes (index or 'node003')")
        nodes = [_node_index(n, f"{where}.nodes") for n in nodes]
    f = Fault(cause=cause, ranks=list(ranks), nodes=nodes)
    hints = {fl.name: str(fl.type) for fl in fields(Fault)}
    for key, value in d.items():
        setattr(f, key, _coerce(value, getattr(f, key), f"{where}.{key}", hints[key]))
    f.start_iteration = f.start_iteration if start_it is None else start_it
    f.start_s = f.start_s if start_s is None else start_s
    f.duration_iterations = f.duration_iterations if dur_it is None else dur_it
    f.duration_s = f.duration_s if dur_s is None else dur_s
    return f


def _node_index(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = re.match(r"^\D*?(\d+)$", value)
        if m:
            return int(m.group(1))
    raise ScenarioError(f"{where}: cannot read node {value!r} (an index or a name like node003)")


def scenario_from_dict(data: Mapping[str, Any], source: str = "scenario") -> Scenario:
    """Build and validate a :class:`Scenario` from plain data (as read from YAML or TOML)."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: expected a mapping at the top level")
    d = dict(data)
    base_name = d.pop("preset", None)
    if base_name is not None:
        if base_name not in PRESETS:
            raise ScenarioError(f"{source}.preset: unknown preset {base_name!r} "
                                f"(one of {', '.join(PRESETS)})")
        d = _merge(PRESETS[base_name](), d)
        d.setdefault("name", base_name)
    known = {f.name for f in fields(Scenario)}
    unknown = [k for k in d if k not in known]
    if unknown:
        raise ScenarioError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))} "
                            f"(known: preset, {', '.join(sorted(known))})")
    sc = Scenario()
    for key, value in d.items():
        where = f"{source}.{key}"
        if key == "parallel":
            sc.parallel = _build(Parallel, value, where)
        elif key == "timing":
            sc.timing = _build(Timing, value, where)
        elif key == "noise":
            sc.noise = _build(Noise, value, where)
        elif key == "sampling":
            sc.sampling = _build(Sampling, value, where)
        elif key == "faults":
            if not isinstance(value, list):
                raise ScenarioError(f"{where}: expected a list of faults")
            sc.faults = [_fault(f, f"{where}[{i}]") for i, f in enumerate(value)]
        else:
            hint = next(str(fl.type) for fl in fields(Scenario) if fl.name == key)
            setattr(sc, key, _coerce(value, getattr(sc, key), where, hint))
    validate(sc, source)
    return sc


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def validate(sc: Scenario, source: str = "scenario") -> None:
    """Raise :class:`ScenarioError` for a scenario that cannot be simulated."""
    p = sc.parallel
    for name in ("tp", "pp", "dp", "cp"):
        if getattr(p, name) < 1:
            raise ScenarioError(f"{source}.parallel.{name}: must be >= 1")
    if not re.match(r"^[A-Za-z0-9._-]{1,64}$", sc.job):
        raise ScenarioError(f"{source}.job: 1-64 characters of A-Z a-z 0-9 . _ -")
    if sc.schedule not in SCHEDULES:
        raise ScenarioError(f"{source}.schedule: {sc.schedule!r} is not one of "
                            f"{', '.join(SCHEDULES)}")
    if sc.microbatches < 1:
        raise ScenarioError(f"{source}.microbatches: must be >= 1")
    if sc.iterations < 1:
        raise ScenarioError(f"{source}.iterations: must be >= 1")
    if sc.gpus_per_node < 1 or sc.nics_per_node < 1:
        raise ScenarioError(f"{source}: gpus_per_node and nics_per_node must be >= 1")
    t = sc.timing
    if min(t.forward_ms, t.backward_ratio, t.nvlink_gbps, t.ib_gbps) <= 0:
        raise ScenarioError(f"{source}.timing: durations and bandwidths must be > 0")
    if min(t.tp_colls_forward, t.tp_colls_backward, t.cp_colls_forward,
           t.cp_colls_backward) < 0:
        raise ScenarioError(f"{source}.timing: collective counts must be >= 0")
    if t.chunk_bytes < 1:
        raise ScenarioError(f"{source}.timing.chunk_bytes: must be >= 1")
    world = sc.world_size
    n_nodes = (world + sc.gpus_per_node - 1) // sc.gpus_per_node
    hangs = 0
    for i, f in enumerate(sc.faults):
        where = f"{source}.faults[{i}]"
        for r in f.ranks:
            if r >= world:
                raise ScenarioError(f"{where}.ranks: rank {r} >= world size {world}")
        if f.severity <= 0 or (f.link_severity is not None and f.link_severity <= 0):
            raise ScenarioError(f"{where}.severity: must be > 0")
        if f.cause in ("compute", "mixed") and not f.ranks:
            raise ScenarioError(f"{where}: a {f.cause} fault needs ranks")
        if f.cause == "communication" and f.nodes is None and not f.ranks:
            raise ScenarioError(f"{where}: a communication fault needs nodes (or a rank)")
        if f.nodes is not None:
            a, b = f.nodes
            if a == b or max(a, b) >= n_nodes:
                raise ScenarioError(f"{where}.nodes: two different nodes below {n_nodes}")
        if f.stage not in (None, "forward", "backward"):
            raise ScenarioError(f"{where}.stage: forward, backward or null")
        if f.phase not in ("forward", "backward"):
            raise ScenarioError(f"{where}.phase: forward or backward")
        if f.mismatch not in ("bytes", "op"):
            raise ScenarioError(f"{where}.mismatch: bytes or op")
        if f.is_hang:
            hangs += 1
            if len(f.ranks) != 1:
                raise ScenarioError(f"{where}: a hang needs exactly one rank")
            if f.comm is not None and f.comm not in HANG_COMMS:
                raise ScenarioError(f"{where}.comm: one of {', '.join(HANG_COMMS)}")
            if not 0 <= f.microbatch < sc.microbatches:
                raise ScenarioError(f"{where}.microbatch: 0..{sc.microbatches - 1}")
        for key in ("start_iteration", "duration_iterations"):
            v = getattr(f, key)
            if v is not None and v < (1 if key.startswith("duration") else 0):
                raise ScenarioError(f"{where}.{key}: out of range")
        for key in ("start_s", "duration_s"):
            v = getattr(f, key)
            if v is not None and v < 0:
                raise ScenarioError(f"{where}.{key}: must be >= 0")
    if hangs > 1:
        raise ScenarioError(f"{source}.faults: at most one hang per scenario")


def load_scenario(name_or_path: str | Path) -> Scenario:
    """A preset by name, or a YAML (``.yaml``/``.yml``) or TOML (``.toml``) scenario file."""
    text = str(name_or_path)
    path = Path(text)
    if text in PRESETS and not path.is_file():
        return preset(text)
    if not path.is_file():
        raise ScenarioError(f"{text}: neither a scenario file nor a preset "
                            f"(presets: {', '.join(PRESETS)})")
    raw = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(raw)
        else:
            data = yaml.safe_load(raw)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as e:
        raise ScenarioError(f"{path}: cannot parse: {e}") from None
    if data is None:
        data = {}
    sc = scenario_from_dict(data, str(path))
    if sc.name == "custom":
        sc.name = path.stem
    return sc


def preset(name: str) -> Scenario:
    """The named preset (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ScenarioError(f"unknown preset {name!r} (one of {', '.join(PRESETS)})")
    data = PRESETS[name]()
    data.setdefault("name", name)
    return scenario_from_dict(data, f"preset {name}")


# ---------------------------------------------------------------------------------------------
# presets: 64 ranks = tp2 x pp4 x dp8 on 8 nodes unless said otherwise. Rank r sits on node
# r // 8; stage s holds ranks 16s..16s+15 (nodes 2s, 2s+1); a DP ring of stage s spans both of
# its nodes; PP traffic between stages s and s+1 crosses node pairs (2s, 2s+2), (2s+1, 2s+3).


def _base(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "job": "sim-64", "parallel": {"tp": 2, "pp": 4, "dp": 8, "cp": 1},
        "microbatches": 8, "schedule": "1f1b", "iterations": 50,
    }
    d.update(over)
    return d


def _p_default() -> dict[str, Any]:
    return _base(description="64 ranks (tp2 pp4 dp8); rank 21 computes 1.5x slower in "
                             "iterations 15-34",
                 faults=[{"cause": "compute", "ranks": [21], "start": 15, "duration": 20,
                          "severity": 1.5}])


def _p_demo() -> dict[str, Any]:
    return _base(job="sim-demo", iterations=60,
                 description="64 ranks; rank 21 computes 1.6x slower in iterations 10-24, "
                             "then the link node004-node006 (PP stage 2->3) is 8x slower in "
                             "iterations 35-49",
                 faults=[{"cause": "compute", "ranks": [21], "start": 10, "duration": 15,
                          "severity": 1.6},
                         {"cause": "communication", "nodes": [4, 6], "start": 35,
                          "duration": 15, "severity": 8.0}])


def _p_healthy() -> dict[str, Any]:
    return _base(job="sim-healthy", iterations=40, description="64 ranks, no fault")


def _p_compute_multi() -> dict[str, Any]:
    return _base(job="sim-multi",
                 description="ranks 9 (stage 0) and 42 (stage 2) compute 1.4x slower in "
                             "iterations 15-34",
                 faults=[{"cause": "compute", "ranks": [9, 42], "start": 15, "duration": 20,
                          "severity": 1.4}])


def _p_link() -> dict[str, Any]:
    return _base(job="sim-link",
                 description="the link node000-node001 (the DP rings of stage 0) is 3x "
                             "slower in iterations 15-34",
                 faults=[{"cause": "communication", "nodes": [0, 1], "start": 15,
                          "duration": 20, "severity": 3.0}])


def _p_mixed() -> dict[str, Any]:
    return _base(job="sim-mixed",
                 description="rank 37 computes 1.3x slower and its PP link node004-node006 "
                             "is 6x slower, both in iterations 15-34",
                 faults=[{"cause": "mixed", "ranks": [37], "nodes": [4, 6], "start": 15,
                          "duration": 20, "severity": 1.3, "link_severity": 6.0}])


def _p_hang_not_entered() -> dict[str, Any]:
    return _base(job="sim-hang-ne", iterations=30,
                 description="rank 21 never calls its TP all-reduce in the forward of "
                             "micro-batch 3, iteration 12 (CCL-D H1)",
                 faults=[{"cause": "not_entered", "ranks": [21], "start": 12, "comm": "tp",
                          "phase": "forward", "microbatch": 3}])


def _p_hang_inconsistent() -> dict[str, Any]:
    return _base(job="sim-hang-inc", iterations=30,
                 description="rank 42 calls grads-sync reduce-scatter with half the bytes in "
                             "iteration 12 (CCL-D H2)",
                 faults=[{"cause": "inconsistent", "ranks": [42], "start": 12, "comm": "dp",
                          "op": "reducescatter", "mismatch": "bytes"}])


def _p_hang_hardware() -> dict[str, Any]:
    return _base(job="sim-hang-hw", iterations=30,
                 description="rank 22's NIC stalls during grads-sync in iteration 12; its "
                             "ring link to rank 24 (node002->node003) breaks (CCL-D H3)",
                 faults=[{"cause": "hardware", "ranks": [22], "start": 12, "comm": "dp",
                          "op": "reducescatter"}])


def _p_large() -> dict[str, Any]:
    # Rank 3700 = (pp 7, dp 14, tp 4): the last stage, on the critical path of every
    # micro-batch. With M = P = 8, 1F1B is mostly fill and drain, and a middle stage's extra
    # compute would be absorbed by pipeline bubbles (MEGATRACE §IV-C, Figure 12).
    return {"job": "sim-4096", "parallel": {"tp": 8, "pp": 8, "dp": 64, "cp": 1},
            "microbatches": 8, "schedule": "1f1b", "iterations": 50,
            "sampling": {"link_ms": 1000.0, "gpu_ms": 2000.0},
            "description": "4096 ranks (tp8 pp8 dp64, 512 nodes); rank 3700 (last stage) "
                           "computes 1.5x slower in iterations 20-39",
            "faults": [{"cause": "compute", "ranks": [3700], "start": 20, "duration": 20,
                        "severity": 1.5}]}


def _p_gpipe() -> dict[str, Any]:
    return _base(job="sim-gpipe", schedule="gpipe",
                 description="GPipe schedule; rank 21 computes 1.5x slower in iterations 15-34",
                 faults=[{"cause": "compute", "ranks": [21], "start": 15, "duration": 20,
                          "severity": 1.5}])


def _p_cp() -> dict[str, Any]:
    return _base(job="sim-cp", parallel={"tp": 2, "pp": 2, "dp": 8, "cp": 2},
                 description="64 ranks tp2 cp2 pp2 dp8; rank 5 computes 1.5x slower in "
                             "iterations 15-34",
                 faults=[{"cause": "compute", "ranks": [5], "start": 15, "duration": 20,
                          "severity": 1.5}])


PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "default": _p_default,
    "demo": _p_demo,
    "healthy": _p_healthy,
    "compute-multi": _p_compute_multi,
    "link": _p_link,
    "mixed": _p_mixed,
    "hang-not-entered": _p_hang_not_entered,
    "hang-inconsistent": _p_hang_inconsistent,
    "hang-hardware": _p_hang_hardware,
    "large": _p_large,
    "gpipe": _p_gpipe,
    "cp": _p_cp,
}
