"""The qwen35moe path of the Triton engine against the fp32 reference on a synthetic tiny-moe Q4_K_M file
(interpreter on CPU, CUDA when present)."""
import pytest
import torch

from runtime.gguf import load_gguf
from runtime.kernels.moe_experts import ExpertTile
from runtime.kernels.moe_experts.gemv_path import path_flags
from runtime.models.attention_ref import rms_norm_ref
from runtime.models.moe_ref import moe_ffn_ref
from runtime.models.qwen35_reference import Qwen35Reference, weights_from_gguf
from runtime.synth.factory import synthesize
from runtime.triton.decode import DecodeBuffers, DecodeState, DecodeStep
from runtime.triton.engine import load_triton_engine
from runtime.triton.moe import decode_ffn, prefill_ffn
from runtime.triton.weights import DeviceWeights


def _kl(p, q):
    lp, lq = torch.log_softmax(p.double(), -1), torch.log_softmax(q.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    r = synthesize("tiny-moe", "q4_k_m", 0, tmp_path_factory.mktemp("moe") / "tiny-moe-q4.gguf", workers=2)
    m = load_gguf(r.path)
    return m, weights_from_gguf(m)


def _layer_input(cfg, n, seed):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, cfg.d_model, generator=g)
    h[:, 0] = 4.0  # the synthetic models' bias channel: routes like inside the model
    return h


@pytest.mark.parametrize("tile, tol", [(ExpertTile(), 1e-4), (ExpertTile(16, 16, split_down=True), 1e-4),
                                       (ExpertTile(16, 16, True, 4, "words", 1), 1e-4),
                                       (ExpertTile(16, 16, True, 4, "x8", 1), 3e-2),  # x rounded to int8
                                       (ExpertTile(16, 16, True, 4, "words", 1, True), 1e-4),
                                       (ExpertTile(16, 16, False, 4, "x8", 1, True), 3e-2),
                                       (None, 3e-2)],  # the engine's default: x8q6, shared expert folded in
                         ids=["fused", "split", "words", "x8", "words-shared", "x8-fused-shared", "engine-default"])
def test_decode_ffn_layer_matches_reference(tiny_moe, device, tile, tol):
    model, w = tiny_moe
    cfg = model.config
    dw = DeviceWeights(model, device)
    step = DecodeStep(dw, DecodeState(cfg, 8, device), DecodeBuffers(cfg, 8, device, n_split=1), expert_tile=tile)
    # the tiny file's stacks (K = one block) do take an asked path, not its fallback; the default's two blocks a
    # step do not fit one block, so it runs byte-wise there (with the shared expert folded in)
    if tile is not None and tile.path != "tile":
        gate = dw.mat["blk.1.ffn_gate_exps.weight"]
        flags = path_flags(tile.path, gate.qtype, gate.data, gate.cols, tile.block_b)
        assert flags["WORDS"] and flags["X8"] == tile.path.startswith("x8")
    for layer, seed in ((1, 0), (2, 1)):
        p = f"blk.{layer}."
        h = _layer_input(cfg, 1, seed)
        step.b.h.copy_(h.to(device))
        decode_ffn(step, p)
        want_ids = moe_ffn_ref(rms_norm_ref(h, w[p + "post_attention_norm.weight"], cfg.rms_eps), w, p,
                               cfg.n_expert_used)
        want = h + want_ids[0]
        assert torch.equal(step.b.moe.ids.cpu().long(), want_ids[1])  # the device chose the same experts
        rel = (step.b.h.cpu() - want).norm() / (want - h).norm()
        assert rel < tol, rel


@pytest.mark.slow
def test_prefill_ffn_layer_matches_reference(tiny_moe, device):
    model, w = tiny_moe
    cfg = model.config
    eng = load_triton_engine(model, device=device, max_context=16, use_graph=False)
    p = "blk.2."
    h = _layer_input(cfg, 10, 2)
    xn = rms_norm_ref(h, w[p + "post_attention_norm.weight"], cfg.rms_eps)
    out = h.clone().to(device)
    prefill_ffn(eng, p, xn.to(device).to(torch.bfloat16), out, torch.empty(10, cfg.d_ffn_shexp, device=device,
                                                                            dtype=torch.bfloat16))
    want = h + moe_ffn_ref(xn, w, p, cfg.n_expert_used)[0]
    rel = (out.cpu() - want).norm() / (want - h).norm()
    assert rel < 3e-2, rel  # bf16 operands of the prefill GEMMs


