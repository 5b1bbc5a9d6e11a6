"""Outside check: the reference MoE FFN against HF transformers' own Qwen3_5MoeSparseMoeBlock output
(tests/fixtures/qwen35moe/hf_moe_block.npz, written by scripts/moe_hf_block_fixture.py)."""
from pathlib import Path

import numpy as np
import torch

from runtime.models.moe_ref import moe_ffn_ref, route_ref

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "qwen35moe" / "hf_moe_block.npz"


def _load():
    z = np.load(FIX)
    w = {n: torch.from_numpy(z[n]) for n in z.files if n.startswith("blk.")}
    return torch.from_numpy(z["x"]), torch.from_numpy(z["y"]), w, int(z["k"])


def test_reference_moe_ffn_equals_transformers_block():
    x, y, w, k = _load()
    out, _ = moe_ffn_ref(x, w, "blk.0.", k)
    rel = float((out - y).norm() / y.norm())
    assert rel < 1e-5, rel  # measured 2.0e-7 (transformers 5.18.0, fp32)


def test_fixture_routing_is_not_trivial():
    """The check only means something if tokens pick different experts with uneven weights."""
    x, _, w, k = _load()
    weights, ids = route_ref(x @ w["blk.0.ffn_gate_inp.weight"].T, k)
    assert len({tuple(sorted(r)) for r in ids.tolist()}) >= 6
    assert float((weights[:, 0] - weights[:, 1]).abs().min()) < 0.5 < float(weights[:, 0].max())


def test_unnormalised_top_k_would_fail_the_check():
    """Mutation guard: the same block with the top-k weights left unnormalised is far from HF's output."""
    from runtime.models.moe_ref import experts_ref

    x, y, w, k = _load()
    p = "blk.0."
    probs = torch.softmax(x @ w[p + "ffn_gate_inp.weight"].T, -1)
    top, ids = torch.topk(probs, k, -1)
    routed = experts_ref(x, w[p + "ffn_gate_exps.weight"], w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"],
                         top, ids)
    h = torch.nn.functional.silu(x @ w[p + "ffn_gate_shexp.weight"].T) * (x @ w[p + "ffn_up_shexp.weight"].T)
    out = routed + (h @ w[p + "ffn_down_shexp.weight"].T) * torch.sigmoid(x @ w[p + "ffn_gate_inp_shexp.weight"])[:, None]
    assert float((out - y).norm() / y.norm()) > 1e-2
