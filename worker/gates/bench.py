"""Speed gates: interleaved (ABBA) timed requests to two live revision processes.

Per decode gate and rep: untimed-for-this-gate `prefill(prompt[:N])`, then a timed generate that brings
a secret lead token: `decode(lead)` + `generate_greedy(M)` → (M + 1) / seconds. Until the generate request the
continuation depends on a token the revision cannot know, so neither an untimed prefill nor the gap before
the generate can hold any of its decode work (precomputing for every lead is vocab x M steps).
Per prefill gate and rep: `prefill(prompt[:N])` timed → N / seconds.
Each rep uses a fresh prompt (same one for base and head), so caching answers cannot help; the
emitted ids and the last-position logits of every prefill are kept for the output checks against
the trusted reference (worker/gates/verify.py). The revision that is not being timed is frozen
(cgroup.freeze): it can neither do deferred work off the clock nor compete with the timed one.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field

import numpy as np

from worker.config import ModelSpec, ProfileSettings, gate_name
from worker.verdicts.faults import infra
from worker.harness import masking
from worker.harness.client import RevisionFault, RevisionProcess
from worker.records import InfraKind


# CPU an honest revision may use per request of the other one while it is not frozen (the moments around
# the freeze: returning from its handler, reading the next frame). CI saw 30 ms over 8 fake requests; the
# red-team hog defers 100 ms per answer.
IDLE_CPU_PER_REQUEST_S = 0.005


@dataclass(frozen=True)
class GateSpec:
    name: str
    metric: str  # decode_tok_s | prefill_tok_s
    context: int
    # Tokens per timed request, what tok/s divides by: a prefill gate's prompt length; a decode gate's
    # decode steps on the clock, the lead token's decode + the `generate_n` greedy steps (the lead is decode
    # work: with only the greedy steps counted, every decode tok/s would read low by a factor n / (n + 1)).
    tokens: int

    @property
    def generate_n(self) -> int:
        """Greedy steps a decode gate's timed generate asks for (its ids); the lead's decode comes first."""
        return self.tokens - 1


def gate_specs(model: ModelSpec, profile: ProfileSettings) -> list[GateSpec]:
    return [GateSpec(gate_name("decode_tok_s", c), "decode_tok_s", c, profile.decode_tokens + 1)
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
    lead: int | None = None  # decode: the secret lead token its generate decoded first (ids continue from it)
    argmax: int | None = None  # prefill: argmax of the last logits
    logits: np.ndarray | None = field(default=None, repr=False)  # last-position logits of the prefill (parent's copy)
    # decode: every step's logits (n x vocab) the revision wrote inside the timed request, copied out
    # for the reps drawn (secretly, before timing) for verification; None otherwise or not returned.
    step_logits: np.ndarray | None = field(default=None, repr=False)
    steps_returned: int | None = None  # decode steps whose logits came back (0: generate bypassed decode)


@dataclass
class Sweep:
    gates: list[GateSpec]
    prompts: dict[str, list[int]] = field(default_factory=dict)
    leads: dict[str, int] = field(default_factory=dict)  # prompt key -> its generate's lead token (secret)
    samples: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # one per rep
    checked: dict[tuple[str, str], list[Sample]] = field(default_factory=dict)  # every timed run
    idle_cpu_s: dict[str, float] = field(default_factory=dict)
    idle_voids: list[dict] = field(default_factory=list)  # timed requests voided: the idle one used the GPU
    idle_gpu: dict = field(default_factory=dict)  # the idle-GPU check's receipt (worker/gates/idle_gpu.py)
    verify_reps: set[int] | None = None  # reps drawn for the output checks (None: all)
    # (role, context) → GPU bytes the parent read (NVML, per process tree) after the first run at that
    # context; contexts run in ascending order then, and the allocator keeps what it reserved, so
    # this is the peak up to that context (a peak shorter than one request can be missed).
    gpu_memory: dict[tuple[str, int], int | None] = field(default_factory=dict)

    def values(self, role: str, gate: str) -> list[float]:
        return [s.value for s in self.samples.get((role, gate), [])]

    def times(self, gate: str) -> bool:
        """Whether this sweep timed the gate (a confirming pair times only the gates still in play)."""
        return any(g.name == gate for g in self.gates)


def _check_logits(v: np.ndarray, role: str, what: str, phase: str = "measure") -> int:
    """Facts about a logits vector, computed here (the revision's process could lie about them). A defect is
    the revision's own output, so a fault of its role (worker/verdicts/faults.py: the head's is the PR's),
    never INFRA by itself: a head returning NaN only when not asked for all logits was INFRA nan_metric."""
    if not np.all(np.isfinite(v)):
        raise RevisionFault(role, phase, "nonfinite", f"{what} returned non-finite logits")
    if not np.any(v != 0) or not float(v.max() - v.min()) > 0:
        raise RevisionFault(role, phase, "constant", f"{what} returned all-zero/constant logits")
    return int(v.argmax())


def _timed(proc: RevisionProcess, wall: float, clock: str, what: str) -> float:
    secs = wall if clock == "wall" else proc.last_oncpu_s
    if secs is None or not secs > 0:
        raise infra(InfraKind.MISSING_METRIC, f"{proc.role} {what}: the {clock} clock gave {secs!r}")
    return secs


def _measure(proc: RevisionProcess, context: int, prefill_gate: GateSpec | None, decode_gate: GateSpec | None,
             key: str, timeout: float, phase: str, clock: str = "wall", step_logits: bool = False,
             keep_steps: bool = False, unmask: str | None = None, lead: int | None = None) -> list[Sample]:
    """_measure_at, with a fault that names the context that did not fit or finish."""
    try:
        return _measure_at(proc, context, prefill_gate, decode_gate, key, timeout, phase, clock, step_logits,
                           keep_steps, unmask, lead)
    except RevisionFault as f:
        gates = ", ".join(g.name for g in (prefill_gate, decode_gate) if g is not None)
        f.detail = f"at context {context} ({gates}): {f.detail}"
        f.args = (f"{f.role} {f.phase}: {f.kind}: {f.detail}",)
        raise


def _measure_at(proc: RevisionProcess, context: int, prefill_gate: GateSpec | None, decode_gate: GateSpec | None,
                key: str, timeout: float, phase: str, clock: str = "wall", step_logits: bool = False,
                keep_steps: bool = False, unmask: str | None = None, lead: int | None = None) -> list[Sample]:
    """`prefill(prompt[:context])`, then `decode(lead)` + `generate_greedy(M)` when a decode gate sits here.

    The prefill is timed for the prefill gate (if any); the generate for the decode gate. One
    prompt serves both, so a decode gate costs no extra prefill when both lists share a context.
    `step_logits`: every timed generate also writes each step's logits into shared memory (the same
    request every time, so the revision cannot tell which ones are verified); `keep_steps`: the
    parent copies them out of this one (a rep it drew for verification). `unmask`: the seed of the staged
    prompt's mask (worker/harness/masking.py), sent only now. `lead`: the generate's lead token, sent only
    with the generate (an untimed prefill, or the gap after any prefill, cannot decode ahead: module doc).
    """
    out = []
    extra = {"unmask": unmask} if unmask else {}
    resp, wall = proc.request("prefill", key=key, phase=phase, timeout=timeout, **extra)
    last = proc.read_logits(resp, 1, phase).reshape(-1)
    argmax = _check_logits(last, proc.role, f"prefill@{context}", phase)
    if prefill_gate is not None:
        secs = _timed(proc, wall, clock, prefill_gate.name)
        out.append(Sample(proc.role, prefill_gate.name, -1, key, prefill_gate.tokens / secs, secs,
                          wall_seconds=wall, argmax=argmax, logits=last))
    if decode_gate is not None:
        n = decode_gate.generate_n
        extra = {"step_logits": True} if step_logits else {}
        if lead is not None:
            extra["lead"] = lead
        resp, wall = proc.request("generate", n=n, phase=phase, timeout=timeout, **extra)
        secs = _timed(proc, wall, clock, decode_gate.name)
        ids = resp.get("ids")
        if not (isinstance(ids, list) and len(ids) == n and all(type(t) is int for t in ids)):
            raise RevisionFault(proc.role, phase, "protocol", f"generate answered {str(ids)[:120]}")
        steps = resp.get("steps") if step_logits else None
        rows = None
        if steps is not None and type(steps) is not int:
            raise RevisionFault(proc.role, phase, "protocol", f"generate answered steps={str(steps)[:40]}")
        if keep_steps and steps == n:
            rows = proc.read_logits(resp, n, phase)  # shape checked against n x vocab
            if not np.all(np.isfinite(rows)):  # NaN rows = steps its generate never wrote
                raise RevisionFault(proc.role, phase, "nonfinite", f"{decode_gate.name}: per-step logits of the timed "
                                    "generate are not finite")
        out.append(Sample(proc.role, decode_gate.name, -1, key, decode_gate.tokens / secs, secs,
                          wall_seconds=wall, ids=ids, lead=lead, logits=last, step_logits=rows,
                          steps_returned=steps if steps is None else min(steps, n)))
    return out


def run_sweep(procs: dict[str, RevisionProcess], gates: list[GateSpec], *, vocab: int, model_sha: str,
              pairs: int, warmup: int, timeout: float, inner: int = 1, sweep_id: int | str = 0,
              clock: str = "wall", on_step=None, gpu_memory=None, idle_check=None, freeze: bool = True,
              idle_retimes: int = 2, idle_max_void: int = 3, step_logits: bool = False,
              keep_steps: set[int] | None = None) -> Sweep:
    """Warm up, then `pairs` ABBA rounds over every gate context; returns the parent-timed samples.

    One sample is the fastest of `inner` timed requests, each on its own prompt (the best of a few
    is robust to bursts of load from other processes; every one of them is output-checked).
    While one revision is timed the other is frozen (`freeze`); `idle_check(timed, idle, t0, t1)`
    runs after each timed request, before the thaw (GPU: worker/gates/idle_gpu.py). A request
    during which the frozen one kept the GPU busy is void and timed again (up to `idle_retimes`
    times); a revision seen doing it more than `idle_max_void` times in the sweep, or on every
    retime, is named: it kept working while it should have been idle.
    `step_logits`: every timed generate returns its per-step logits through shared memory; the
    parent keeps them for the reps in `keep_steps` (None: every rep), drawn before timing and never
    sent, so the revision cannot tell a verified request from another.
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

    seeds: dict[tuple[str, str], str] = {}  # (role, prompt key) -> its mask's seed, sent with the timed prefill
    for c in contexts:
        for rep in range(-warmup, pairs):
            for i in range(inner):
                k = key(c, rep, i)
                sweep.prompts[k] = prompt_ids(vocab, c, model_sha, c, sweep_id, rep, i)
                # the generate's lead: fresh, secret, sent with that request only; one for both roles (one reference)
                sweep.leads[k] = secrets.randbelow(vocab)
                for r in roles:  # masked: staged before any timing, nothing to precompute from (masking.py)
                    masked, seeds[(r, k)] = masking.mask(sweep.prompts[k], vocab)
                    procs[r].request("stage", key=k, ids=masked, phase="stage", timeout=timeout)

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
                               key(c, rep, i), timeout, phase, clock, step_logits,
                               phase == "measure" and (keep_steps is None or rep in keep_steps),
                               seeds[(r, key(c, rep, i))], sweep.leads[key(c, rep, i)])
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
    timed = {r: 0 for r in roles}  # timed requests per revision
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
                    timed[r] += 1
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
        # Allow a fifth of the other side's timed time (an idle process uses none), plus what an honest process
        # spends finishing each answer in the moments it is not frozen.
        if idle_cpu[r] > 0.2 * window[other] + IDLE_CPU_PER_REQUEST_S * timed[other] + 0.01:
            raise RevisionFault(r, "measure", "protocol",
                                f"kept computing after answering: {idle_cpu[r]:.2f} s of CPU while the other "
                                f"revision was timed for {window[other]:.2f} s (work deferred past the answer)")
    sweep.idle_cpu_s = idle_cpu
    return sweep
