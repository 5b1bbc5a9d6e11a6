"""The qwen35moe FFN of the fp32 reference: routing as llama.cpp / HF do it, and the whole MoE model's invariants."""
import pytest
import torch
import torch.nn.functional as F

from runtime.config import shape
from runtime.gguf.names import expected_tensors
from runtime.models.moe_ref import experts_ref, moe_ffn_ref, route_ref
from runtime.models.qwen35_reference import Qwen35Reference
from runtime.synth import init as I

TINY = shape("tiny-moe")


def test_route_is_softmax_over_all_then_topk_renormalised():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]])
    w, ids = route_ref(logits, 2)
    assert ids.tolist() == [[4, 0]]
    p = torch.softmax(logits, -1)[0]
    assert torch.allclose(w[0], torch.stack([p[4], p[0]]) / (p[4] + p[0]))
    # renormalised (llama.cpp norm_w=true, HF norm_topk_prob): the raw top-2 probabilities sum to 0.91
    assert torch.allclose(w.sum(-1), torch.ones(1)) and float(p[4] + p[0]) < 0.95


def test_experts_equal_the_dense_all_expert_sum():
    g = torch.Generator().manual_seed(0)
    T, d, f, E, k = 7, 16, 8, 5, 2
    x = torch.randn(T, d, generator=g)
    gate, up, down = torch.randn(E, f, d, generator=g), torch.randn(E, f, d, generator=g), torch.randn(E, d, f, generator=g)
    w, ids = route_ref(torch.randn(T, E, generator=g), k)
    want = torch.zeros(T, d)
    for t in range(T):
        for j in range(k):
            e = ids[t, j]
            want[t] += w[t, j] * (down[e] @ (F.silu(gate[e] @ x[t]) * (up[e] @ x[t])))
    assert torch.allclose(experts_ref(x, gate, up, down, w, ids), want, atol=1e-5)


def test_shared_expert_is_scaled_by_its_sigmoid_gate():
    g = torch.Generator().manual_seed(1)
    T, d, f, E = 3, 8, 4, 4
    p = "blk.0."
    w = {p + "ffn_gate_inp.weight": torch.randn(E, d, generator=g),
         p + "ffn_gate_exps.weight": torch.zeros(E, f, d), p + "ffn_up_exps.weight": torch.zeros(E, f, d),
         p + "ffn_down_exps.weight": torch.zeros(E, d, f),
         p + "ffn_gate_inp_shexp.weight": torch.randn(d, generator=g),
         p + "ffn_gate_shexp.weight": torch.randn(f, d, generator=g), p + "ffn_up_shexp.weight": torch.randn(f, d, generator=g),
         p + "ffn_down_shexp.weight": torch.randn(d, f, generator=g)}  # fmt: skip
    x = torch.randn(T, d, generator=g)
    out, _ = moe_ffn_ref(x, w, p, 2)  # routed experts are zero: only the shared expert is left
    sh = (F.silu(x @ w[p + "ffn_gate_shexp.weight"].T) * (x @ w[p + "ffn_up_shexp.weight"].T)) @ w[p + "ffn_down_shexp.weight"].T
    assert torch.allclose(out, sh * torch.sigmoid(x @ w[p + "ffn_gate_inp_shexp.weight"])[:, None], atol=1e-6)


@pytest.fixture(scope="module")
def tiny_ref():
    w = {n: torch.cat(list(I.generate(n, s, TINY, 0))) for n, s in expected_tensors(TINY).items()}
    return Qwen35Reference(TINY, w)


def test_decode_token_by_token_equals_prefill(tiny_ref):
    ids = torch.randint(0, TINY.vocab_size, (24,), generator=torch.Generator().manual_seed(2))
    full = tiny_ref.forward(ids, tiny_ref.new_state(), all_logits=True)
    s = tiny_ref.new_state()
    tiny_ref.forward(ids[:16], s)
    step = torch.stack([tiny_ref.forward(ids[i : i + 1], s) for i in range(16, 24)])
    assert (step - full[16:]).abs().max() / full.abs().max() < 1e-4


def test_synthetic_moe_logits_behave_like_a_language_model(tiny_ref):
    ids = torch.randint(0, TINY.vocab_size, (48,), generator=torch.Generator().manual_seed(3))
    lg = tiny_ref.forward(ids, tiny_ref.new_state(), all_logits=True)
    assert torch.isfinite(lg).all() and 2 < float(lg.std()) < 8
    assert float((lg.argmax(-1) == ids).float().mean()) < 0.1  # not an echo of the input
    succ = I.successor(ids, I.DEFAULT.orbit)  # the bigram map rides on the shared expert
    rank = (lg > lg.gather(1, succ[:, None])).sum(-1).float()
    assert float(rank.median()) < 50, rank  # of 4096 tokens


def test_routing_depends_on_the_router(tiny_ref):
    """Zeroing one expert's row of layer 1's router must change which experts that layer picks."""
    ids = torch.randint(0, TINY.vocab_size, (16,), generator=torch.Generator().manual_seed(4))
    tiny_ref.routes = []
    tiny_ref.forward(ids, tiny_ref.new_state())
    before = tiny_ref.routes[1].clone()
    hot = int(torch.bincount(before.flatten()).argmax())
    saved = tiny_ref.w["blk.1.ffn_gate_inp.weight"][hot].clone()
    tiny_ref.w["blk.1.ffn_gate_inp.weight"][hot] = 0.0
    tiny_ref.w["blk.1.ffn_gate_inp.weight"][hot, I.BIAS] = -100.0  # the normed bias channel is > 0: never chosen
    try:
        tiny_ref.routes = []
        tiny_ref.forward(ids, tiny_ref.new_state())
        assert not torch.equal(tiny_ref.routes[1], before) and not (tiny_ref.routes[1] == hot).any()
    finally:
        tiny_ref.w["blk.1.ffn_gate_inp.weight"][hot] = saved
        tiny_ref.routes = None
