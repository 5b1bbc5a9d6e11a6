"""Fail-closed fault taxonomy: what went wrong, and whose fault it is.

INFRA (retried, never REJECT, never a pass) is only for what is not the PR: the baseline, the
trusted reference, the host, the sandbox, the checkout, the service. A head revision that fails
where base ran the same phase fine on the same box — load error, crash, hang (no answer within the
request limit base met), OOM (judged by base's *measured* memory, not by the message), a raised
CUDA/Python error, non-finite or constant logits — is the PR's own fault: a provisional failure,
confirmed by one retry (worker/verdicts/attribution.py) and then a REJECT saying what failed where. A head
that does not import or breaks the protocol is BUILD_FAILED (deterministic, no retry needed).
"""
from __future__ import annotations

from worker.harness.client import RevisionFault
from worker.records import InfraKind, Verdict


class EvalFault(Exception):
    def __init__(self, verdict: Verdict, detail: str, infra_kind: InfraKind | None = None, log_tail: str = "",
                 failure: dict | None = None):
        super().__init__(detail)
        self.verdict, self.detail, self.infra_kind, self.log_tail = verdict, detail, infra_kind, log_tail
        self.failure = failure  # set for a head fault that is the PR's own (see module doc)


def infra(kind: InfraKind, detail: str, log_tail: str = "") -> EvalFault:
    return EvalFault(Verdict.INFRA, detail, kind, log_tail)


_INFRA_KIND = {"oom": InfraKind.OOM, "timeout": InfraKind.TIMEOUT, "sandbox": InfraKind.SANDBOX_FAILURE,
               "nonfinite": InfraKind.NAN_METRIC, "constant": InfraKind.ZERO_METRIC,
               "sandbox_unavailable": InfraKind.SANDBOX_UNAVAILABLE}
_WHAT = {"load": "the model did not load", "oom": "ran out of memory", "timeout": "hung",
         "crashed": "crashed", "error": "raised", "nonfinite": "returned non-finite logits",
         "constant": "returned constant logits", "disk": "wrote past its disk cap",
         "idle_gpu": "kept the GPU busy while it was frozen and the other revision was timed"}
OOM_HEADROOM = 0.9  # base fitting in 90 % of the limit means the box had room for what main needs


def oom_is_heads(memory: dict | None) -> tuple[bool, str]:
    """Whether a head OOM is the PR's: base's measured peak memory fits the limit with room to spare."""
    m = memory or {}
    base, limit = m.get("base_peak_bytes"), m.get("limit_bytes")
    if base is None or limit is None:
        return False, f"base's memory was not measured ({m.get('reason') or 'no reading'}): cannot attribute the OOM"
    if base > OOM_HEADROOM * limit:
        return False, f"base itself used {base >> 20} MiB of {limit >> 20} MiB: the box is too small"
    return True, f"base ran the same work in {base >> 20} MiB of {limit >> 20} MiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def shared_oom_is_heads(memory: dict | None) -> tuple[bool, str]:
    """Whether the reference's or base's OOM on a GPU the three processes share is the PR's: the head's
    process held more GPU memory when it happened than base ever needed (by the memory gates' bound).
    A head that grabs memory while the others work would otherwise pass its failure off as INFRA."""
    m = memory or {}
    held, base = m.get("gpu_held") or {}, m.get("base_peak_bytes")
    seen = ", ".join(f"{r} {_gib(b)}" for r, b in held.items() if b is not None)
    seen = f"GPU memory when it failed: {seen or 'not measured'}" + (
        f" of {_gib(m['limit_bytes'])}" if seen and m.get("limit_bytes") else "")
    heads = [b for label, b in held.items() if (label == "head" or label.endswith("-head")) and b is not None]
    head = sum(heads) if heads else None  # every process running the PR's code (a fresh pair's head too)
    if head is None or base is None or "head_bound" not in m:
        return False, seen
    if head > base * m["head_bound"] + m.get("slack_bytes", 0):
        return True, f"the PR's process held {_gib(head)} of GPU memory where base needed at most {_gib(base)}; {seen}"
    return False, seen


def classify(f: RevisionFault, model: str, memory: dict | None = None) -> EvalFault:
    """Map a revision process fault to a verdict. `memory`: {"base_peak_bytes", "limit_bytes", "reason"}, and on
    a GPU "gpu_held" (each process's memory at the fault), "head_bound" and "slack_bytes" (shared_oom_is_heads)."""
    where = f"{f.role} on {model} during {f.phase}"
    if f.kind == "oom" and f.role in ("reference", "base"):
        heads, said = shared_oom_is_heads(memory)
        if heads:
            what = f"held GPU memory the {f.role} needed"
            failure = {"role": "head", "model": model, "phase": f.phase, "kind": "oom", "what": what,
                       "detail": f"{f.detail[:300]} ({said})"}
            return EvalFault(Verdict.REJECT, f"the PR's code {what}: {where} ran out of memory ({said})", None,
                             f.log_tail, failure=failure)
        whose = "the trusted reference" if f.role == "reference" else "the baseline"
        return infra(InfraKind.OOM, f"{whose} ran out of memory ({where}): {f.detail} ({said})", f.log_tail)
    if f.role == "reference":
        return infra(InfraKind.INTERNAL_ERROR, f"the trusted reference failed ({where}): {f.detail}", f.log_tail)
    if f.kind in ("sandbox", "sandbox_unavailable"):  # the host's sandbox, never the PR's fault
        return infra(_INFRA_KIND[f.kind], f"{where}: {f.detail}", f.log_tail)
    if f.role == "base":
        return infra(InfraKind.BASELINE_CRASHED, f"the baseline failed ({where}): {f.kind}: {f.detail}", f.log_tail)
    if f.role != "head":  # e.g. an A/A sentinel process: never the PR's
        return infra(_INFRA_KIND.get(f.kind, InfraKind.INTERNAL_ERROR), f"{where}: {f.detail}", f.log_tail)
    # head
    if f.kind in ("import", "protocol"):
        return EvalFault(Verdict.BUILD_FAILED, f"{where}: {f.detail}", None, f.log_tail)
    extra = ""
    if f.kind == "oom":
        heads, extra = oom_is_heads(memory)
        if not heads:
            return infra(InfraKind.OOM, f"{where}: {f.detail} ({extra})", f.log_tail)
        extra = f" ({extra})"
    what = _WHAT["load"] if f.phase == "load" and f.kind in ("error", "load") else _WHAT.get(f.kind, f.kind)
    detail = f"the PR's code {what}: {where}: {f.detail}{extra}"
    failure = {"role": "head", "model": model, "phase": f.phase, "kind": f.kind, "detail": f.detail[:500],
               "what": what}
    return EvalFault(Verdict.REJECT, detail, None, f.log_tail, failure=failure)
