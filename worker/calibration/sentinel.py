"""One fresh base-vs-base process pair per evaluation, recorded as A/A history.

It keeps the null true as the service runs: the drift test (worker/calibration/history.py)
compares these newest pairs with the history the floor came from. The pair is taken in every
evaluation whatever its gates showed, so it is an unbiased draw of the null. Its failure is
noted in the receipt and costs the evaluation nothing (it says nothing about the PR).
"""
from __future__ import annotations

from worker.verdicts.faults import EvalFault
from worker.gates.stats import pair_delta
from worker.harness.client import RevisionFault


def enabled(setting: str, device: str) -> bool:
    return setting == "always" or (setting == "gpu" and device.startswith("cuda"))


def maybe_record(ev, spec, gates, resolved, vocab: int, reference, out) -> None:
    if not enabled(ev.settings.sentinel_aa_pair, ev.profile.device) or "base" not in ev.revs:
        return
    base = ev.revs["base"]
    ev.progress("sentinel", model=spec.name)  # its own phase in the receipt: a fresh pair's load and sweep
    try:
        with ev.fresh_pair({"base": base, "head": base}, spec, resolved.path, 1000, vocab) as pair:
            sw = ev._sweep(pair, gates, vocab, resolved.sha256, f"{ev.eval_id}/sentinel", spec)
    except (EvalFault, RevisionFault) as exc:
        out.receipt["sentinel_aa_pair"] = {"recorded": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}
        return
    protocol = ev.protocol_key(spec.name)
    deltas = {}
    for g in gates:
        deltas[g.name] = pair_delta(sw.values("base", g.name), sw.values("head", g.name))
        ev.store.add_pair_delta(ev.host, ev.job.profile, protocol, spec.name, g.name, deltas[g.name], sha=base.sha,
                                runtime=ev.base_runtime)
    out.receipt["sentinel_aa_pair"] = {"recorded": True, "deltas": deltas}
