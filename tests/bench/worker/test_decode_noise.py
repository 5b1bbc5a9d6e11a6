"""bench/worker/decode_noise.py: the arithmetic that separates process-pair offsets from within-pair noise, and
one CPU run of the script end to end (tiny model, quick profile) so the GPU call cannot die on a typo."""
import json
import math

import pytest

from bench.worker import decode_noise


def _rows(offsets, jitter):
    """Pair p's two sweeps in every mode: offset[p] +- jitter (log deltas)."""
    rows = []
    for p, off in enumerate(offsets):
        for sweep, sign in enumerate((1, -1)):
            for mode in decode_noise.MODES:
                rows.append({"pair": p, "mode": mode, "sweep": sweep, "delta": {"decode@128": off + sign * jitter},
                             "seconds": {"decode@128": 0.2}})
    return rows


def test_offsets_show_across_pairs_and_jitter_within():
    s = decode_noise.summarize(_rows([0.01, -0.01, 0.02, -0.02], 0.001), ["decode@128"])["pinned"]["decode@128"]
    assert s["pairs"] == 4
    assert s["across_pairs_sd_pct"] == pytest.approx(100 * 0.018257, rel=1e-3)  # sd of the pair means
    assert s["within_pair_sd_pct"] == pytest.approx(100 * 0.002 / math.sqrt(2), abs=1e-4)
    flat = decode_noise.summarize(_rows([0.0] * 4, 0.01), ["decode@128"])["off"]["decode@128"]
    assert flat["across_pairs_sd_pct"] == 0.0 and flat["within_pair_sd_pct"] > 1.0


@pytest.mark.timed
@pytest.mark.sandbox  # the script refuses a weaker sandbox
@pytest.mark.parametrize("variants,modes,extra", [("copy", decode_noise.MODES, []),
                                                  ("cpus", decode_noise.CPU_MODES, ["--prefill"])])
def test_runs_end_to_end_on_the_cpu(tmp_path, variants, modes, extra):
    assert decode_noise.main(["--profile", "quick", "--model", "qwen35-tiny", "--pairs", "2", "--reps", "2",
                              "--variants", variants, *extra, "--out", str(tmp_path)]) == 0
    (receipt,) = tmp_path.glob("decode-noise-*.json")
    r = json.loads(receipt.read_text())["results"][0]
    assert {x["mode"] for x in r["rows"]} == set(modes) and len(r["rows"]) == 2 * 2 * len(modes)
    assert r["summary"][modes[1]]["decode@32"]["pairs"] == 2
    assert ("prefill@32" in r["gates"]) == bool(extra)
