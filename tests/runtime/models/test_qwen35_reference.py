"""The fp32 reference model against the upstream (HF transformers) logits, and its own invariants."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.models.qwen35_reference import Qwen35Reference, WeightsOnUse, check_weights
from runtime.models.random_weights import random_weights, small_config
from tests.paths import TINY


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # Tiny ops on a shared 2-core box: a second OpenMP thread only spins (3x slower under load).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


FIXTURES = TINY
needs_fixture = pytest.mark.skipif(
    not (FIXTURES / "qwen35-tiny4-f32.gguf").exists(), reason="qwen35-tiny fixture missing"
)


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def kl_top1(logits, ref):
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return float(kl.mean()), float((logits.argmax(-1) == ref.argmax(-1)).double().mean())


@pytest.fixture(scope="module")
def prompt_and_ref():
    ids = torch.from_numpy(np.load(FIXTURES / "prompt_ids.npy").astype(np.int64))
    ref = torch.from_numpy(np.load(FIXTURES / "ref_logits_hf_fp32.npy"))
    return ids, ref


@pytest.fixture(scope="module")
def f32_model():
    return Qwen35Reference.from_gguf(FIXTURES / "qwen35-tiny4-f32.gguf")


@needs_fixture
def test_batched_prefill_matches_hf(f32_model, prompt_and_ref):
    ids, ref = prompt_and_ref
    logits = f32_model(ids, f32_model.new_state(), all_logits=True)
    assert logits.shape == ref.shape and logits.dtype == torch.float32
    assert rel_err(logits, ref) <= 1e-4  # measured 8.0e-7 (llama.cpp F32: 8.8e-4)


@needs_fixture
def test_token_by_token_matches_hf(f32_model, prompt_and_ref):
    ids, ref = prompt_and_ref
    state = f32_model.new_state()
    logits = torch.stack([f32_model(ids[i : i + 1], state) for i in range(len(ids))])
    assert rel_err(logits, ref) <= 1e-4  # measured 9.7e-7 (llama.cpp F32: 1.5e-4)


@needs_fixture
def test_small_chunks_match_hf(f32_model, prompt_and_ref):
    # Uneven prefill pieces: chunk boundaries, conv state and KV offsets all move.
    ids, ref = prompt_and_ref
    state, parts = f32_model.new_state(kv_capacity=4), []
    for a, b in [(0, 5), (5, 6), (6, 40), (40, 64)]:
        parts.append(f32_model(ids[a:b], state, all_logits=True))
    assert state.position == 64
    assert rel_err(torch.cat(parts), ref) <= 1e-4


@needs_fixture
def test_q4_k_m_file_is_close_to_hf(prompt_and_ref):
    # llama.cpp on the same file: KL 0.0071, top-1 0.969. We measured KL 0.0074, top-1 0.984.
    ids, ref = prompt_and_ref
    model = Qwen35Reference.from_gguf(FIXTURES / "qwen35-tiny4-Q4_K_M.gguf")
    kl, top1 = kl_top1(model(ids, model.new_state(), all_logits=True), ref)
    assert kl < 0.015 and top1 >= 0.95


def test_random_untied_model_chunked_equals_recurrent():
    cfg = small_config()
    model = Qwen35Reference(cfg, random_weights(cfg, seed=1))
    ids = torch.randint(0, cfg.vocab_size, (150,), generator=torch.Generator().manual_seed(0))
    batched = model(ids, model.new_state(), all_logits=True, gdn_mode="chunked")
    state = model.new_state()
    stepped = torch.stack([model(ids[i : i + 1], state, gdn_mode="recurrent") for i in range(len(ids))])
    assert torch.isfinite(batched).all() and batched.std() > 0.1
    assert rel_err(batched, stepped) <= 1e-5


def test_untied_head_is_used_and_tied_reads_embedding():
    cfg = small_config()
    w = random_weights(cfg, seed=2)
    ids = torch.tensor([3, 1, 4, 1, 5])
    base = Qwen35Reference(cfg, w)(ids, Qwen35Reference(cfg, w).new_state())
    w2 = dict(w, **{"output.weight": w["output.weight"] * 2})
    m2 = Qwen35Reference(cfg, w2)
    torch.testing.assert_close(m2(ids, m2.new_state()), base * 2)
    tied_cfg = small_config(tied_embeddings=True)
    tied_w = {k: v for k, v in w.items() if k != "output.weight"}
    tied = Qwen35Reference(tied_cfg, tied_w)
    assert tied.lm_head is tied.w["token_embd.weight"]


def permute_value_heads(w, cfg, perm, layer=0):
    """Weights of GDN layer `layer` with value heads reordered: new head j is old head perm[j]."""
    p, dv, ck, hv = f"blk.{layer}.", cfg.ssm_head_dim, cfg.key_dim, cfg.n_v_head
    out = {k: v.clone() for k, v in w.items()}
    for name in ("attn_qkv.weight", "ssm_conv1d.weight"):  # only the V rows/channels move
        t = w[p + name]
        out[p + name][2 * ck :] = t[2 * ck :].view(hv, dv, -1)[perm].reshape(-1, t.shape[1])
    out[p + "attn_gate.weight"] = w[p + "attn_gate.weight"].view(hv, dv, -1)[perm].reshape(-1, cfg.d_model)
    for name in ("ssm_beta.weight", "ssm_alpha.weight", "ssm_a", "ssm_dt.bias"):
        out[p + name] = w[p + name][perm]
    out[p + "ssm_out.weight"] = w[p + "ssm_out.weight"].view(cfg.d_model, hv, dv)[:, perm].reshape(cfg.d_model, -1)
    return out


def test_value_head_mapping_is_tiled():
    # Hk = 2, Hv = 4: tiled kappa(j) = j mod 2 puts value heads 0, 2 on key head 0 and 1, 3 on key head 1.
    cfg = small_config(n_layers=1)  # one GDN layer
    w = random_weights(cfg, seed=3)
    ids = torch.arange(20)

    def run(weights):
        model = Qwen35Reference(cfg, weights)
        return model(ids, model.new_state(), all_logits=True)

    base = run(w)
    # swapping two heads of the same key head is a relabelling: exact up to rounding
    assert rel_err(run(permute_value_heads(w, cfg, torch.tensor([2, 1, 0, 3]))), base) < 1e-5
    # swapping heads across key heads (what a grouped j // R mapping would mean) changes the model
    assert rel_err(run(permute_value_heads(w, cfg, torch.tensor([0, 2, 1, 3]))), base) > 1e-2


def test_check_weights_names_the_problem():
    cfg = small_config()
    w = random_weights(cfg)
    with pytest.raises(ValueError, match="missing tensor 'blk.3.attn_q.weight'"):
        check_weights(cfg, {k: v for k, v in w.items() if k != "blk.3.attn_q.weight"})
    bad = dict(w, **{"blk.0.ssm_a": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"'blk.0.ssm_a' has shape \[3\], expected \[4\]"):
        check_weights(cfg, bad)


def test_weights_made_on_use_give_the_same_logits_and_are_never_kept():
    """A 27B reference cannot hold its 108 GB of fp32 weights beside the engine: made on use, each forward
    makes every tensor again (none is kept between forwards) and the logits are the resident ones."""
    from runtime.gguf.names import expected_tensors

    cfg = small_config()
    w = random_weights(cfg)
    made: list[str] = []
    lazy = WeightsOnUse(expected_tensors(cfg), lambda name: made.append(name) or w[name].flatten().clone())
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    want = Qwen35Reference(cfg, w)
    ref = Qwen35Reference(cfg, lazy)
    assert ref.weights_held == "made on use" and want.weights_held == "resident"
    assert ref.weights_bytes == want.weights_bytes
    made.clear()
    first = ref(ids, ref.new_state(), all_logits=True)
    per_forward = sorted(made)
    made.clear()
    second = ref(ids, ref.new_state(), all_logits=True)
    assert sorted(made) == per_forward and len(per_forward) >= len(expected_tensors(cfg)) - 1  # the head is held
    assert torch.equal(first, second)
    assert torch.equal(first, want(ids, want.new_state(), all_logits=True))


def test_weights_made_on_use_are_checked_like_resident_ones():
    from runtime.gguf.names import expected_tensors

    cfg = small_config()
    w = random_weights(cfg)
    shapes = expected_tensors(cfg)
    with pytest.raises(ValueError, match="'blk.0.ssm_a' declared"):
        check_weights(cfg, WeightsOnUse(dict(shapes, **{"blk.0.ssm_a": (3,)}), w.__getitem__))
    with pytest.raises(ValueError, match="'blk.3.attn_q.weight' declared None"):
        check_weights(cfg, WeightsOnUse({k: v for k, v in shapes.items() if k != "blk.3.attn_q.weight"}, w.__getitem__))
    short = WeightsOnUse(shapes, lambda name: w[name].flatten()[:-1])
    with pytest.raises(ValueError, match="made .* values"):
        short["blk.0.attn_norm.weight"]


def test_gdn_mode_validated():
    cfg = small_config()
    model = Qwen35Reference(cfg, random_weights(cfg))
    with pytest.raises(ValueError, match="gdn_mode"):
        model(torch.tensor([1]), model.new_state(), gdn_mode="fast")
