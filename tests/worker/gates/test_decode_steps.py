"""Every timed decode step checked at logit level (issue 13 item 6 / issue 14 item 5).

The verified reps (drawn in secret before timing) have every generated token teacher-forced through
the trusted reference: each must be the reference's argmax within the tie tolerance (paired against
base), and the per-step logits the revision returned inside the timed request are KL-checked at
every step. Fake runtimes on the CPU profile; each test fails when its rule is removed.
"""
import re

import numpy as np
import pytest

from worker.gates.bench import GateSpec, Sample, Sweep
from worker.gates.verify import OutputCheck, judge_steps, merge_output_checks, verify_outputs
from worker.records import Verdict

from tests.worker.helpers import eval_fakes, reference_verify_stages

DECODE = dict(decode_contexts=[32], prefill_contexts=[], decode_tokens=24, pairs=2)


@pytest.mark.sandbox
def test_a_decode_that_drifts_only_in_its_logits_is_caught_at_every_step(tmp_path, cache):
    r = eval_fakes(tmp_path, head="decode_drift", **DECODE)
    assert r.verdict is Verdict.REJECT, r.summary
    assert "decode@32 decode steps" in r.summary
    assert re.search(r"over (48|96|144|192) decode steps", r.summary)  # 2 verified reps x 24 steps per process pair
    assert all(g.passed for g in r.guards)  # the all-logits accuracy guard alone would have passed it


@pytest.mark.sandbox
def test_a_decode_that_emits_a_wrong_token_now_and_then_is_caught(tmp_path, cache):
    r = eval_fakes(tmp_path, head="decode_wrong", **DECODE)
    assert r.verdict is Verdict.REJECT, r.summary
    assert "not the reference's choice (base 0" in r.summary  # 44 of 48 agree: above the 90 % bar


@pytest.mark.sandbox
def test_a_good_head_passes_every_step(tmp_path, cache):
    r = eval_fakes(tmp_path, **DECODE)
    assert r.verdict not in (Verdict.REJECT, Verdict.INFRA), r.summary


