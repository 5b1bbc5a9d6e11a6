"""Write tests/fixtures/qwen35moe/hf_moe_block.npz: HF transformers' own Qwen3.5-MoE sparse MoE block
(Qwen3_5MoeSparseMoeBlock) on random weights and inputs, with the weights under llama.cpp's GGUF names.

An outside check of runtime/models/moe_ref.py (routing, renormalisation, expert layout, shared-expert
gate). Needs `transformers` (>= 5.17, which has qwen3_5_moe); CI only reads the .npz it writes.
The HF -> GGUF tensor mapping is convert_hf_to_gguf's (Qwen2MoeModel.modify_tensors: gate_up_proj
[E, 2F, d] split into gate [:F] and up [F:]; down_proj [E, d, F] as is; shared_expert_gate [1, d]).

    python scripts/moe_hf_block_fixture.py [out.npz]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "qwen35moe" / "hf_moe_block.npz"
D, E, K, FE, FS, T = 64, 8, 2, 32, 48, 12


def main(out: Path = OUT) -> None:
    import transformers
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

    cfg = Qwen3_5MoeTextConfig(hidden_size=D, num_experts=E, num_experts_per_tok=K, moe_intermediate_size=FE,
                               shared_expert_intermediate_size=FS, hidden_act="silu")
    torch.manual_seed(0)
    block = Qwen3_5MoeSparseMoeBlock(cfg).float().eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape) * (1.0 if name == "gate.weight" else 0.2))
        x = torch.randn(1, T, D)
        y = block(x)[0]
    ex = block.experts
    f = ex.gate_up_proj.shape[1] // 2
    tensors = {
        "ffn_gate_inp.weight": block.gate.weight,
        "ffn_gate_exps.weight": ex.gate_up_proj[:, :f],
        "ffn_up_exps.weight": ex.gate_up_proj[:, f:],
        "ffn_down_exps.weight": ex.down_proj,
        "ffn_gate_inp_shexp.weight": block.shared_expert_gate.weight[0],
        "ffn_gate_shexp.weight": block.shared_expert.gate_proj.weight,
        "ffn_up_shexp.weight": block.shared_expert.up_proj.weight,
        "ffn_down_shexp.weight": block.shared_expert.down_proj.weight,
    }
    arrays = {"blk.0." + n: t.detach().numpy().astype(np.float32) for n, t in tensors.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, x=x[0].numpy(), y=y.detach().numpy(), k=np.int32(K),
                        transformers_version=np.array(transformers.__version__), **arrays)
    print(f"wrote {out} (transformers {transformers.__version__})")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
