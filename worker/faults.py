"""Fail-closed fault taxonomy: what went wrong, and whose fault it is.

Anything that is not a measurement of the PR is INFRA (retried, never REJECT, never a pass).
Only a head revision that does not import, breaks the protocol, or raises while running is
BUILD_FAILED — the PR's own fault. Output that is not a measurement (empty, non-finite, all
zero) is INFRA; a measurement that shows wrong output is a guard failure (REJECT).
"""
from __future__ import annotations

from worker.harness.client import RevisionFault
from worker.records import InfraKind, Verdict


class EvalFault(Exception):
    def __init__(self, verdict: Verdict, detail: str, infra_kind: InfraKind | None = None, log_tail: str = ""):
        super().__init__(detail)
        self.verdict, self.detail, self.infra_kind, self.log_tail = verdict, detail, infra_kind, log_tail


def infra(kind: InfraKind, detail: str, log_tail: str = "") -> EvalFault:
    return EvalFault(Verdict.INFRA, detail, kind, log_tail)


_KIND = {"oom": InfraKind.OOM, "timeout": InfraKind.TIMEOUT, "sandbox": InfraKind.SANDBOX_FAILURE,
         "sandbox_unavailable": InfraKind.SANDBOX_UNAVAILABLE}


def classify(f: RevisionFault, model: str) -> EvalFault:
    """Map a revision process fault to a verdict."""
    where = f"{f.role} on {model} during {f.phase}"
    if f.role == "reference":
        return infra(InfraKind.INTERNAL_ERROR, f"the trusted reference failed ({where}): {f.detail}", f.log_tail)
    if f.kind in _KIND:
        return infra(_KIND[f.kind], f"{where}: {f.detail}", f.log_tail)
    if f.role == "base":
        return infra(InfraKind.BASELINE_CRASHED, f"the baseline failed ({where}): {f.kind}: {f.detail}", f.log_tail)
    # head
    if f.kind in ("import", "protocol"):
        return EvalFault(Verdict.BUILD_FAILED, f"{where}: {f.detail}", None, f.log_tail)
    if f.phase == "load":
        return infra(InfraKind.LOAD_FAILURE, f"{where}: the model did not load: {f.detail}", f.log_tail)
    if f.kind == "crashed":
        return infra(InfraKind.MISSING_METRIC, f"{where}: {f.detail}", f.log_tail)
    return EvalFault(Verdict.BUILD_FAILED, f"{where}: the engine raised {f.detail}", None, f.log_tail)
