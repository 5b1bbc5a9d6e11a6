"""Speed gates: interleaved (ABBA) timed requests to two live revision processes.

Per decode gate and rep: untimed-for-this-gate `prefill(prompt[:N])`, then `generate_greedy(M)`
timed → M / seconds. Per prefill gate and rep: `prefill(prompt[:N])` timed → N / seconds.
Each rep uses a fresh prompt (same one for base and head), so caching answers cannot help; the
emitted ids and the last-position logits of every prefill are kept for the output checks against
the trusted reference (worker/gates/verify.py). The revision that is not being timed is frozen
(cgroup.freeze): it can neither do deferred work off the clock nor compete with the timed one.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from worker.config import ModelSpec, ProfileSettings, gate_name
from worker.faults import infra
from worker.harness.client import RevisionFault, RevisionProcess
from worker.records import InfraKind


@dataclass(frozen=True)
class GateSpec:
    name: str
    metric: str  # decode_tok_s | prefill_tok_s
    context: int
    tokens: int  # tokens per timed request


def gate_specs(model: ModelSpec, profile: ProfileSettings) -> list[GateSpec]:
    return [GateSpec(gate_name("decode_tok_s", c), "decode_tok_s", c, profile.decode_tokens)
            for c in model.decode_contexts] + [
        GateSpec(gate_name("prefill_tok_s", c), "prefill_tok_s", c, c) for c in model.prefill_contexts]


def prompt_ids(vocab: int, n: int, *parts) -> list[int]:
    """Deterministic random prompt for (parts...), e.g. (model sha, gate, sweep, rep)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
    return rng.integers(0, vocab, size=n).tolist()


@dataclass
class Sample:
    role: str
    gate: str
    rep: int
    prompt_key: str
    value: float  # tok/s, from the parent's clock
    seconds: float  # by the gate's clock
    wall_seconds: float | None = None
    ids: list[int] | None = None  # decode: emitted ids
    argmax: int | None = None  # prefill: argmax of the last logits
    logits: np.ndarray | None = field(default=None, repr=False)  # last-position logits of the prefill (parent's copy)


@dataclass
class Sweep:
    gates: list[GateSpec]
    prompts: dict[str, list[int]] = field(default_factory=dict)
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # one per rep
    checked: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # every timed run
    idle_cpu_s: dict[str, float] = field(default_factory=dict)
    idle_voids: list[dict] = field(default_factory=list)  # timed requests voided: the idle one used the GPU
    idle_gpu: dict = field(default_factory=dict)  # the idle-GPU check's receipt (worker/gates/idle_gpu.py)
    # (role, context) → GPU bytes the parent read (NVML, per process tree) after the first run at that
    # context; contexts run in ascending order then, and the allocator keeps what it reserved, so
    # this is the peak up to that context (a peak shorter than one request can be missed).
    gpu_memory: dict[tuple[str, int], int | None] = field(default_factory=dict)

    def values(self, role: str, gate: str) -> list[float]:
        return [s.value for s in self.samples.get((role, gate), [])]


def _check_logits(v: np.ndarray, role: str, what: str) -> int:
    """Facts about a logits vector, computed here (the revision's process could lie about them)."""
    if not np.all(np.isfinite(v)):
        raise infra(InfraKind.NAN_METRIC, f"{role}: {what} returned non-finite logits; nothing to measure")
    if not np.any(v != 0) or not float(v.max() - v.min()) > 0:
        raise infra(InfraKind.ZERO_METRIC, f"{role}: {what} returned all-zero/constant logits; nothing to measure")
    return int(v.argmax())


def _timed(proc: RevisionProcess, wall: float, clock: str, what: str) -> float:
    secs = wall if clock == "wall" else proc.last_oncpu_s
    if secs is None or not secs > 0:
        raise infra(InfraKind.MISSING_METRIC, f"{proc.role} {what}: the {clock} clock gave {secs!r}")
    return secs


def _measure(proc: RevisionProcess, context: int, prefill_gate: GateSpec | None, decode_gate: GateSpec | None,
             key: str, timeout: float, phase: str, clock: str = "wall") -> list[Sample]:
    """_measure_at, with a fault that names the context that did not fit or finish."""
    try:
        return _measure_at(proc, context, prefill_gate, decode_gate, key, timeout, phase, clock)
    except RevisionFault as f:
        gates = ", ".join(g.name for g in (prefill_gate, decode_gate) if g is not None)
        f.detail = f"at context {context} ({gates}): {f.detail}"
        f.args = (f"{f.role} {f.phase}: {f.kind}: {f.detail}",)
        raise


