"""Output checks of the timed requests against the trusted reference (issue 13 item 6).

Timed decode: for the reps drawn for verification, the secret lead token the generate brought and every
emitted token are teacher-forced through the reference (`teacher_logits`: its logits at each step, into shared
memory; every reduction here): the continuation must start from the lead, so a revision that decoded ahead
from the prefill's argmax (before it could know the lead) emits the wrong tokens. Each step's token must be
the reference's argmax within the tie tolerance (paired against base's misses on the same prompts), and
where the revision returned its own per-step logits inside the timed request, KL(reference || revision) is
taken at every step.

Timed prefill:

Each timed prefill writes its prompt's last-position logits into the parent's shared memory
inside the timed request (the decode gates' prefill too); the parent keeps its own copy. After
timing, the reference computes the same prompts and the parent measures KL(reference || revision)
per request. No timed prefill is sampled, so there is no rep a revision could guess: a head that
does less work when it is not asked for all logits (skipped layers, shortened attention) shows up
here even when its argmaxes mostly agree. The bar is relative to base on the same prompts (the
legitimate difference of an optimised kernel from the fp32 reference) with an absolute floor.

A decode gate's own prefill is not on any clock (its gate times the generate), so its logits are
checked on the verified reps only: whatever a revision skipped there could speed nothing but the
generate after it, and that is checked step by step on exactly those reps. Where a prefill gate
shares the context, that very request is timed and checked on every rep under the prefill gate.
On the 9B this spares the fp32 reference the unverified reps' decode-only prompts (128, 512, 16k).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from worker.verdicts.faults import infra
from worker.harness.client import RevisionProcess
from worker.records import InfraKind


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    lr, lq = _log_softmax(ref_logits), _log_softmax(logits)
    return max(float((np.exp(lr) * (lr - lq)).sum()), 0.0)


def kl_rows(ref: np.ndarray, q: np.ndarray, chunk: int = 8) -> list[float]:
    """KL per row, a few rows at a time (float64 temporaries of a real vocabulary stay small)."""
    return [kl(ref[i], q[i]) for i in range(len(ref))] if len(ref) <= chunk else [
        x for i in range(0, len(ref), chunk) for x in kl_rows(ref[i:i + chunk], q[i:i + chunk], chunk)]


@dataclass
class LogitCheck:
    kl_mean: float | None
    kl_max: float | None
    checked: int  # timed requests compared
    reason: str | None = None


def reference_last_logits(reference: RevisionProcess, key: str, ids: list[int], timeout: float,
                          cache: dict) -> np.ndarray:
    if key not in cache:
        reference.request("stage", key=key, ids=ids, phase="verify", timeout=timeout)
        resp, _ = reference.request("prefill", key=key, phase="verify", timeout=timeout)
        cache[key] = reference.read_logits(resp, 1, "verify").reshape(-1)
    return cache[key]


def keep_last_rows(teacher_cache: dict, last_cache: dict) -> None:
    """Row 0 of any teacher-forced rows of a prompt is its last-position logits: kept for the timed-logit
    check, so the reference does not prefill that prompt again (at 32k on the 9B, seconds a prompt)."""
    for key, per in teacher_cache.items():
        if isinstance(key, str) and per and key not in last_cache:
            last_cache[key] = np.array(next(iter(per.values()))[0])


def check_timed_logits(sweep, role: str, gate: str, reference: RevisionProcess, *, timeout: float,
                       cache: dict, reps: set[int] | None = None) -> LogitCheck:
    """KL of each checked request's last-position logits; `reps`: only those reps (None: every one)."""
    kls = []
    for s in sweep.checked.get((role, gate), []):
        if s.logits is None or (reps is not None and s.rep not in reps):
            continue
        ref = reference_last_logits(reference, s.prompt_key, sweep.prompts[s.prompt_key], timeout, cache)
        if ref.shape != s.logits.shape:
            return LogitCheck(None, None, len(kls), f"vocab {s.logits.shape} differs from the reference's {ref.shape}")
        kls.append(kl(ref, s.logits))
    if not kls:
        return LogitCheck(None, None, 0, "no timed logits to check")
    return LogitCheck(float(np.mean(kls)), float(np.max(kls)), len(kls))