# -- the pieces -------------------------------------------------------------------------------------
class Reference:
    """The trusted reference's teacher_logits: a fixed table of logits per step."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def request(self, op, *, phase, timeout, **kw):
        self.calls.append(op)
        if op == "teacher_logits":
            self.rows = self.table[:len(kw["emitted"]) + 1]
            return {"ok": True, "shape": list(self.rows.shape)}, 0.0
        return {"ok": True}, 0.0

    def read_logits(self, resp, rows, phase):
        return self.rows.copy()


def _sweep(role_ids, role_steps, table, reps=(0, 1)):
    g = GateSpec("decode@8", "decode_tok_s", 8, 4)
    sw = Sweep([g], prompts={f"k{r}": [1] * 8 for r in reps})
    for role, ids in role_ids.items():
        sw.checked[(role, g.name)] = [Sample(role, g.name, r, f"k{r}", 1.0, 1.0, ids=ids,
                                             step_logits=role_steps.get(role)) for r in reps]
    return sw, g


def test_only_the_verified_reps_are_checked_and_every_step_of_them():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((5, 30)).astype(np.float32) * 4
    ids = [int(table[i].argmax()) for i in range(4)]
    sw, g = _sweep({"head": ids}, {"head": table[1:].copy()}, table)
    ref = Reference(table)
    c = verify_outputs(sw, "head", g, ref, timeout=1, tie_tol=1e-3, reps=[1])
    assert c.checked_tokens == 4 and c.misses == 0 and c.step_kl_steps == 4 and c.step_kl_max < 1e-9
    assert ref.calls.count("teacher_logits") == 1  # rep 0 was not drawn


def test_step_kl_and_misses_are_judged_against_base():
    rng = np.random.default_rng(1)
    table = rng.standard_normal((5, 30)).astype(np.float32) * 4
    ids = [int(table[i].argmax()) for i in range(4)]
    drift = table[1:] * 0.5  # same argmaxes, another distribution
    sw, g = _sweep({"base": ids, "head": ids}, {"base": table[1:].copy(), "head": drift}, table)
    base = verify_outputs(sw, "base", g, Reference(table), timeout=1, tie_tol=1e-3)
    head = verify_outputs(sw, "head", g, Reference(table), timeout=1, tie_tol=1e-3)
    assert head.agree == 1.0 and head.step_kl_mean > 1e-2  # argmax agreement alone would pass it
    kw = dict(extra_misses=2, floor=1e-3, ratio=4.0, base_max=0.1)
    fails = judge_steps("m", "decode@8", head, base, **kw)
    assert len(fails) == 1 and "decode steps" in fails[0]
    assert judge_steps("m", "decode@8", base, base, **kw) == []
    wrong = OutputCheck(0.9, 40, misses=4, miss_at=[("k0", 3)])
    assert "not the reference's choice" in judge_steps("m", "decode@8", wrong, OutputCheck(1.0, 40), **kw)[0]
    assert judge_steps("m", "decode@8", OutputCheck(0.95, 40, misses=2), OutputCheck(1.0, 40), **kw) == []


def test_a_head_that_returns_no_step_logits_is_counted_not_passed():
    table = np.random.default_rng(2).standard_normal((5, 30)).astype(np.float32)
    ids = [int(table[i].argmax()) for i in range(4)]
    sw, g = _sweep({"head": ids}, {}, table)
    c = verify_outputs(sw, "head", g, Reference(table), timeout=1, tie_tol=1e-3)
    assert c.step_kl_steps == 0 and c.steps_not_returned == 2 and c.misses == 0
    merged = merge_output_checks([c, c])
    assert merged.steps_not_returned == 4 and merged.checked_tokens == 16


class MarkovReference:
    """A reference whose logits after a token depend on that token only (row `t` of a V x V table; row 0 of the
    answer, the prompt's last position, is `first`): teacher forcing on different leads gives different rows."""

    def __init__(self, first, table):
        self.first, self.table, self.forced = first, table, []

    def request(self, op, *, phase, timeout, **kw):
        if op == "teacher_logits":
            self.forced.append(list(kw["emitted"]))
            self.rows = np.stack([self.first] + [self.table[t] for t in kw["emitted"]])
            return {"ok": True, "shape": list(self.rows.shape)}, 0.0
        return {"ok": True}, 0.0

    def read_logits(self, resp, rows, phase):
        return self.rows.copy()

    def greedy(self, start, n):
        ids, t = [], start
        for _ in range(n):
            t = int(self.table[t].argmax())
            ids.append(t)
        return ids


def test_the_decode_check_teacher_forces_the_lead_token_first():
    """A timed generate continues from the secret lead it brought (decode(lead), then greedy): a revision that
    ignores it and decodes from the prefill's argmax as before emits a continuation the check refuses."""
    rng = np.random.default_rng(3)
    V = 40
    first, table = rng.standard_normal(V).astype(np.float32) * 4, rng.standard_normal((V, V)).astype(np.float32) * 4
    ref = MarkovReference(first, table)
    argmax = int(first.argmax())
    lead = (argmax + 7) % V
    honest = ref.greedy(lead, 4)  # decode(lead), then 4 greedy steps
    ignored = [argmax] + ref.greedy(argmax, 3)  # greedy from the prefill's argmax: the lead never decoded
    assert honest != ignored
    g = GateSpec("decode@8", "decode_tok_s", 8, 5)
    sw = Sweep([g], prompts={"k0": [1] * 8})
    sw.checked[("base", g.name)] = [Sample("base", g.name, 0, "k0", 1.0, 1.0, ids=honest, lead=lead,
                                           step_logits=table[honest].copy())]
    sw.checked[("head", g.name)] = [Sample("head", g.name, 0, "k0", 1.0, 1.0, ids=ignored, lead=lead,
                                           step_logits=table[ignored].copy())]
    cache: dict = {}
    base = verify_outputs(sw, "base", g, ref, timeout=1, tie_tol=1e-3, cache=cache)
    assert ref.forced == [[lead] + honest]  # the lead first, then the emitted ids
    assert base.misses == 0 and base.checked_tokens == 4 and base.step_kl_steps == 4 and base.step_kl_max < 1e-9
    head = verify_outputs(sw, "head", g, ref, timeout=1, tie_tol=1e-3, cache=cache)
    assert head.misses >= 1 and head.miss_at[0] == ("k0", 0)
    assert judge_steps("m", g.name, head, base, extra_misses=0, floor=1e-3, ratio=4.0, base_max=0.1)
    # the cache is keyed by the lead too: base's ids under another lead are checked afresh, and miss
    sw.checked[("head", g.name)][0] = Sample("head", g.name, 0, "k0", 1.0, 1.0, ids=honest, lead=(lead + 1) % V)
    assert verify_outputs(sw, "head", g, ref, timeout=1, tie_tol=1e-3, cache=cache).misses >= 1


@pytest.mark.sandbox
def test_a_head_that_ignores_the_lead_token_is_caught(tmp_path, cache):
    """Its first decode after a prefill (the lead) is skipped: the tokens of before the lead, one step cheaper."""
    r = eval_fakes(tmp_path, head="ignore_lead", **DECODE)
    assert r.verdict is Verdict.REJECT, r.summary
    # Caught by its tokens or, where the skipped lead's continuation happens to meet the reference's argmax on the
    # checked steps (the lead is drawn afresh per request: CI saw it once), by its step logits; base clean either way
    assert ("not the reference's choice (base 0" in r.summary
            or ("decode steps: head's timed outputs differ from the reference" in r.summary and "base 0/0" in r.summary)
            ), r.summary


class StubProc:
    """A revision process as run_sweep sees it: answers every request with a vocabulary-30 row per step."""
    track_cpu, last_oncpu_s = False, None

    def __init__(self, role):
        self.role, self.requests = role, []

    def pin(self):
        pass

    def freeze(self, on=True):
        pass

    def cpu_seconds(self):
        return None

    def read_logits(self, resp, rows, phase):
        return np.tile(np.arange(30, dtype=np.float32), (rows, 1))

    def request(self, op, *, phase, timeout, **kw):
        self.requests.append((op, kw.get("step_logits")))
        if op == "generate":
            return {"ok": True, "ids": [1] * kw["n"], "steps": kw["n"], "shape": [kw["n"], 30]}, 0.01
        return {"ok": True, "shape": [30]}, 0.01


def test_the_step_logits_are_kept_only_for_the_secret_reps(tmp_path):
    from worker.gates.bench import run_sweep

    Proc = StubProc
    procs = {"base": Proc("base"), "head": Proc("head")}
    g = GateSpec("decode@8", "decode_tok_s", 8, 4)
    sw = run_sweep(procs, [g], vocab=30, model_sha="x", pairs=3, warmup=1, timeout=1, step_logits=True,
                   keep_steps={2})
    kept = {s.rep for s in sw.checked[("head", g.name)] if s.step_logits is not None}
    assert kept == {2}
    # Every timed generate asked the same: nothing tells the revision which rep is verified.
    assert {x for x in procs["head"].requests if x[0] == "generate"} == {("generate", True)}


@pytest.mark.sandbox
def test_a_head_that_stops_returning_step_logits_is_caught(tmp_path, cache):
    """Its generate_greedy bypasses engine.decode (and takes no logits_out) while base's returns them."""
    r = eval_fakes(tmp_path, head="no_step_logits", **DECODE)
    assert r.verdict is Verdict.REJECT, r.summary
    assert "returned no per-step logits where base's did" in r.summary


FUSED = '''
    def generate_greedy(self, n, logits_out=None):  # a loop of its own, never engine.decode
        import torch
        out = []
        for i in range(n):
            t = int(np.argmax(self.last))
            out.append(t)
            row = _variant.decode_step(self, t).astype(np.float32)
            if logits_out is not None and FILL:
                logits_out[i].copy_(torch.from_numpy(row))
        return out
'''


def _fused_runtime(tmp_path, fill: bool):
    import shutil

    from tests.worker.helpers import GOOD

    root = tmp_path / ("fused" if fill else "unfilled")
    shutil.copytree(GOOD, root, ignore=shutil.ignore_patterns("__pycache__"))
    src = (root / "runtime" / "__init__.py").read_text()
    a = src.index("    def generate_greedy(self, n):")
    b = src.index("    def snapshot(self):")
    src = src[:a] + FUSED.lstrip("\n") + "\n" + src[b:]
    src = src.replace("import numpy as np\n", f"import numpy as np\nimport torch  # noqa: F401\nFILL = {fill}\n", 1)
    (root / "runtime" / "__init__.py").write_text(src)
    return root


def _step_rows(tmp_path, root, name):
    from worker.harness.client import RevisionProcess

    from tests.worker.helpers import fake_model

    m = fake_model(tmp_path / "m.gguf")
    with RevisionProcess("head", root, tmp_path / name, read_only=[tmp_path]) as proc:
        proc.start(60)
        proc.request("load", path=str(m), device="cpu", max_context=256, backend="auto", phase="load", timeout=60)
        proc.request("stage", key="k", ids=list(range(1, 40)), phase="stage", timeout=10)
        proc.request("prefill", key="k", phase="measure", timeout=10)
        resp, _ = proc.request("generate", n=5, lead=7, step_logits=True, phase="measure", timeout=10)
        return resp["steps"], proc.read_logits(resp, 5, "measure")


@pytest.mark.sandbox
@pytest.mark.timed
def test_an_engine_with_its_own_loop_fills_logits_out_like_the_decode_hook(tmp_path):
    pytest.importorskip("torch")
    from tests.worker.helpers import GOOD

    steps, hooked = _step_rows(tmp_path, GOOD, "good")
    steps2, fused = _step_rows(tmp_path, _fused_runtime(tmp_path, True), "fused")
    assert steps == steps2 == 5  # the lead's decode (the driver's own call) is not one of generate_greedy's steps
    np.testing.assert_array_equal(hooked, fused)
    _, unfilled = _step_rows(tmp_path, _fused_runtime(tmp_path, False), "unfilled")
    assert np.isnan(unfilled).all()  # rows it never wrote stay NaN: the parent refuses them


def test_non_finite_step_logits_are_the_revisions_fault():
    from worker.gates.bench import run_sweep
    from worker.harness.client import RevisionFault

    class Proc(StubProc):
        def read_logits(self, resp, rows, phase):
            x = super().read_logits(resp, rows, phase)
            if rows > 1 and self.role == "head":
                x[-1] = np.nan
            return x

    g = GateSpec("decode@8", "decode_tok_s", 8, 4)
    with pytest.raises(RevisionFault) as e:
        run_sweep({"base": Proc("base"), "head": Proc("head")}, [g], vocab=30, model_sha="x", pairs=2, warmup=0,
                  timeout=1, step_logits=True)
    assert e.value.role == "head" and e.value.kind == "nonfinite"


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_reference_computes_each_timed_prompt_once(tmp_path, cache, monkeypatch):
    """The teacher-forced decode check and the timed-logit check need the same prompt's last-position logits: the
    reference prefills it once (a 32k prompt on the 9B's fp32 reference costs seconds; verify was 249 s of a 356 s
    A/A, bench/receipts/gpu-e2e-h100-20261206T192305Z.json). What each process's requests cost is in the receipt."""
    staged = reference_verify_stages(monkeypatch)
    r = eval_fakes(tmp_path)
    assert r.verdict not in (Verdict.INFRA, Verdict.REJECT), r.summary  # uncalibrated: no A/A history here
    assert staged and len(staged) == len(set(staged)), sorted(staged)
    ops = r.receipt["processes"]["reference"]["op_seconds"]
    assert ops["teacher_logits"][0] >= 1 and ops["stage"][0] >= len(staged), ops
    assert all(calls >= 1 and seconds >= 0 for calls, seconds in ops.values())
    checked = r.receipt["models"]["fake"]["timed_logit_checks"]  # the shared rows still check every timed request
    assert all(c[role]["checked"] >= 1 for c in checked.values() for role in ("base", "head")), checked


@pytest.mark.sandbox
@pytest.mark.timed
def test_the_reference_skips_untimed_decode_prefills_of_unverified_reps(tmp_path, cache, monkeypatch):
    """A decode gate's prefill is on no clock: the reference checks it on the verified rep only (its generate is
    checked there step by step), while every rep's timed prefill is still checked. On the 9B that spares the fp32
    reference 3 of 4 reps' decode-only prompts (verify 153 s of a 335 s A/A, gpu-e2e-h100-20261206T204709Z.json)."""
    staged = reference_verify_stages(monkeypatch)
    r = eval_fakes(tmp_path, pairs=4, verify_reps=1)  # decode@32 alone at its context, prefill@64 alone at its own
    assert r.verdict not in (Verdict.INFRA, Verdict.REJECT), r.summary
    first = [k for k in staged if "/" not in k.split(":")[1]]  # the first pair's (a loaded box may add a confirming one)
    reps = lambda ctx: sorted({int(k.split(":")[2]) for k in first if k.startswith(f"ctx{ctx}:")})  # noqa: E731
    assert reps(64) == [0, 1, 2, 3], staged  # timed prefills: every rep
    assert len(reps(32)) == 1, staged  # the decode gate's untimed prefill: the verified rep's alone
    checked = r.receipt["models"]["fake"]["timed_logit_checks"]  # per pair: 4 timed prefills, 1 verified decode rep
    pairs = {g.gate: g.n_pairs for g in r.gates}  # a confirming pair times only the gates in play (gates/confirm.py)
    assert checked["prefill@64"]["head"]["checked"] == 4 * pairs["prefill@64"]
    assert checked["decode@32"]["head"]["checked"] == pairs["decode@32"]
