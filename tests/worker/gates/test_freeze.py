"""While one revision is timed the other is frozen (worker/gates/bench.py run_sweep), warmups included,
and thawed again between timings; CPU the frozen one still spent in those windows (work deferred past
its answer) is the revision's fault. Checked on stand-in processes that record the other's state at
every timed request (the cgroup freeze itself: tests/worker/redteam/test_escape.py)."""
import numpy as np
import pytest

from worker.gates.bench import GateSpec, run_sweep
from worker.harness.client import RevisionFault

VOCAB = 16


class Proc:
    def __init__(self, role):
        self.role, self.frozen, self.other = role, False, None
        self.track_cpu, self.last_oncpu_s = False, None
        self.seen_other_frozen: list[tuple[str, bool]] = []  # (request kind, was the other frozen)
        self.cpu, self.burn = 0.0, 0.0  # burn: CPU seconds it spends during each of the other's timings

    def pin(self):
        pass

    def freeze(self, on=True):
        assert self.frozen != on, f"{self.role}: freeze({on}) twice"
        self.frozen = on

    def cpu_seconds(self):
        return self.cpu

    def request(self, kind, **k):
        assert not self.frozen, f"{self.role} was asked to work while frozen"
        if kind in ("prefill", "generate"):
            self.seen_other_frozen.append((kind, self.other.frozen))
            self.other.cpu += self.other.burn
        resp = {"ids": list(range(k["n"])), "steps": None} if kind == "generate" else {}
        return resp, 0.001

    def read_logits(self, resp, n, phase):
        return np.arange(n * VOCAB, dtype=np.float32).reshape(n, VOCAB)


def _pair() -> dict[str, Proc]:
    procs = {"base": Proc("base"), "head": Proc("head")}
    procs["base"].other, procs["head"].other = procs["head"], procs["base"]
    return procs


@pytest.mark.parametrize("warmup", [0, 1])
def test_the_other_revision_is_frozen_for_every_timed_request(warmup):
    procs = _pair()
    base, head = procs["base"], procs["head"]
    gates = [GateSpec("decode@8", "decode_tok_s", 8, 4), GateSpec("prefill@8", "prefill_tok_s", 8, 8)]
    run_sweep(procs, gates, vocab=VOCAB, model_sha="m", pairs=3, warmup=warmup,
              timeout=5, inner=2)
    for p in (base, head):
        # (1 warmup rep + 3 pairs) x 2 inner runs, each a prefill then a generate
        assert len(p.seen_other_frozen) == 2 * 2 * (3 + warmup)
        assert all(frozen for _, frozen in p.seen_other_frozen), p.seen_other_frozen
        assert not p.frozen  # thawed at the end


def test_the_stand_in_sees_an_unfrozen_other_when_freezing_is_off():  # the check above can fail
    procs = _pair()
    base, head = procs["base"], procs["head"]
    run_sweep(procs, [GateSpec("prefill@8", "prefill_tok_s", 8, 8)], vocab=VOCAB,
              model_sha="m", pairs=2, warmup=0, timeout=5, freeze=False)
    assert base.seen_other_frozen and not any(f for _, f in base.seen_other_frozen + head.seen_other_frozen)


def test_cpu_spent_while_the_other_is_timed_is_the_revisions_fault():
    """The second layer: a revision whose threads escaped the freeze (or whose work the cgroup still
    counts) is named, whichever side it is on."""
    for cheat in ("head", "base"):
        procs = _pair()
        procs[cheat].burn = 0.05  # 50 ms of CPU in each 1 ms timing of the other
        with pytest.raises(RevisionFault, match="kept computing after answering") as e:
            run_sweep(procs, [GateSpec("decode@8", "decode_tok_s", 8, 4)], vocab=VOCAB, model_sha="m", pairs=3,
                      warmup=0, timeout=5)
        assert e.value.role == cheat
    run_sweep(_pair(), [GateSpec("decode@8", "decode_tok_s", 8, 4)], vocab=VOCAB, model_sha="m", pairs=3,
              warmup=0, timeout=5)