@pytest.mark.slow
def test_engine_decode_and_prefill_match_the_reference(tiny_moe, device, monkeypatch):
    import runtime.triton.decode as decode_mod

    model, w = tiny_moe
    ref = Qwen35Reference(model.config, w)
    ref.routes = []
    n = 3 if device == "cpu" else 64  # 3 tokens x 4 layers of routes under the interpreter (CI time)
    ids = torch.randint(0, model.config.vocab_size, (n,), generator=torch.Generator().manual_seed(5))
    want = ref.forward(ids, ref.new_state(), all_logits=True)
    chosen = []

    def recording(step, p):  # what the device routed, per (token, layer)
        decode_ffn(step, p)
        chosen.append(sorted(step.b.moe.ids[0].tolist()))

    monkeypatch.setattr(decode_mod, "moe_decode_ffn", recording)
    eng = load_triton_engine(model, device=device, max_context=2 * n, use_graph=False)
    got = torch.stack([eng.decode(int(t)).cpu() for t in ids])
    L = model.config.n_layers
    ref_sets = [sorted(ref.routes[layer][t].tolist()) for t in range(n) for layer in range(L)]
    same = sum(a == b for a, b in zip(chosen, ref_sets)) / len(ref_sets)
    assert same >= 0.95, same  # measured 1.0 on CPU (6 tokens; with 3, every one of the 12 routes must match)
    kl = _kl(want, got)
    # measured: mean 1.5e-3, max 8.9e-3 (the dense GEMVs' int8 x and the bf16 KV cache; routes identical)
    assert kl.mean() < 5e-3 and float((got.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.95, kl
    eng.reset()
    pre = eng.prefill(ids, all_logits=True).cpu()
    kl = _kl(want, pre)
    assert kl.mean() < 2e-2 and float((pre.argmax(-1) == want.argmax(-1)).float().mean()) >= 0.9, kl


def test_graph_decode_on_cuda_equals_eager(tiny_moe, device):
    """The MoE launches inside the captured CUDA graph give the eager step's logits."""
    if device != "cuda":
        pytest.skip("CUDA graphs need a CUDA device")
    model, _ = tiny_moe
    ids = [5, 17, 300, 4000, 9, 77]
    a = load_triton_engine(model, device=device, max_context=16, use_graph=True)
    b = load_triton_engine(model, device=device, max_context=16, use_graph=False)
    ga = torch.stack([a.decode(t).cpu() for t in ids])
    gb = torch.stack([b.decode(t).cpu() for t in ids])
    assert torch.allclose(ga, gb, atol=1e-5)



def test_reference_made_on_use_reads_the_moe_tensors_in_the_references_shapes(tiny_moe, device):
    """The 35B-A3B's reference check makes its 140 GB of fp32 weights on use from the engine's own tensors
    (bench/runtime/decode.py): every tensor the reference reads, expert stacks and router included, is one the
    engine holds, of its size; the small ones (the shared-expert gate is a [1, d] matrix in the engine, [d] in
    the reference) are gguf's dequantized values. The interpreter takes minutes for the large ones."""
    import math

    from bench.runtime.decode import reference_weights

    model, w = tiny_moe
    eng = load_triton_engine(model, device=device, max_context=8, use_graph=False)
    lazy = reference_weights(eng, on_use=True)
    held = {k: m.rows * m.cols for k, m in eng.weights.mat.items()} | {k: v.numel() for k, v in eng.weights.vec.items()}
    assert {k: math.prod(s) for k, s in lazy.shapes.items()} == {k: held[k] for k in lazy.shapes}
    assert {k: tuple(v.shape) for k, v in w.items()} == lazy.shapes
    small = [k for k in lazy if math.prod(lazy.shapes[k]) <= 4096]
    assert "blk.0.ffn_gate_inp_shexp.weight" in small
    for name in small:
        assert torch.allclose(lazy[name].cpu(), w[name], rtol=1e-5, atol=1e-6), name


def test_moe_prefill_ffn_reads_nothing_back_to_the_host(tiny_moe, device):
    """It runs in each of the 40 layers of an eager MoE prefill (the dense layers' prefill is a CUDA graph, which
    a host read could not be captured into): a read there stalls the launch queue every layer. torch.bincount in
    the expert sort read the ids' min and max, twice a layer."""
    from tests.runtime.kernels.test_moe import HostReads

    model, w = tiny_moe
    cfg = model.config
    eng = load_triton_engine(model, device=device, max_context=16, use_graph=False)
    h = _layer_input(cfg, 4, 3).to(device)
    xn = rms_norm_ref(h.cpu(), w["blk.1.post_attention_norm.weight"], cfg.rms_eps).to(device).to(torch.bfloat16)
    act = torch.empty(4, cfg.d_ffn_shexp, device=device, dtype=torch.bfloat16)
    with HostReads() as mode:
        prefill_ffn(eng, "blk.1.", xn, h, act)
    assert mode.seen == []


def test_the_default_expert_tile_folds_the_shared_expert_only_where_it_is_as_wide(tiny_moe, device):
    """The measured default (moe-35b-a3b-variants-h100-20261206T051139Z.json: 251.4 -> 406.0 tok/s) folds the shared
    expert into the routed launches, which needs it as wide as a routed expert; a model where it is not keeps the
    same dot path with the shared expert's own launches instead of failing to decode."""
    import copy
    from dataclasses import replace

    from runtime.kernels.moe_experts import DEFAULT_EXPERT_TILE

    model, _ = tiny_moe
    cfg = model.config
    dw = DeviceWeights(model, device)
    step = DecodeStep(dw, DecodeState(cfg, 8, device), DecodeBuffers(cfg, 8, device, 1))
    assert cfg.d_ffn_exp == cfg.d_ffn_shexp and step.expert_tile == DEFAULT_EXPERT_TILE
    assert DEFAULT_EXPERT_TILE.fold_shared and DEFAULT_EXPERT_TILE.path == "x8q6"
    wide = copy.copy(dw)
    wide.config = replace(cfg, d_ffn_shexp=2 * cfg.d_ffn_exp)
    other = DecodeStep(wide, step.s, step.b)
    assert other.expert_tile == replace(DEFAULT_EXPERT_TILE, fold_shared=False)
    other.expert_tile = DEFAULT_EXPERT_TILE  # asked for explicitly, the fold says why it cannot
    with pytest.raises(ValueError, match="shared expert's width"):
        decode_ffn(other, "blk.1.")
