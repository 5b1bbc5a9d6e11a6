"""Logit-level check of every timed prefill against the trusted reference (issue 13 item 6).

Each timed prefill writes its prompt's last-position logits into the parent's shared memory
inside the timed request (the decode gates' prefill too); the parent keeps its own copy. After
timing, the reference computes the same prompts and the parent measures KL(reference || revision)
per request. Nothing is sampled, so there is no position or rep a revision could guess: a head that
does less work when it is not asked for all logits (skipped layers, shortened attention) shows up
here even when its argmaxes mostly agree. The bar is relative to base on the same prompts (the
legitimate difference of an optimised kernel from the fp32 reference) with an absolute floor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from worker.faults import infra
from worker.harness.client import RevisionProcess
from worker.records import InfraKind


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    lr, lq = _log_softmax(ref_logits), _log_softmax(logits)
    return max(float((np.exp(lr) * (lr - lq)).sum()), 0.0)


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


def check_timed_logits(sweep, role: str, gate: str, reference: RevisionProcess, *, timeout: float,
                       cache: dict) -> LogitCheck:
    kls = []
    for s in sweep.checked.get((role, gate), []):
        if s.logits is None:
            continue
        ref = reference_last_logits(reference, s.prompt_key, sweep.prompts[s.prompt_key], timeout, cache)
        if ref.shape != s.logits.shape:
            return LogitCheck(None, None, len(kls), f"vocab {s.logits.shape} differs from the reference's {ref.shape}")
        kls.append(kl(ref, s.logits))
    if not kls:
        return LogitCheck(None, None, 0, "no timed logits to check")
    return LogitCheck(float(np.mean(kls)), float(np.max(kls)), len(kls))


def judge_logits(model: str, gate: str, head: LogitCheck, base: LogitCheck, *, floor: float, ratio: float,
                 base_max: float) -> str | None:
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
                f"max {head.kl_max:.3g} over {head.checked} timed requests; base {base.kl_mean:.3g}/"
                f"{base.kl_max:.3g}, bound {bound:.3g}/{worst_bound:.3g})")
    return None
