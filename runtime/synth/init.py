"""Weight initialisation that makes a synthetic Qwen3.5 behave like a trained model.

Random weights give near-uniform logits and chaotic depth, so accuracy checks on them say
little.  These models instead implement a small "n-gram" language model on top of
ordinary random layers:

* **Bias channel.** Coordinate 0 of every embedding row is a constant `bias_value` (real LLMs
  carry such a "massive activation").  After each RMSNorm it gives every projection a
  constant input, i.e. a bias, which lets the layers below build constant gates, keys and
  queries without bias tensors.
* **Successor structure in the embedding.** Token ids form orbits of `orbit` tokens; the
  successor π(t) of token t is the next id in its orbit, and E[π(t)] = P·E[t] where P is a
  fixed coordinate permutation.  "Predict the successor" is therefore a linear map.
* **Bigram FFN (layer 0).** Its gate reads only the bias channel, so SwiGLU is linear here:
  FFN(x) = (bigram_gain·P − cancel·I)·x.  It replaces most of the current token's embedding by
  its successor's, so the argmax is not the input token.
* **Recency DeltaNet layer.** Constant keys/queries and constant β, decay: the delta rule
  becomes an exponential moving average over the previous tokens' values (conv tap = the
  previous token), written back along the same directions: candidates π(t_{p-1}), π(t_{p-2}) …
* **Offset attention layer.** Constant q/k through partial RoPE make every head attend to the
  token `offset` positions back (a relative-position kernel from the rotary frequencies);
  the value/output projections copy that token's content: candidate π(t_{p-offset}).
* **Context field DeltaNet layer.** The same EMA construction with a long memory, written
  back through a fixed random rotation: a context-dependent Gaussian-like field over the
  vocabulary that favours no token by construction (the bulk of the logit spread).
* **Background.** Every other matrix is random, input projections N(0, 1/fan_in) and output
  projections N(0, bg²/(fan_in·2L)), GDN gates/decays drawn like the upstream initialiser.
  They perturb the logits with context-dependent noise as real layers do.

* **MoE (qwen35moe).** The bigram map of layer 0 goes through the shared expert (a rank-min(F, d)
  projection of it when the shared width F < d), its sigmoid gate held near 1 through the bias
  channel; the routed experts are background layers whose router has per-expert popularities
  (hot experts) plus a token-dependent part (see InitSpec.router_hot / router_spread).

All dense structured matrices are rotated by random orthonormal bases, so every quantized
tensor looks Gaussian-like to the quantizers.  Every tensor is a deterministic function of
(seed, tensor name); random numbers are drawn on the CPU so bytes do not depend on the device.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..config import ModelConfig

BIAS = 0  # residual coordinate carrying the constant "bias" activation


@dataclass(frozen=True)
class InitSpec:
    """Knobs, mostly as target z-scores: a token's logit minus the mean, over the logit std.

    A component of rms `a` along token s's embedding direction gives s the z-score
    √d·a/H (H: rms of the final residual), so gains are derived from these targets and d."""

    bias_value: float = 4.0  # embedding value at coordinate BIAS
    orbit: int = 8  # tokens per successor orbit
    z_self: float = 1.5  # what is left of the current token's own logit
    z_bigram: float = 6.0  # successor of the current token
    z_recent: float = 4.5  # successor of the previous token (EMA, decay recent_decay)
    recent_decay: float = 0.3
    z_offset: float = 4.5  # successor of the token `offset` back
    offset: int = 8
    offset_sharpness: float = 3.0  # q/k norm gain: larger = sharper attention peak
    field: float = 3.0  # rms of the rotated context field (long EMA), the bulk of the residual
    field_decay: float = 0.9
    background: float = 1.0  # output scale of the random layers (1 = N(0, 1/(fan_in·2L)))
    logit_std: float = 4.0  # sets the output_norm gain
    jitter: float = 0.05  # random admixture to structured rows (keeps them Gaussian-like)
    untied_noise: float = 0.1  # output.weight = token_embd + this much noise (untied shapes)
    # MoE router (qwen35moe): logit of expert e = popularity_e + a token-dependent part. A trained
    # router is neither uniform nor collapsed: a few experts are hot for most tokens, the choice still
    # depends on the token. router_hot = std of the per-expert popularity (via the bias channel),
    # router_spread = std of the token-dependent logits (normed input of rms 1).
    router_hot: float = 1.0
    router_spread: float = 1.5


DEFAULT = InitSpec()


# -- deterministic randomness ---------------------------------------------------------------


def _generator(seed: int, key: str) -> torch.Generator:
    digest = hashlib.sha256(f"tokengate-synth:{seed}:{key}".encode()).digest()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def randn(seed: int, key: str, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_generator(seed, key), dtype=torch.float32)


def rand(seed: int, key: str, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_generator(seed, key), dtype=torch.float32)


@lru_cache(maxsize=8)
def orthonormal(seed: int, key: str, rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] with orthonormal columns (rows ≥ cols) or rows (rows < cols), fp64 QR on CPU."""
    tall = rows >= cols
    a = randn(seed, key, max(rows, cols), min(rows, cols)).double()
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r))  # unique QR → deterministic basis
    q = q.float()
    return q if tall else q.T.contiguous()