def _measure_at(proc: RevisionProcess, context: int, prefill_gate: GateSpec | None, decode_gate: GateSpec | None,
                key: str, timeout: float, phase: str, clock: str = "wall") -> list[Sample]:
    """`prefill(prompt[:context])`, then `generate_greedy(M)` when a decode gate sits at this context.

    The prefill is timed for the prefill gate (if any); the generate for the decode gate. One
    prompt serves both, so a decode gate costs no extra prefill when both lists share a context.
    """
    out = []
    resp, wall = proc.request("prefill", key=key, phase=phase, timeout=timeout)
    last = proc.read_logits(resp, 1, phase).reshape(-1)
    argmax = _check_logits(last, proc.role, f"prefill@{context}")
    if prefill_gate is not None:
        secs = _timed(proc, wall, clock, prefill_gate.name)
        out.append(Sample(proc.role, prefill_gate.name, -1, key, prefill_gate.tokens / secs, secs,
                          wall_seconds=wall, argmax=argmax, logits=last))
    if decode_gate is not None:
        resp, wall = proc.request("generate", n=decode_gate.tokens, phase=phase, timeout=timeout)
        secs = _timed(proc, wall, clock, decode_gate.name)
        ids = resp.get("ids")
        if not (isinstance(ids, list) and len(ids) == decode_gate.tokens and all(type(t) is int for t in ids)):
            raise RevisionFault(proc.role, phase, "protocol", f"generate answered {str(ids)[:120]}")
        out.append(Sample(proc.role, decode_gate.name, -1, key, decode_gate.tokens / secs, secs,
                          wall_seconds=wall, ids=ids, logits=last))
    return out


