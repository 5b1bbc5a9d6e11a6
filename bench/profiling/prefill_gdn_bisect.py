"""GPU bisect for the 0.8B prefill failure (top-1 0.125 = 64/512 with 128-token chunks: only the
first 64-token GDN chunk right, i.e. the state carried between GDN chunks is wrong).

Compares gdn_chunk (Triton) with gdn_chunk_naive at the real head counts — Hv=Hk=16 (0.8B, the
only shape whose scan launch uses BV=16), Hv=32/Hk=16 (4B, BV=32), the fixture shapes — over
several chunks, for each scan BV (TOKENGATE_GDN_SCAN_BV), and prints the relative error of every
64-token block of the output and of the final state. One JSON line per case, a summary last.

    python3 bench/profiling/prefill_gdn_bisect.py [--out receipt.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runtime.kernels.gdn_chunk import gdn_chunk, gdn_chunk_naive  # noqa: E402

DK = 128


def inputs(t, hk, hv, seed, device):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(t, 2 * hk * DK + hv * DK, generator=g)
    alpha, b = torch.randn(t, hv, generator=g), torch.randn(t, hv, generator=g)
    ssm_a = -torch.rand(hv, generator=g) * 4.0 - 0.01
    dt = torch.randn(hv, generator=g) * 0.5
    state = torch.randn(hv, DK, DK, generator=g) * 0.1
    return [x.to(device) for x in (u, alpha, b, ssm_a, dt, state)]


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    rows = []
    for hk, hv in ((16, 16), (16, 32), (2, 2), (1, 2)):
        for t in (64, 200, 512):
            for bv in (16, 32, 64, None):
                if bv is None:
                    os.environ.pop("TOKENGATE_GDN_SCAN_BV", None)
                else:
                    os.environ["TOKENGATE_GDN_SCAN_BV"] = str(bv)
                u, alpha, b, a, dt, s0 = inputs(t, hk, hv, 0, dev)
                s_k, s_r = s0.clone(), s0.clone().double().float()
                try:
                    o = gdn_chunk(u, alpha, b, a, dt, s_k, n_k_head=hk)
                    r = gdn_chunk_naive(u.cpu(), alpha.cpu(), b.cpu(), a.cpu(), dt.cpu(), s_r.cpu(), n_k_head=hk)
                    blocks = [rel(o[i:i + 64].cpu(), r[i:i + 64]) for i in range(0, t, 64)]
                    row = {"hk": hk, "hv": hv, "t": t, "scan_bv": bv or "default", "finite": bool(torch.isfinite(o).all()),
                           "block_rel_err": [round(x, 6) for x in blocks], "state_rel_err": round(rel(s_k.cpu(), s_r.cpu()), 6)}
                    row["pass"] = row["finite"] and max(blocks) < 1e-2 and row["state_rel_err"] < 1e-2
                except Exception as e:  # noqa: BLE001
                    row = {"hk": hk, "hv": hv, "t": t, "scan_bv": bv or "default", "error": repr(e)[:300], "pass": False}
                print(json.dumps(row), flush=True)
                rows.append(row)
    os.environ.pop("TOKENGATE_GDN_SCAN_BV", None)
    bad = [r for r in rows if not r["pass"]]
    print(f"SUMMARY device={dev} cases={len(rows)} failing={len(bad)}: "
          + ", ".join(f"hk{r['hk']}/hv{r['hv']}/t{r['t']}/bv{r['scan_bv']}" for r in bad))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"kind": "prefill_gdn_bisect", "device": dev, "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