# -- layer roles and gains ------------------------------------------------------------------


def roles(cfg: ModelConfig) -> dict[str, int]:
    """Which layer plays which structured part (the rest are background layers)."""
    attn, gdn = cfg.attention_layers, cfg.deltanet_layers
    after = [i for i in gdn if i > attn[0]]
    return {"bigram_ffn": 0, "recent_gdn": gdn[1], "offset_attn": attn[0], "field_gdn": after[0] if after else gdn[-1]}


@dataclass(frozen=True)
class Gains:
    keep: float  # fraction of E[t] left after layer 0
    bigram: float
    recent: float  # output rms of the recency layer
    offset: float
    field: float  # output rms of the field layer
    final: float
    rms_in: dict  # expected residual rms (coordinates ≠ BIAS) entering each structured layer


def gains(cfg: ModelConfig, spec: InitSpec) -> Gains:
    d = cfg.d_model
    r = roles(cfg)
    bg = spec.background * 0.08  # rms of one background branch output (measured, ≈ 1/sqrt(2L)·…)
    h = math.sqrt(spec.field**2 + (2 * cfg.n_layers) * bg**2 + 1)  # final residual rms
    unit = h / math.sqrt(d)  # amplitude that gives z = 1
    keep, big = spec.z_self * unit, spec.z_bigram * unit
    r1 = math.sqrt(keep**2 + big**2 + 2 * bg**2)  # entering the recency layer
    proj_v = min(cfg.value_dim, d) / d
    share1 = math.sqrt(1 - spec.recent_decay**2)  # the newest term of the normalised EMA
    recent = spec.z_recent * unit / (share1 * (big / r1) * proj_v)
    r3 = math.sqrt(r1**2 + recent**2 + 3 * bg**2)  # entering the offset-attention layer
    offset = spec.z_offset * unit / ((big / r3) * min(cfg.kv_proj_dim, d) / d)
    r4 = math.sqrt(r3**2 + (offset * math.sqrt(min(cfg.kv_proj_dim, d) / d)) ** 2 + 2 * bg**2)
    rms_in = {r["recent_gdn"]: r1, r["offset_attn"]: r3, r["field_gdn"]: r4, r["bigram_ffn"]: 1.0}
    return Gains(keep, big, recent, offset, spec.field, spec.logit_std / math.sqrt(d), rms_in)


# -- embedding with successor structure -----------------------------------------------------


def coord_perm(cfg: ModelConfig, spec: InitSpec) -> torch.Tensor:
    """P as an index map: (P x)[i] = x[perm[i]], of order dividing `orbit`, fixing BIAS.

    Coordinates 1… are cut into cycles of length `orbit` (the remainder into cycles of the
    largest powers of two that fit), so P^orbit = I and P^k (0<k<orbit) moves almost every
    coordinate."""
    d = cfg.d_model
    perm = list(range(d))
    i, m = 1, spec.orbit
    while i < d:
        n = m
        while n > d - i:
            n //= 2
        cyc = list(range(i, i + n))
        for a, b in zip(cyc, cyc[1:] + cyc[:1]):
            perm[a] = b
        i += n
    return torch.tensor(perm)


def successor(token_ids: torch.Tensor, orbit: int) -> torch.Tensor:
    return token_ids - token_ids % orbit + (token_ids + 1) % orbit