def judge_logits(model: str, gate: str, head: LogitCheck, base: LogitCheck, *, floor: float, ratio: float,
                 base_max: float, unit: str = "timed requests") -> str | None:
    """A failure sentence for the head (None = passes); INFRA when base itself is far off the reference."""
    if head.kl_mean is None or base.kl_mean is None:
        raise infra(InfraKind.MISSING_METRIC, f"{model} {gate}: timed-output KL check had nothing to check "
                                              f"({head.reason or base.reason})")
    if base.kl_mean > base_max:
        raise infra(InfraKind.BASELINE_CRASHED, f"{model} {gate}: the baseline's timed outputs are far from the "
                    f"reference (KL {base.kl_mean:.3g} > {base_max:.3g}); cannot judge the PR")
    bound = max(floor, ratio * base.kl_mean)
    worst_bound = max(floor, ratio * base.kl_max)
    if head.kl_mean > bound or head.kl_max > worst_bound:
        return (f"{model} {gate}: head's timed outputs differ from the reference (KL mean {head.kl_mean:.3g}, "
                f"max {head.kl_max:.3g} over {head.checked} {unit}; base {base.kl_mean:.3g}/"
                f"{base.kl_max:.3g}, bound {bound:.3g}/{worst_bound:.3g})")
    return None


# -- timed decode: every step of the verified reps ---------------------------------------------------
@dataclass
class OutputCheck:
    agree: float | None
    checked_tokens: int
    reason: str | None = None
    misses: int = 0  # emitted tokens that are not the reference's argmax within the tie tolerance
    miss_at: list = field(default_factory=list)  # (prompt key, step) of the first few misses
    step_kl_mean: float | None = None  # KL per decode step, where the revision returned its logits
    step_kl_max: float | None = None
    step_kl_steps: int = 0
    steps_not_returned: int = 0  # verified decode requests whose per-step logits did not come back

    def step_check(self) -> LogitCheck:
        return LogitCheck(self.step_kl_mean, self.step_kl_max, self.step_kl_steps,
                          None if self.step_kl_steps else "no per-step logits returned")


def teacher_rows(reference: RevisionProcess, sweep, key: str, emitted: list[int], timeout: float,
                 cache: dict, lead: int | None = None) -> np.ndarray:
    """The reference's logits teacher-forced on `[lead] + emitted`: row 0 = the prompt's last position, then
    (with a lead) row 1 after decoding the lead, whose argmax is emitted[0]; row i+1+(lead given) after decoding
    emitted[i]. Cached per prompt, lead and ids; a prefill check reuses any cached row 0 (the same for any lead)."""
    per = cache.setdefault(key, {})
    forced = ([] if lead is None else [int(lead)]) + list(emitted)
    if (lead, tuple(emitted)) in per:
        return per[(lead, tuple(emitted))]
    if not forced and per:
        return next(iter(per.values()))[:1]
    if ("staged", key) not in cache:
        reference.request("stage", key=key, ids=sweep.prompts[key], phase="verify", timeout=timeout)
        cache[("staged", key)] = True
    resp, _ = reference.request("teacher_logits", key=key, emitted=forced, phase="verify", timeout=timeout)
    rows = reference.read_logits(resp, len(forced) + 1, "verify").reshape(len(forced) + 1, -1)
    per[(lead, tuple(emitted))] = rows
    return rows


def verify_outputs(sweep, role: str, gate, reference: RevisionProcess, *, timeout: float, tie_tol: float,
                   reps: list[int] | None = None, cache: dict | None = None) -> OutputCheck:
    """Teacher-forced check of every step of the timed outputs of the verified reps.

    An emitted id agrees when the reference's logit for it is within `tie_tol` of the reference's
    max (so a near-tie broken the other way by a different but valid summation order passes). A decode's
    ids are checked from the row after its lead (`Sample.lead`, teacher-forced first), its per-step logits
    against the rows after each emitted id.
    """
    cache = {} if cache is None else cache
    hits = total = 0
    miss_at, kls, not_returned = [], [], 0
    for s in sweep.checked.get((role, gate.name), []):
        if reps is not None and s.rep not in reps:
            continue
        decode = s.ids is not None
        emitted = s.ids if decode else [s.argmax]
        lead = s.lead if decode else None
        rows = teacher_rows(reference, sweep, s.prompt_key, emitted if decode else [], timeout, cache, lead)
        rows = rows if lead is None else rows[1:]  # from the row whose argmax is emitted[0]
        for step, t in enumerate(emitted):
            mx = float(rows[step].max())
            if float(rows[step][t]) >= mx - tie_tol * max(1.0, abs(mx)):
                hits += 1
            elif len(miss_at) < 8:
                miss_at.append((s.prompt_key, step))
        total += len(emitted)
        if decode and s.step_logits is not None:
            if s.step_logits.shape != rows[1:].shape:
                return OutputCheck(None, 0, f"per-step logits {s.step_logits.shape} differ from the reference's "
                                            f"{rows[1:].shape}")
            kls += kl_rows(rows[1:], s.step_logits)  # its logits after decoding emitted[i] vs the reference's
        elif decode:
            not_returned += 1
    if total == 0:
        return OutputCheck(None, 0, "no outputs to check")
    return OutputCheck(hits / total, total, misses=total - hits, miss_at=miss_at,
                       step_kl_mean=float(np.mean(kls)) if kls else None, step_kl_max=max(kls, default=None),
                       step_kl_steps=len(kls), steps_not_returned=not_returned)


