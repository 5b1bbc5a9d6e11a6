"""Calibrate a fresh GPU worker from nothing, then show its placebo and its power (one receipt).

For the lead on the H200; resumable in pieces of <= 9 minutes (`--budget`), the history travelling
as files in `--state DIR` (carry it between device calls):

    python bench/worker/gpu_calibration.py --state .device/cal --profile standard calibrate --budget 520
    python bench/worker/gpu_calibration.py --state .device/cal placebo --budget 520   # repeat until done
    python bench/worker/gpu_calibration.py --state .device/cal detect --budget 520    # repeat until done
    python bench/worker/gpu_calibration.py --state .device/cal report                 # bench/receipts/gpu-calibration-*.json

calibrate  A/A process pairs of main (worker/calibration/auto.py, what a worker does by itself) until
           every gate of the profile can back the false-significance bound; the seconds it took, summed
           over pieces, against the 15-minute target for `standard`.
placebo    more A/A pairs until >= `--placebo-pairs` per gate beyond calibration, read as A/A
           evaluations against the calibration floors (worker/calibration/placebo.py judge_blocks):
           significant evaluations vs the bound, and the bound and floors the whole history supports.
detect     process pairs of main vs branches `plant-1/2/5` of this checkout whose engine busy-waits
           1 / 2 / 5 % of each decode and prefill call's own time after synchronising (a calibrated
           slowdown in the real kernel path, outputs unchanged), read as evaluations: detection rates
           per gate.
CPU check of the logic: `--profile quick --rate 0.05` runs every step in a few minutes.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.tree_snapshot import REF as SNAPSHOT_REF, snapshot_commit  # noqa: E402
from worker.calibration.aa_store import AAStore  # noqa: E402
from worker.calibration.auto import calibrate_pairs, run_pairs  # noqa: E402
from worker.calibration.placebo import judge_blocks  # noqa: E402
from worker.config import EvalSettings  # noqa: E402
from worker.gates.noise import choose_design, gate_null  # noqa: E402

PLANTS = (0.01, 0.02, 0.05)
PLANT_PATCH = '''

# --- planted slowdown (bench/worker/gpu_calibration.py): every decode/prefill call busy-waits a fixed share
# of its own time after synchronising. Outputs and signatures are unchanged.
_PLANT = {share!r}
_plain_load_engine = load_engine


def load_engine(*args, **kwargs):
    import functools as _f
    import time as _t

    eng = _plain_load_engine(*args, **kwargs)
    for name in ("generate_greedy", "prefill"):
        plain = getattr(eng, name)

        # wraps: the driver reads the signature to choose how per-step logits come back (logits_out);
        # a plain (*a, **k) made the plant skip those copies, a speedup that hid the 1 % plant
        @_f.wraps(plain)
        def slowed(*a, _plain=plain, **k):
            t0 = _t.perf_counter()
            out = _plain(*a, **k)
            eng.synchronize()
            end = _t.perf_counter() + _PLANT * (_t.perf_counter() - t0)
            while _t.perf_counter() < end:
                pass
            return out

        setattr(eng, name, slowed)
    return eng
'''
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@tokengate.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@tokengate.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def git(repo: Path, *a: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True,
                          env=GIT_ENV).stdout.strip()


class State:
    def __init__(self, d: Path):
        self.dir = d
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.store = AAStore(d / "history.sqlite")

    def save(self):
        self.path.write_text(json.dumps(self.data, indent=1))


def plant_branch(share: float) -> str:
    return f"plant-{round(share * 100)}"


def setup(st: State, profile: str) -> Path:
    """A clone of this checkout with plant branches (fixed dates: the same SHAs in every piece)."""
    repo = st.dir / "repo"
    if not (repo / ".git").exists():
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True)
        # The working tree as it is (on the device HEAD is the last landed commit; bench/tree_snapshot.py).
        main = snapshot_commit(ROOT)
        git(repo, "fetch", "-q", str(ROOT), f"+{SNAPSHOT_REF}:refs/heads/snapshot")
        git(repo, "checkout", "-q", "-B", "main", main)
        for share in PLANTS:
            b = plant_branch(share)
            git(repo, "checkout", "-q", "-B", b, main)
            init = repo / "runtime" / "__init__.py"
            init.write_text(init.read_text() + PLANT_PATCH.format(share=share))
            git(repo, "commit", "-q", "-am", f"planted {share:.0%} slowdown")
        git(repo, "checkout", "-q", main)
        st.data.update(main=main, profile=profile, created=dt.datetime.now(dt.timezone.utc).isoformat())
        st.save()
    return repo


def settings(st: State, args) -> EvalSettings:
    s = EvalSettings(profile=st.data.get("profile", args.profile), sentinel_aa_pair="never",
                     confirm_head_faults=False)
    return s.model_copy(update={"false_significance_rate": args.rate}) if args.rate else s


def step_calibrate(st: State, args) -> bool:
    repo = setup(st, args.profile)
    s = settings(st, args)
    c = st.data.setdefault("calibrate", {"seconds": 0.0, "pieces": 0, "pairs": 0, "per_pair_seconds": [],
                                         "per_pair_phases": []})
    if c.get("done"):
        return True
    run = calibrate_pairs(str(repo), st.data["main"], s, store=st.store, budget_s=args.budget,
                          base_sha=st.data["main"], trusted_root=ROOT, workdir=st.dir / "work")
    c["seconds"] += run.seconds
    c["pieces"] += 1
    c["pairs"] += run.pairs_recorded
    c["per_pair_seconds"] += run.per_pair_seconds
    c.setdefault("per_pair_phases", []).extend(run.per_pair_phases)
    c.setdefault("piece_seconds", []).append(run.seconds)
    c.update(done=run.done, key=run.key, target=run.target, after=run.after)
    c["minutes"] = round(c["seconds"] / 60, 2)
    c["within_15_min"] = c["seconds"] <= 900 if run.done else None
    # Each gate's history when calibration ended: the floors a worker would judge with from then on
    # (every gate of a model gets every pair, so a gate may hold more than its own target).
    st.data["calibration_n"] = dict(run.after)
    st.save()
    print(f"calibrate: {run.pairs_recorded} pairs in {run.seconds:.0f} s (total {c['seconds']:.0f} s over "
          f"{c['pieces']} piece(s)); done={run.done} {run.stopped or ''}")
    return run.done


def _deltas(st: State, ev_like: dict) -> dict[str, list[float]]:
    """Every A/A delta of each gate under this worker's key, oldest first."""
    return pooled_deltas(st.store.path, st.data["profile"], ev_like, host=st.data["calibrate"]["key"]).get(
        st.data["calibrate"]["key"], {k: [] for k in ev_like})