def embedding_rows(cfg: ModelConfig, seed: int, spec: InitSpec, start: int, stop: int, key="token_embd") -> torch.Tensor:
    """Rows [start, stop) of the embedding; start/stop multiples of `orbit` (whole orbits)."""
    m = spec.orbit
    assert start % m == 0 and (stop % m == 0 or stop == cfg.vocab_size)
    perm = coord_perm(cfg, spec)
    base = randn(seed, f"{key}:orbits:{start}", (stop - start + m - 1) // m, cfg.d_model)
    rows = [base]
    for _ in range(m - 1):
        rows.append(rows[-1][:, perm])  # E[π(t)] = P E[t]
    e = torch.stack(rows, 1).reshape(-1, cfg.d_model)[: stop - start]
    e[:, BIAS] = spec.bias_value
    return e


# -- helpers --------------------------------------------------------------------------------


def _out_std(cfg: ModelConfig, fan_in: int, spec: InitSpec) -> float:
    return spec.background / math.sqrt(fan_in * 2 * cfg.n_layers)


def _bias_in(cfg: ModelConfig, spec: InitSpec, rms: float = 1.0) -> float:
    """Expected normed input at BIAS for a residual whose other coordinates have this rms."""
    return spec.bias_value / math.sqrt(rms**2 + spec.bias_value**2 / cfg.d_model)


def _jittered(seed, key, rows, cols, spec) -> torch.Tensor:
    return randn(seed, key + ":jitter", rows, cols) * (spec.jitter / math.sqrt(cols))


# -- the tensors ----------------------------------------------------------------------------


CHUNK_ELEMS = 1 << 23  # row chunks of random matrices are seeded separately (fixed by shape)


def rows_per_chunk(shape: tuple[int, ...], orbit: int) -> int:
    cols = shape[-1] if len(shape) > 1 else 1
    r = max(1, CHUNK_ELEMS // cols)
    return max(orbit, r - r % orbit)


def _is_embedding(name: str) -> bool:
    return name in ("token_embd.weight", "output.weight")


def is_expert_stack(name: str) -> bool:
    """A 3-D [n_expert, out, in] stack of routed experts (made in chunks of whole experts)."""
    return name.endswith("_exps.weight")


def experts_per_chunk(shape: tuple[int, ...]) -> int:
    return max(1, CHUNK_ELEMS // (shape[1] * shape[2]))


def chunk_rows(name: str, shape: tuple[int, ...], spec: InitSpec = DEFAULT) -> int:
    """Leading-dim rows (embedding rows, or experts) per chunk of a chunked tensor."""
    return experts_per_chunk(shape) if is_expert_stack(name) else rows_per_chunk(shape, spec.orbit)


def chunk_count(name: str, shape: tuple[int, ...], spec: InitSpec = DEFAULT) -> int:
    """How many row chunks `generate` yields for `name` (each one can be made on its own)."""
    if not (_is_embedding(name) or is_expert_stack(name)):
        return 1
    return -(-shape[0] // chunk_rows(name, shape, spec))


def generate_chunk(name: str, shape: tuple[int, ...], cfg: ModelConfig, seed: int, spec: InitSpec, index: int) -> torch.Tensor:
    """Chunk `index` of `generate(name, …)`: a pure function of (seed, name, index)."""
    if _is_embedding(name):
        step = rows_per_chunk(shape, spec.orbit)
        s = index * step
        e = embedding_rows(cfg, seed, spec, s, min(s + step, shape[0]))
        if name == "output.weight":
            e = e + randn(seed, f"output:{s}", *e.shape) * spec.untied_noise
        return e
    if is_expert_stack(name):
        step = experts_per_chunk(shape)
        e0 = index * step
        return _expert_rows(name, shape, cfg, seed, spec, e0, min(e0 + step, shape[0]))
    assert index == 0, f"{name} is made in one piece"
    if name == "output_norm.weight":
        return torch.full(shape, gains(cfg, spec).final)
    layer = int(name.split(".")[1])
    leaf = name.split(".", 2)[2]
    return _layer_tensor(layer, leaf, shape, cfg, seed, spec)


def generate(name: str, shape: tuple[int, ...], cfg: ModelConfig, seed: int, spec: InitSpec = DEFAULT) -> Iterator[torch.Tensor]:
    """The fp32 values of tensor `name`, as consecutive row chunks (a 1-D tensor in one piece)."""
    for index in range(chunk_count(name, shape, spec)):
        yield generate_chunk(name, shape, cfg, seed, spec, index)


def uses_basis(name: str, cfg: ModelConfig) -> bool:
    """Whether `name` is built from an `orthonormal` basis.

    LAPACK's QR result depends on the number of intra-op threads (measured: 1 and 2 threads
    give different 4096x4096 bases), so these tensors must be made at the caller's thread
    count to keep the bytes of earlier files; the parallel factory makes them up front."""
    if not name.startswith("blk."):
        return False
    i, leaf = int(name.split(".")[1]), name.split(".", 2)[2]
    r = roles(cfg)
    if i == r["bigram_ffn"] and leaf in ("ffn_up.weight", "ffn_down.weight", "ffn_up_shexp.weight",
                                         "ffn_down_shexp.weight"):
        return True
    if i in (r["recent_gdn"], r["field_gdn"]) and leaf in ("attn_qkv.weight", "ssm_out.weight"):
        return True
    return i == r["offset_attn"] and leaf in ("attn_v.weight", "attn_output.weight")


def _layer_tensor(i: int, leaf: str, shape, cfg: ModelConfig, seed: int, spec: InitSpec) -> torch.Tensor:
    key = f"blk.{i}.{leaf}"
    r = roles(cfg)
    if leaf in ("attn_norm.weight", "post_attention_norm.weight"):
        return torch.ones(shape)
    if leaf in ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight"):
        return _router(i, leaf, shape, cfg, seed, spec)
    if i == r["bigram_ffn"] and leaf in _SHEXP:
        return _bigram_ffn(i, _SHEXP[leaf], cfg, seed, spec, width=cfg.d_ffn_shexp, gate=_shexp_gate_value())
    if i == r["bigram_ffn"] and leaf.startswith("ffn_") and not cfg.is_moe:
        return _bigram_ffn(i, leaf, cfg, seed, spec)
    if i == r["recent_gdn"] and not leaf.startswith("ffn_"):
        g = gains(cfg, spec)
        return _ema_gdn(i, leaf, shape, cfg, seed, spec, spec.recent_decay, tap=2, gain=g.recent, rotate=False)
    if i == r["field_gdn"] and not leaf.startswith("ffn_"):
        g = gains(cfg, spec)
        return _ema_gdn(i, leaf, shape, cfg, seed, spec, spec.field_decay, tap=3, gain=g.field, rotate=True)
    if i == r["offset_attn"] and not leaf.startswith("ffn_"):
        return _offset_attn(i, leaf, shape, cfg, seed, spec)
    return _background(i, leaf, shape, cfg, seed, spec)


def _background(i, leaf, shape, cfg: ModelConfig, seed, spec) -> torch.Tensor:
    key = f"blk.{i}.{leaf}"
    if leaf in ("attn_q_norm.weight", "attn_k_norm.weight", "ssm_norm.weight"):
        return torch.ones(shape)
    if leaf == "ssm_conv1d.weight":  # upstream conv1d init: U(-1/sqrt(k), 1/sqrt(k))
        return (rand(seed, key, *shape) * 2 - 1) / math.sqrt(cfg.conv_kernel)
    if leaf == "ssm_a":  # -exp(A_log), A ~ U[1, 16]
        return -(1 + 15 * rand(seed, key, *shape))
    if leaf == "ssm_dt.bias":  # inverse softplus of dt ~ logU[1e-3, 1e-1]
        dt = torch.exp(math.log(1e-3) + rand(seed, key, *shape) * (math.log(1e-1) - math.log(1e-3)))
        return dt + torch.log(-torch.expm1(-dt))
    out_proj = leaf in ("attn_output.weight", "ssm_out.weight", "ffn_down.weight", "ffn_down_shexp.weight")
    fan_in = shape[-1]
    std = _out_std(cfg, fan_in, spec) if out_proj else 1 / math.sqrt(fan_in)
    return randn(seed, key, *shape) * std


def _bigram_ffn(i, leaf, cfg: ModelConfig, seed, spec, *, width: int | None = None, gate: float = 1.0) -> torch.Tensor:
    """SwiGLU with a constant gate: down·(silu(c)·up·x) = (g·P − cancel·I) x on coordinates ≠ BIAS.

    `width` < d makes it the map restricted to a random width-dim subspace; `gate` is a constant
    factor the output is multiplied by afterwards (the MoE shared expert's sigmoid gate), undone here."""
    d, f = cfg.d_model, cfg.d_ffn if width is None else width
    gate_pre = 4.0  # silu(4) ≈ 3.93: gate value, nearly linear region irrelevant (constant)
    if leaf == "ffn_gate.weight":
        w = _jittered(seed, f"blk.{i}.ffn_gate", f, d, spec)
        w[:, BIAS] += gate_pre / _bias_in(cfg, spec)
        return w
    q = orthonormal(seed, f"blk.{i}.ffn_basis", f, d)  # [f, d], qᵀq = I
    if leaf == "ffn_up.weight":
        u = q.clone()
        u[:, BIAS] = 0
        return u
    # ffn_down: M qᵀ / silu(gate)
    perm = coord_perm(cfg, spec)
    m = torch.zeros(d, d)
    idx = torch.arange(d)
    g = gains(cfg, spec)
    m[idx, perm] += g.bigram
    m[idx, idx] -= 1 - g.keep
    m[BIAS, :] = 0
    m[:, BIAS] = 0
    silu = gate_pre / (1 + math.exp(-gate_pre))
    return (m @ q.T) / (silu * gate)


# -- MoE (qwen35moe) ---------------------------------------------------------------------------

_SHEXP = {"ffn_gate_shexp.weight": "ffn_gate.weight", "ffn_up_shexp.weight": "ffn_up.weight",
          "ffn_down_shexp.weight": "ffn_down.weight"}
SHEXP_GATE_PRE = 4.0  # layer 0's shared-expert gate logit: sigmoid(4) ≈ 0.98


def _shexp_gate_value() -> float:
    return 1 / (1 + math.exp(-SHEXP_GATE_PRE))


def _router(i, leaf, shape, cfg: ModelConfig, seed, spec) -> torch.Tensor:
    """ffn_gate_inp [E, d]: token-dependent logits of std router_spread plus a per-expert popularity
    of std router_hot read from the bias channel. ffn_gate_inp_shexp [d]: the shared expert's gate,
    near 1 in the bigram layer (it carries the bigram map), else sigmoid of a random projection."""
    key = f"blk.{i}.{leaf}"
    d = cfg.d_model
    if leaf == "ffn_gate_inp_shexp.weight":
        w = randn(seed, key, d) / math.sqrt(d)
        if i == roles(cfg)["bigram_ffn"]:
            w = w * spec.jitter
            w[BIAS] = SHEXP_GATE_PRE / _bias_in(cfg, spec)
        else:
            w[BIAS] = 0.0
        return w
    w = randn(seed, key, *shape) * (spec.router_spread / math.sqrt(d))
    w[:, BIAS] = randn(seed, key + ":popularity", shape[0]) * (spec.router_hot / _bias_in(cfg, spec))
    return w


def _expert_rows(name: str, shape, cfg: ModelConfig, seed, spec, e0: int, e1: int) -> torch.Tensor:
    """Experts [e0, e1) of a routed stack: background SwiGLU experts (inputs N(0, 1/d), outputs at the
    background output scale), each chunk seeded on its own."""
    key = f"{name}:{e0}"
    w = randn(seed, key, e1 - e0, *shape[1:])
    if name.endswith("ffn_down_exps.weight"):
        return w * _out_std(cfg, shape[-1], spec)
    return w / math.sqrt(shape[-1])


def _const_rows(n: int, value: float, cfg: ModelConfig, seed, key, spec, rms: float = 1.0) -> torch.Tensor:
    """n rows reading only the bias channel (value/bias_in ⇒ output ≈ value), plus jitter."""
    w = _jittered(seed, key, n, cfg.d_model, spec)
    w[:, BIAS] += value / _bias_in(cfg, spec, rms)
    return w


def _ema_gdn(i, leaf, shape, cfg: ModelConfig, seed, spec, decay, *, tap, gain, rotate) -> torch.Tensor:
    """Delta rule with constant k = q and constant β, decay: the state is k mᵀ with
    m_t = ρ m_{t-1} + β v_t (ρ = λ(1-β)), v_t = the normed residual at t-3+tap.  The output
    writes m (RMS-normalised per head) back along the same directions, or rotated by a fixed
    random orthogonal map (a context "field" that favours no particular token)."""
    d, ck, cv = cfg.d_model, cfg.key_dim, cfg.value_dim
    key = f"blk.{i}.{leaf}"
    rms = gains(cfg, spec).rms_in[i]
    beta = min(0.5, (1 - decay) / 2)
    lam = decay / (1 - beta)

    def value_basis() -> torch.Tensor:  # [cv, d]; only the two tensors that use it pay for the QR
        vb = orthonormal(seed, f"blk.{i}.gdn_vbasis", max(cv, d), min(cv, d))
        return vb if cv >= d else vb.T

    if leaf == "attn_qkv.weight":
        qk = _const_rows(2 * ck, 1.0, cfg, seed, key + ":qk", spec, rms)
        v = value_basis().clone() * (0.1 / rms)  # small: SiLU after the conv stays close to linear
        v[:, BIAS] = 0
        return torch.cat([qk, v])
    if leaf == "ssm_conv1d.weight":
        w = torch.zeros(shape)
        w[: 2 * ck, 3] = 1.0
        w[2 * ck :, tap] = 1.0
        return w
    if leaf == "attn_gate.weight":
        return _const_rows(cv, 3.0, cfg, seed, key, spec, rms)
    if leaf == "ssm_beta.weight":
        return _const_rows(cfg.n_v_head, math.log(beta / (1 - beta)), cfg, seed, key, spec, rms)
    if leaf == "ssm_alpha.weight":
        return _jittered(seed, key, *shape, spec) * 0.1
    if leaf == "ssm_a":  # g = ssm_a · softplus(dt_bias) = log λ  (softplus(1) = log(1+e))
        return torch.full(shape, math.log(lam) / math.log1p(math.e))
    if leaf == "ssm_dt.bias":
        return torch.ones(shape)
    if leaf == "ssm_norm.weight":
        return torch.ones(shape)
    if leaf == "ssm_out.weight":
        # y per head ≈ RMS-normalised m times silu(3): rms per channel silu(3).
        silu_z = 3.0 / (1 + math.exp(-3.0))
        w = value_basis().T.clone() * (gain * math.sqrt(d / cv) / silu_z)  # [d, cv]: output rms = gain
        if rotate:
            w = orthonormal(seed, f"blk.{i}.field_rotation", d, d) @ w
        w[BIAS, :] = 0
        return w
    raise KeyError(leaf)


def _rope_profile(cfg: ModelConfig, spec: InitSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k head vectors (pre-norm) whose dot product after RoPE peaks at distance `offset`."""
    dh, r = cfg.head_dim, cfg.rope_dims
    half = r // 2
    theta = cfg.rope_base ** (-torch.arange(half, dtype=torch.float64) * 2 / r)
    amp = torch.zeros(half, dtype=torch.float64)
    n_fast = 6  # frequencies that resolve single-token distances
    amp[:n_fast] = 1.0
    q = torch.zeros(dh, dtype=torch.float64)
    k = torch.zeros(dh, dtype=torch.float64)
    phi = -spec.offset * theta  # q·R(Δ)k ∝ Σ a_i cos(Δθ_i + φ_i), maximal at Δ = offset
    k[:half] = amp
    q[:half] = amp * torch.cos(phi)
    q[half:r] = amp * torch.sin(phi)
    return q.float(), k.float()


def _offset_attn(i, leaf, shape, cfg: ModelConfig, seed, spec) -> torch.Tensor:
    d, dh, hq, hkv = cfg.d_model, cfg.head_dim, cfg.n_head, cfg.n_kv_head
    key = f"blk.{i}.{leaf}"
    qv, kv = _rope_profile(cfg, spec)
    if leaf == "attn_q.weight":  # per head [q | gate]
        w = _jittered(seed, key, 2 * hq * dh, d, spec)
        b = _bias_in(cfg, spec, gains(cfg, spec).rms_in[i])
        for h in range(hq):
            w[2 * h * dh : 2 * h * dh + dh, BIAS] += qv / b
            w[2 * h * dh + dh : 2 * h * dh + 2 * dh, BIAS] += 4.0 / b  # gate σ(4) ≈ 0.98
        return w
    if leaf == "attn_k.weight":
        w = _jittered(seed, key, hkv * dh, d, spec)
        for j in range(hkv):
            w[j * dh : (j + 1) * dh, BIAS] += kv / _bias_in(cfg, spec)
        return w
    if leaf in ("attn_q_norm.weight", "attn_k_norm.weight"):
        # RMSNorm over 256 dims of which 6 pairs carry the profile; the gain sets the score scale.
        return torch.full(shape, spec.offset_sharpness)
    nv = hkv * dh
    basis = orthonormal(seed, f"blk.{i}.attn_vbasis", d, min(nv, d))  # [d, nv] orthonormal columns
    if leaf == "attn_v.weight":
        v = basis[:, :nv].T.clone()  # [nv, d]
        v[:, BIAS] = 0
        return v
    if leaf == "attn_output.weight":  # average the G query heads of each KV group, undo the gate
        g = hq // hkv
        sig = 1 / (1 + math.exp(-4.0))
        w = torch.zeros(d, hq * dh)
        for h in range(hq):
            j = h // g
            w[:, h * dh : (h + 1) * dh] = basis[:, j * dh : (j + 1) * dh] / (g * sig)
        w = w * gains(cfg, spec).offset
        w[BIAS, :] = 0
        return w
    raise KeyError(leaf)