def run_sweep(procs: dict[str, RevisionProcess], gates: list[GateSpec], *, vocab: int, model_sha: str,
              pairs: int, warmup: int, timeout: float, inner: int = 1, sweep_id: int | str = 0,
              clock: str = "wall", on_step=None, gpu_memory=None, idle_check=None, freeze: bool = True,
              idle_retimes: int = 2, idle_max_void: int = 3) -> Sweep:
    """Warm up, then `pairs` ABBA rounds over every gate context; returns the parent-timed samples.

    One sample is the fastest of `inner` timed requests, each on its own prompt (the best of a few
    is robust to bursts of load from other processes; every one of them is output-checked).
    While one revision is timed the other is frozen (`freeze`); `idle_check(timed, idle, t0, t1)`
    runs after each timed request, before the thaw (GPU: worker/gates/idle_gpu.py). A request
    during which the frozen one kept the GPU busy is void and timed again (up to `idle_retimes`
    times); a revision seen doing it more than `idle_max_void` times in the sweep, or on every
    retime, is named: it kept working while it should have been idle.
    """
    sweep = Sweep(gates)
    roles = ("base", "head")
    for r in roles:
        procs[r].pin()  # they may have loaded on other cores; nothing is timed before this
        procs[r].track_cpu = clock == "oncpu"
    contexts = sorted({g.context for g in gates})
    at = {(g.metric, g.context): g for g in gates}

    def key(c, rep, i):
        return f"ctx{c}:{sweep_id}:{rep}:{i}"

    for c in contexts:
        for rep in range(-warmup, pairs):
            for i in range(inner):
                k = key(c, rep, i)
                sweep.prompts[k] = prompt_ids(vocab, c, model_sha, c, sweep_id, rep, i)
                for r in roles:
                    procs[r].request("stage", key=k, ids=sweep.prompts[k], phase="stage", timeout=timeout)

    voids = {r: 0 for r in roles}

    def idle_fault(idle, why):
        return RevisionFault(idle.role, "measure", "idle_gpu",
                             f"kept the GPU busy while frozen ({why}): its kernels ran while the other revision "
                             "was being timed")

    def measure(r, c, rep, i, phase):
        other = procs[roles[1 - roles.index(r)]]
        for attempt in range(idle_retimes + 1):
            if freeze:
                other.freeze(True)
            try:
                t0 = time.time()
                out = _measure(procs[r], c, at.get(("prefill_tok_s", c)), at.get(("decode_tok_s", c)),
                               key(c, rep, i), timeout, phase, clock)
                reading = (idle_check(procs[r], other, t0, time.time())
                           if idle_check is not None and phase == "measure" else None)
            finally:
                if freeze:
                    other.freeze(False)
            if reading is None or not reading.busy:
                return out
            voids[other.role] += 1  # this timed request is void: time it again
            sweep.idle_voids.append({"idle": other.role, "timed": r, "context": c, "rep": rep, "attempt": attempt,
                                     "sm_util": reading.sm_util})
            if voids[other.role] > idle_max_void:
                raise idle_fault(other, f"SM activity in {voids[other.role]} timed windows of the other revision")
        raise idle_fault(other, f"SM activity in all {idle_retimes + 1} timings of one request")

    def read_memory(r, c):  # the first round only: see Sweep.gpu_memory
        if gpu_memory is not None and (r, c) not in sweep.gpu_memory:
            sweep.gpu_memory[(r, c)] = gpu_memory(procs[r])

    for rep in range(-warmup, 0):
        for c in contexts:
            for r in roles:
                for i in range(inner):
                    measure(r, c, rep, i, "warmup")
                read_memory(r, c)
    idle_cpu = {r: 0.0 for r in roles}  # CPU a revision used while the other one was being timed
    window = {r: 0.0 for r in roles}
    for rep in range(pairs):
        for c in contexts:
            runs: dict[tuple[str, str], list[Sample]] = {}
            for i in range(inner):  # A B B A A B ...: both sides' runs stay close in time
                order = roles if (rep * inner + i) % 2 == 0 else roles[::-1]
                for r in order:
                    other = procs[roles[1 - roles.index(r)]]
                    c0 = other.cpu_seconds()
                    samples = measure(r, c, rep, i, "measure")
                    c1 = other.cpu_seconds()
                    if i == inner - 1:
                        read_memory(r, c)
                    if c0 is not None and c1 is not None:
                        idle_cpu[other.role] += c1 - c0
                    for s in samples:
                        window[r] += s.seconds
                        s.rep = rep
                        runs.setdefault((r, s.gate), []).append(s)
            for (r, g), rs in runs.items():
                sweep.samples.setdefault((r, g), []).append(max(rs, key=lambda s: s.value))
                sweep.checked.setdefault((r, g), []).extend(rs)
            if on_step:
                on_step()
    for r in roles:
        other = roles[1 - roles.index(r)]
        # Allow a fifth of the other side's timed time (an idle process uses none).
        if idle_cpu[r] > 0.2 * window[other] + 0.01:
            raise RevisionFault(r, "measure", "protocol",
                                f"kept computing after answering: {idle_cpu[r]:.2f} s of CPU while the other "
                                f"revision was timed for {window[other]:.2f} s (work deferred past the answer)")
    sweep.idle_cpu_s = idle_cpu
    return sweep


@dataclass
class OutputCheck:
    agree: float | None
    checked_tokens: int
    reason: str | None = None


def verify_outputs(sweep: Sweep, role: str, gate: GateSpec, reference: RevisionProcess, *, timeout: float,
                   tie_tol: float, reps: list[int] | None = None, cache: dict | None = None) -> OutputCheck:
    """Teacher-forced agreement of the timed outputs with the trusted reference.

    An emitted id agrees when the reference's logit for it is within `tie_tol` of the reference's
    max (so a near-tie broken the other way by a different but valid summation order passes).
    """
    cache = {} if cache is None else cache
    hits = total = 0
    for s in sweep.checked.get((role, gate.name), []):
        if reps is not None and s.rep not in reps:
            continue
        emitted = s.ids if s.ids is not None else [s.argmax]
        ck = (s.prompt_key, tuple(emitted))
        if ck not in cache:
            if ("staged", s.prompt_key) not in cache:
                reference.request("stage", key=s.prompt_key, ids=sweep.prompts[s.prompt_key], phase="verify",
                                  timeout=timeout)
                cache[("staged", s.prompt_key)] = True
            resp, _ = reference.request("teacher", key=s.prompt_key, emitted=emitted, phase="verify", timeout=timeout)
            cache[ck] = sum(1 for chosen, mx, _ in resp["rows"] if chosen >= mx - tie_tol * max(1.0, abs(mx)))
        hits += cache[ck]
        total += len(emitted)
    if total == 0:
        return OutputCheck(None, 0, "no outputs to check")
    return OutputCheck(hits / total, total)