def pooled_deltas(path, profile: str, ev_like: dict, host: str | None = None) -> dict[str, dict[str, list[float]]]:
    """{host key: {"model gate": deltas oldest first}} of one history file (only `host`, if given),
    for the same profile and measurement protocol: other runs' cards, to pool into the placebo."""
    import sqlite3

    if not Path(path).is_file():  # sqlite3.connect would make an empty database and fail on its missing table
        raise FileNotFoundError(f"A/A history {path}: no such file")
    out: dict[str, dict[str, list[float]]] = {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for name, (model, gate, protocol) in ev_like.items():
            q = "SELECT host, delta FROM pair_delta WHERE profile=? AND protocol=? AND model=? AND gate=?"
            args = [profile, protocol, model, gate]
            if host is not None:
                q, args = q + " AND host=?", args + [host]
            for h, d in db.execute(q + " ORDER BY created", args).fetchall():
                out.setdefault(h, {k: [] for k in ev_like})[name].append(d)
    finally:
        db.close()
    return out


def by_model(names) -> dict[str, list[str]]:
    """"model gate" names grouped by model: each model's gates share every pair (and evaluation)."""
    out: dict[str, list[str]] = {}
    for k in names:
        out.setdefault(k.split(" ", 1)[0], []).append(k)
    return out


def _gates(st: State, s: EvalSettings) -> dict:
    from worker.pipeline import Evaluation, Job

    ev = Evaluation(Job(repo=str(st.dir / "repo"), base_ref="x", head_ref="x", profile=s.profile), s,
                    store=st.store, trusted_root=ROOT)
    return ev, {f"{m.name} {g}": (m.name, g, ev.protocol_key(m.name)) for m in ev.profile.models
                for g in m.gate_names()}


def _nulls(hist: dict[str, list[float]], s: EvalSettings, ev) -> dict:
    rate = s.false_significance_rate / ev.gate_count()
    return {k: gate_null(v, per_gate_rate=rate, minimum=s.noise_floor_min,
                         max_pairs=ev.profile.max_pairs_for(k.split(" ", 1)[1]),
                         uncalibrated_floor=s.noise_floor_uncalibrated) for k, v in hist.items()}


def calibration_n(st: State) -> dict[str, int]:
    """A/A pairs per gate ("model gate") that calibration left; the ones after them are the placebo."""
    return st.data["calibration_n"]


def step_placebo(st: State, args) -> bool:
    if not st.data.get("calibrate", {}).get("done"):
        print("placebo: calibrate first")
        return False
    repo = setup(st, st.data["profile"])  # a state restored on a fresh box has no clone yet
    s = settings(st, args)
    n_cal = calibration_n(st)
    s2 = s.model_copy(update={"calibration_pairs_target": max(n_cal.values()) + args.placebo_pairs})
    run = calibrate_pairs(str(repo), st.data["main"], s2, store=st.store, budget_s=args.budget,
                          base_sha=st.data["main"], trusted_root=ROOT, workdir=st.dir / "work",
                          only=set(args.placebo_models) or None)
    p = st.data.setdefault("placebo", {"seconds": 0.0, "pairs": 0})
    p["seconds"] += run.seconds
    p["pairs"] += run.pairs_recorded
    p["done"] = run.done
    st.save()
    print(f"placebo: {run.pairs_recorded} A/A pairs in {run.seconds:.0f} s; done={run.done} {run.stopped or ''}")
    return run.done


def noise_figures(hist: dict[str, list[float]], s: EvalSettings, ev) -> dict:
    """Per gate, what its A/A pairs support: the bound, the floors, the pair sd and the detectable
    change at 90 % power (worker/gates/noise.py's design for that many pairs; None where too few)."""
    import numpy as np

    full = _nulls(hist, s, ev)
    rate = s.false_significance_rate / ev.gate_count() / 2
    out = {}
    for k, v in hist.items():
        null = full[k]
        d = choose_design(len(v), rate, ev.profile.max_pairs_for(k.split(" ", 1)[1]))
        sd = float(np.std(v, ddof=1)) if len(v) > 2 else None
        out[k] = {"n": len(v), "bound": null.bound, "pairs": null.pairs, "rank": null.rank,
                  "floor_slower": -math.expm1(null.lo), "floor_faster": math.expm1(null.hi), "aa_sd": sd,
                  "mdc_90_estimate": math.expm1(d.mdc_sd * sd) if d and sd is not None else None}
    return out


def pooled_pairs(others: dict[str, dict[str, list[float]]], names: dict) -> dict[str, dict[str, int]]:
    """{host: {model: pairs}} of the pooled cards, each model's fewest over its gates, models with none left out
    (a card that ran only the 0.8B's placebo once read as 0 pairs: the minimum over every model's gates)."""
    return {h: {m: n for m, gates in by_model(names).items() if (n := min(len(d[k]) for k in gates))}
            for h, d in others.items()}


def placebo_figures(st: State, s: EvalSettings, pool: list[Path] = ()) -> dict:
    """This card's A/A pairs after calibration (and every pair of the `pool`ed histories: other runs'
    H200s, each judged apart, since one evaluation runs on one card) read as A/A evaluations
    against this card's calibration floors, model by model (a model's gates share its pairs); then
    the bound and floors all the pairs together support."""
    ev, names = _gates(st, s)
    mine = _deltas(st, names)
    n_cal = calibration_n(st)
    nulls = _nulls({k: v[:n_cal[k]] for k, v in mine.items()}, s, ev)
    others: dict[str, dict[str, list[float]]] = {}
    for path in pool:  # a card found in two files (a copy of a history) counts once
        for h, d in pooled_deltas(path, st.data["profile"], names).items():
            if h != st.data["calibrate"]["key"] and h not in others:
                others[h] = d
    series = [{k: v[n_cal[k]:] for k, v in mine.items()}] + list(others.values())
    models = {}
    for model, gates in by_model(names).items():
        evals = [e for d in series for e in judge_blocks({k: d[k] for k in gates}, {k: nulls[k] for k in gates})]
        sig = sum(any(e[k] != 0 for k in gates) for e in evals)
        models[model] = {"evaluations": len(evals), "significant": sig,
                         "placebo_pairs": min(sum(len(d[k]) for d in series) for k in gates)}
    bound = sum(n.bound for n in nulls.values()) if all(n.calibrated for n in nulls.values()) else None
    hist = {k: mine[k] + [x for d in others.values() for x in d[k]] for k in names}
    supported = noise_figures(hist, s, ev)
    n_eval = min((m["evaluations"] for m in models.values()), default=0)
    return {"calibration_pairs_per_gate": n_cal,
            "placebo_pairs_per_gate": {k: len(mine[k]) - n_cal[k] + sum(len(d[k]) for d in others.values())
                                       for k in names},
            "pooled_hosts": pooled_pairs(others, names),
            "per_model": models,
            # an evaluation runs every model: at most the fewest any model was judged on
            "placebo_evaluations": n_eval,
            "significant_evaluations": sum(m["significant"] for m in models.values()),
            "bound_per_evaluation_at_calibration": bound,
            "false_significance_observed": (sum(m["significant"] / m["evaluations"] for m in models.values())
                                            if n_eval else None),  # union over models: an upper figure
            "supported_by_whole_history": supported,
            "bound_per_evaluation_whole_history": sum(x["bound"] for x in supported.values())
            if all(x["bound"] is not None for x in supported.values()) else None}


def step_detect(st: State, args) -> bool:
    if not st.data.get("calibrate", {}).get("done"):
        print("detect: calibrate first")
        return False
    from worker.pipeline import Evaluation, Job

    repo = setup(st, st.data["profile"])  # a state restored on a fresh box has no clone yet
    s = settings(st, args)
    t0 = time.monotonic()
    det = st.data.setdefault("detect", {})
    for share in args.plants:
        b = plant_branch(share)
        rec = det.setdefault(b, {"deltas": {}, "seconds": 0.0})
        if recorded(rec, args.detect_models) >= args.detect_pairs:
            continue
        job = Job(repo=str(repo), base_ref=st.data["main"], head_ref=b, base_sha=st.data["main"],
                  profile=s.profile)
        ev = Evaluation(job, s, store=st.store, trusted_root=ROOT, workdir=st.dir / "work")
        left = None if args.budget is None else args.budget - (time.monotonic() - t0)
        if left is not None and left < 30:
            break
        tp = time.monotonic()

        def on_pair(spec, deltas):
            for g, d in deltas.items():
                rec["deltas"].setdefault(f"{spec.name} {g}", []).append(d)

        def want_more(spec, gates, _gk):
            return detect_wants(rec, spec.name, [g.name for g in gates], args.detect_pairs, args.detect_models)

        n, _per, stopped = run_pairs(ev, want_more=want_more, on_pair=on_pair, budget_s=left, head_ref=b)
        rec["seconds"] += round(time.monotonic() - tp, 1)
        st.save()
        print(f"detect {b}: {n} pairs ({recorded(rec, args.detect_models)} recorded) {stopped or ''}")
        if stopped:
            return False
    return all(recorded(det.get(plant_branch(x), {"deltas": {}}), args.detect_models) >= args.detect_pairs
               for x in args.plants)


def recorded(rec: dict, models: list[str]) -> int:
    """Planted pairs of `models` (empty: every model) so far: the fewest any of their gates has. Counted
    afresh each time, not kept: a plant run for the 0.8B once has none yet for the 9B."""
    return min((len(rec["deltas"][k]) for m, gates in by_model(rec["deltas"]).items() if not models or m in models
                for k in gates), default=0)


def detect_wants(rec: dict, model: str, gates: list[str], pairs: int, models: list[str]) -> bool:
    """Whether a plant's detection wants another pair of `model`: it has gates, is among `models` (empty:
    every model) and one of its gates has fewer than `pairs` planted pairs."""
    if not gates or (models and model not in models):
        return False
    return min(len(rec["deltas"].get(f"{model} {g}", [])) for g in gates) < pairs


def resampled_detection(deltas: list[float], null, draws: int = 4000, seed: int = 0) -> float | None:
    """The chance that one evaluation calls this gate slower, estimated by drawing its process pairs
    with replacement from the recorded ones, pair after pair while the gate wants more (as the
    pipeline stops). An estimate from n pairs, beside the direct count over disjoint evaluations
    (which a session's device time keeps to one or two); None below 3 pairs."""
    if len(deltas) < 3:
        return None
    rng = random.Random(seed)
    hits = 0
    for _ in range(draws):
        block = [rng.choice(deltas)]
        while null.wants_more(block):
            block.append(rng.choice(deltas))
        hits += null.significant(block) < 0
    return hits / draws


def detect_figures(st: State, s: EvalSettings) -> dict:
    ev, names = _gates(st, s)
    nulls = _nulls(_deltas(st, names), s, ev)
    return {b: plant_figures({k: v for k, v in rec["deltas"].items() if k in nulls}, nulls)
            for b, rec in st.data.get("detect", {}).items()}


def plant_figures(deltas: dict[str, list[float]], nulls: dict) -> dict:
    """One plant's pairs ("model gate" -> log ratios) read as evaluations model by model, as the pipeline
    runs them: a model's gates share its pairs, and models' pairs are not aligned (a 9B run after a 0.8B
    one must not cut the 0.8B's evaluations to the 9B's count)."""
    models = by_model(deltas)
    evals = {m: judge_blocks({k: deltas[k] for k in gates}, nulls) for m, gates in models.items()}

    def rate(k):
        mine = evals[k.split(" ", 1)[0]]
        return sum(e[k] < 0 for e in mine) / len(mine) if mine else None

    return {"evaluations": {m: len(e) for m, e in evals.items()},
            "pairs": {m: min(len(deltas[k]) for k in gates) for m, gates in models.items()},
            "detected_slower": {k: rate(k) for k in deltas},
            "resampled_detected_slower": {k: resampled_detection(v, nulls[k]) for k, v in deltas.items()},
            "mean_change": {k: math.expm1(sum(v) / len(v)) for k, v in deltas.items() if v}}


def report(st: State, args) -> Path:
    s = settings(st, args)
    ev, names = _gates(st, s)
    out = {"kind": "gpu_calibration", "profile": st.data.get("profile"), "main": st.data.get("main"),
           "false_significance_rate": s.false_significance_rate, "calibration": st.data.get("calibrate"),
           "placebo": (placebo_figures(st, s, [Path(x) for x in args.pool])
                       if st.data.get("calibrate", {}).get("done") else None),
           "detection": detect_figures(st, s) if st.data.get("detect") else None,
           # what this card's history supports so far, calibrated or not (a piece that ran out of time too)
           "noise_by_gate": noise_figures(_deltas(st, names), s, ev) if st.data.get("calibrate") else None,
           "host": (json.loads(Path(args.host_from).read_text())["host"] if args.host_from else
                    __import__("worker.calibration.key", fromlist=["key_facts"]).key_facts(s.profile_settings().device)),
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if args.host_from:  # made off the box, from the state the box returned
        out["made_off_the_box_from"] = Path(args.host_from).name
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"gpu-calibration-{out['profile']}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=str))
    c = out["calibration"] or {}
    print(f"calibration: {c.get('pairs')} A/A pairs, {c.get('minutes')} min (<= 15: {c.get('within_15_min')})")
    if out["placebo"]:
        p = out["placebo"]
        per = ", ".join(f"{m} {d['significant']}/{d['evaluations']} ({d['placebo_pairs']} pairs)"
                        for m, d in p["per_model"].items())
        print(f"placebo: significant A/A evaluations {per}; bound {p['bound_per_evaluation_at_calibration']}; "
              f"whole history supports {p['bound_per_evaluation_whole_history']}; pooled {p['pooled_hosts']}")
    for b, d in (out["detection"] or {}).items():
        print(f"{b}: " + ", ".join(f"{k} {v:.0%}" for k, v in d["detected_slower"].items() if v is not None))
    print(f"receipt: {path}")
    return path


def _percents(text: str) -> tuple[float, ...]:
    shares = tuple(float(x) / 100 for x in text.split(","))
    if any(not 0 < x < 1 for x in shares):
        raise argparse.ArgumentTypeError(f"plants are percents in (0, 100): {text!r}")
    return shares


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", required=True, help="directory holding the history (resumable)")
    ap.add_argument("--profile", default="standard")
    ap.add_argument("--rate", type=float, default=None, help="false-significance rate (default: the settings')")
    ap.add_argument("--budget", type=float, default=520.0, help="seconds per piece (<= 9 min)")
    ap.add_argument("--placebo-pairs", type=int, default=50)
    ap.add_argument("--detect-pairs", type=int, default=12)
    ap.add_argument("--plants", type=_percents, default=PLANTS,
                    help="planted slowdowns in percent, in the order run (default 1,2,5): a short session runs the "
                         "smallest first")
    ap.add_argument("--detect-models", type=lambda t: [x for x in t.split(",") if x], default=[],
                    help="detect: only these models' pairs (comma-separated; default every model). The 0.8B's pairs "
                         "take ~8 s against the 9B's ~45 s: a direct count of its gates fits in a few minutes")
    ap.add_argument("--placebo-models", type=lambda t: [x for x in t.split(",") if x], default=[],
                    help="placebo: only these models' pairs (comma-separated; default every model, in the profile's "
                         "order: the 9B's ~42 s pairs first). The 0.8B's ~7 s pairs reach 50 in one call")
    ap.add_argument("--pool", nargs="*", default=[],
                    help="history files of earlier runs (other cards) to pool into the placebo figures")
    ap.add_argument("--out", default=str(ROOT / "bench" / "receipts"))
    ap.add_argument("--host-from", default=None,
                    help="report off the box: take the host facts from this receipt the box wrote")
    ap.add_argument("step", choices=["calibrate", "placebo", "detect", "report", "all"])
    args = ap.parse_args(argv)
    st = State(Path(args.state))
    if args.step == "calibrate":
        step_calibrate(st, args)
    elif args.step == "placebo":
        step_placebo(st, args)
    elif args.step == "detect":
        step_detect(st, args)
    elif args.step == "report":
        report(st, args)
    else:
        ok = step_calibrate(st, args) and step_placebo(st, args) and step_detect(st, args)
        report(st, args)
        return 0 if ok else 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