def merge_output_checks(parts: list[OutputCheck]) -> OutputCheck:
    """One check over every process pair's verified reps."""
    total = sum(x.checked_tokens for x in parts)
    if not total:
        return parts[0]
    steps = sum(x.step_kl_steps for x in parts)
    return OutputCheck(
        sum(x.agree * x.checked_tokens for x in parts if x.agree is not None) / total, total,
        misses=sum(x.misses for x in parts), miss_at=[m for x in parts for m in x.miss_at][:8],
        step_kl_mean=sum(x.step_kl_mean * x.step_kl_steps for x in parts if x.step_kl_steps) / steps if steps else None,
        step_kl_max=max((x.step_kl_max for x in parts if x.step_kl_steps), default=None), step_kl_steps=steps,
        steps_not_returned=sum(x.steps_not_returned for x in parts))


def judge_steps(model: str, gate: str, head: OutputCheck, base: OutputCheck, *, extra_misses: int, floor: float,
                ratio: float, base_max: float) -> list[str]:
    """Failure sentences for the head's timed decode steps (empty = passes).

    Tokens: the head may miss the reference's argmax (beyond the tie tolerance) on at most
    `extra_misses` more steps than base on the same prompts. Logits: every returned step's KL,
    bounded like the prefill check (relative to base's, with a floor); where base returned none (its
    generate bypasses decode) the head is held to the floor alone.
    """
    fails = []
    if head.misses > base.misses + extra_misses:
        fails.append(f"{model} {gate}: head emitted {head.misses} of {head.checked_tokens} timed decode tokens that "
                     f"are not the reference's choice (base {base.misses}; allowed +{extra_misses}), first at "
                     f"{head.miss_at[:3]}")
    if base.step_kl_steps and not head.step_kl_steps and head.steps_not_returned:
        fails.append(f"{model} {gate}: head's generate_greedy returned no per-step logits where base's did "
                     f"({head.steps_not_returned} verified requests): its timed decode cannot be checked at logit "
                     "level (docs/protocol.md: generate_greedy goes through engine.decode or fills logits_out)")
    if head.step_kl_steps:
        ref = base.step_check() if base.step_kl_steps else LogitCheck(0.0, 0.0, 0)
        failure = judge_logits(model, f"{gate} decode steps", head.step_check(), ref, floor=floor, ratio=ratio,
                               base_max=base_max, unit="decode steps")
        if failure:
            fails.append(failure)
    return fails


# -- one process pair's sweep, checked -------------------------------------------------------------
def verify_sweep(sweep, gates, reference: RevisionProcess, last_rows: dict, *, timeout: float,
                 tie_tol: float) -> dict:
    """The verified reps' outputs of every gate the sweep timed, (role, gate) → OutputCheck; the prompts'
    last-position rows kept in `last_rows` for the timed-logit check. The sweep's per-step logits are freed."""
    reps = getattr(sweep, "verify_reps", None)
    reps = sorted(reps) if reps is not None else None
    out = {}
    for c in sorted({g.context for g in gates}):  # one context's reference rows at a time
        cache: dict = {}
        for g in (g for g in gates if g.context == c):
            for r in ("base", "head"):
                out[(r, g.name)] = verify_outputs(sweep, r, g, reference, timeout=timeout,
                                                  tie_tol=tie_tol, reps=reps, cache=cache)
        keep_last_rows(cache, last_rows)
    drop_step_logits(sweep)  # not kept past its check
    return out


def check_sweep_logits(sweep, gates, reference: RevisionProcess, cache: dict, *, timeout: float,
                       every_rep: bool = True) -> dict:
    """Every timed prefill (`every_rep`); a decode gate's untimed prefill on the verified reps only (this
    module's doc). (role, gate) → LogitCheck."""
    verified = getattr(sweep, "verify_reps", None)
    return {(r, g.name): check_timed_logits(sweep, r, g.name, reference, timeout=timeout, cache=cache,
                                            reps=verified if g.metric == "decode_tok_s" or not every_rep else None)
            for g in gates for r in ("base", "head")}


def drop_step_logits(sweep) -> None:
    """Free the n x vocab per-step logits a sweep kept for its verified decodes."""
    for samples in sweep.checked.values():
        for s in samples:
            s.step_logits = None
