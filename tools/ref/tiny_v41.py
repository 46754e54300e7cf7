"""tiny_v41.py - a small random DeepSeek-V4.1 checkpoint, written in Python for the self-checks.

Owns: the tiny-v41 config (the shapes of `dsv4 gen --preset tiny-v41`, /work/notes/tiny_v41.md
as agreed between helpers: 8 main layers of every kind, 2 DSpark stages) and a checkpoint of
random weights in the release's formats and official tensor names: FP8 e4m3 with an e8m0 scale
per 32x32 block, FP4 experts with an e8m0 scale per 32 inputs, Engram tables FP8 with a scale per
32 values of a row, BF16 / F32 elsewhere; plus engram_token_map.json.

Why here: test_ref.py needs a V4.1 checkpoint without a C engine that writes one; values are
quantised from Gaussians scaled by 1/sqrt(fan-in) so that activations keep unit scale.
"""

import json
import os

import numpy as np
import torch

import engram_ref
import numerics as nx
import st

F64 = torch.float64


def text_config():
    """text_config of tiny-v41 (HF names)."""
    d = dict(
        vocab_size=2048, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, head_dim=64,
        qk_rope_head_dim=32, q_lora_rank=128, o_groups=2, o_lora_rank=64, sliding_window=16,
        index_n_heads=4, index_head_dim=64, index_topk=4,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=128,
        scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, norm_topk_prob=True, swiglu_limit=10.0,
        gate_temp=1.25, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-20,
        rope_theta=10000, compress_rope_theta=160000, max_position_embeddings=4096,
        rope_scaling=dict(rope_type="yarn", factor=16, original_max_position_embeddings=65536,
                          beta_fast=32, beta_slow=1),
        compress_ratios=[0, 0, 2, 2, 1, 1, 1, 0, 0, 0],
        kv_source_layer_ids=[2, 4], index_source_layer_ids=[2, 4, 5],
        candidate_source_layer_id=4, candidate_topk_blocks=3, candidate_block_size=2,
        engram_layer_ids=[1, 5], engram_max_ngram_size=3, engram_n_heads=2, engram_head_dim=64,
        engram_vocab_size=1000, engram_pad_token_id=2, engram_compressed_vocab_size=1536,
        num_nextn_predict_layers=2, dspark_block_size=3, dspark_noise_token_id=3,
        dspark_target_layer_ids=[3, 5, 7], dspark_markov_rank=32, dspark_n_routed_experts=4,
        dspark_num_experts_per_tok=2)
    pr = engram_ref.primes(2, d["engram_max_ngram_size"], d["engram_n_heads"], d["engram_vocab_size"])
    d["engram_num_embeddings"] = [sum(p) for p in pr]
    return d


def full_config():
    return {"architectures": ["DeepseekV41ForCausalLM"], "model_type": "deepseek_v41",
            "bos_token_id": 0, "eos_token_id": 1,
            "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                    "weight_block_size": [32, 32], "scale_fmt": "ue8m0",
                                    "expert_dtype": "fp4"},
            "text_config": text_config()}


# ----------------------------------------------------------------------------- encoders


def _pow2_exp(amax, qmax):
    """Exponent e of the power-of-two scale 2^e that fits amax into qmax."""
    return np.ceil(np.log2(np.maximum(amax, 1e-30) / qmax)).astype(np.int64)


class Writer:
    """Random tensors in the release formats, collected for st.write_file."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.out = {}

    def randn(self, *shape, std=1.0):
        return torch.randn(*shape, generator=self.g, dtype=F64) * std

    def bf16(self, name, v):
        self.out[name] = ("BF16", nx.bf16_bits(v))

    def f32(self, name, v):
        self.out[name] = v.to(torch.float32).numpy()

    def fp8(self, name, out_f, in_f, std=None):
        """FP8 linear prefix.weight [out, in] e4m3 + prefix.scale e8m0 per 32x32 block."""
        w = self.randn(out_f, in_f, std=std or in_f ** -0.5).numpy()
        bo, bi = -(-out_f // 32), -(-in_f // 32)
        pad = np.zeros((bo * 32, bi * 32))
        pad[:out_f, :in_f] = np.abs(w)
        e = _pow2_exp(pad.reshape(bo, 32, bi, 32).max(axis=(1, 3)), 448.0)
        s = np.repeat(np.repeat(np.ldexp(1.0, e), 32, 0), 32, 1)[:out_f, :in_f]
        q = nx.round_e4m3(torch.from_numpy(w / s))
        self.out[name + ".weight"] = ("F8_E4M3", nx.e4m3_codes(q))
        self.out[name + ".scale"] = ("F8_E8M0", (e + 127).astype(np.uint8))

    def fp8_rows(self, name, rows, d):
        """FP8 table prefix.weight [rows, d] + e8m0 prefix.scale [rows, d/32] (a scale per 32)."""
        w = self.randn(rows, d).numpy()
        e = _pow2_exp(np.abs(w).reshape(rows, d // 32, 32).max(-1), 448.0)
        q = nx.round_e4m3(torch.from_numpy(w / np.repeat(np.ldexp(1.0, e), 32, 1)))
        self.out[name + ".weight"] = ("F8_E4M3", nx.e4m3_codes(q))
        self.out[name + ".scale"] = ("F8_E8M0", (e + 127).astype(np.uint8))

    def fp4(self, name, out_f, in_f):
        """FP4 expert linear: I8 [out, in/2] (low nibble = even input) + e8m0 [out, in/32]."""
        w = self.randn(out_f, in_f, std=in_f ** -0.5).numpy()
        e = _pow2_exp(np.abs(w).reshape(out_f, in_f // 32, 32).max(-1), 6.0)
        q = nx.round_e2m1(torch.from_numpy(w / np.repeat(np.ldexp(1.0, e), 32, 1)))
        c = nx.e2m1_codes(q)
        self.out[name + ".weight"] = (c[:, 0::2] | (c[:, 1::2] << 4)).view(np.int8)
        self.out[name + ".scale"] = ("F8_E8M0", (e + 127).astype(np.uint8))

    def norm(self, name, d):
        self.bf16(name + ".weight", 1 + self.randn(d, std=0.1))


# ----------------------------------------------------------------------------- the layers


def attention(w, c, pre, kind_src, kind_idx, ratio):
    dim, H, D, qr = c["hidden_size"], c["num_attention_heads"], c["head_dim"], c["q_lora_rank"]
    G, R = c["o_groups"], c["o_lora_rank"]
    a = pre + "attn."
    w.f32(a + "attn_sink", w.randn(H, std=0.5))
    w.fp8(a + "wq_a", qr, dim)
    w.norm(a + "q_norm", qr)
    w.fp8(a + "wq_b", H * D, qr)
    w.fp8(a + "wkv", D, dim)
    w.norm(a + "kv_norm", D)
    w.fp8(a + "wo_a", G * R, H * D // G)
    w.fp8(a + "wo_b", dim, G * R)
    if kind_src:
        w.bf16(a + "compressor.wkv.weight", w.randn(D, dim, std=dim ** -0.5))
        if ratio > 1:
            w.bf16(a + "compressor.wgate.weight", w.randn(D, dim, std=dim ** -0.5))
        w.norm(a + "compressor.norm", D)
    if kind_idx:
        nI, dI = c["index_n_heads"], c["index_head_dim"]
        w.fp8(a + "indexer.wq_b", nI * dI, qr)
        w.bf16(a + "indexer.weights_proj.weight", w.randn(nI, dim, std=dim ** -0.5))
        if kind_src:
            w.bf16(a + "indexer.wk.weight", w.randn(dI, D, std=D ** -0.5))
            w.norm(a + "indexer.k_norm", dI)


def moe(w, c, pre, n_exp):
    dim, ff = c["hidden_size"], c["moe_intermediate_size"]
    w.bf16(pre + "ffn.gate.weight", w.randn(n_exp, dim, std=dim ** -0.5))
    w.f32(pre + "ffn.gate.bias", w.randn(n_exp, std=0.1))
    for e in range(n_exp):
        for nm, o, i in (("w1", ff, dim), ("w2", dim, ff), ("w3", ff, dim)):
            w.fp4(f"{pre}ffn.experts.{e}.{nm}", o, i)
    for nm, o, i in (("w1", ff, dim), ("w2", dim, ff), ("w3", ff, dim)):
        w.fp8(f"{pre}ffn.shared_experts.{nm}", o, i)


def hyper(w, c, pre):
    hc, dim = c["hc_mult"], c["hidden_size"]
    mix = (2 + hc) * hc
    for s in ("attn", "ffn"):
        w.norm(f"{pre}{s}_norm", dim)
        w.f32(f"{pre}hc_{s}_fn", w.randn(mix, hc * dim, std=(hc * dim) ** -0.5))
        w.f32(f"{pre}hc_{s}_base", w.randn(mix, std=0.5))
        w.f32(f"{pre}hc_{s}_scale", 0.5 + w.randn(3, std=0.1).abs())


def engram(w, c, pre, rows):
    hc, dim, hd = c["hc_mult"], c["hidden_size"], c["engram_head_dim"]
    cols = (c["engram_max_ngram_size"] - 1) * c["engram_n_heads"]
    w.fp8_rows(pre + "engram.embed", rows, hd)
    w.fp8(pre + "engram.wkv", dim * (hc + 1), cols * hd)
    w.bf16(pre + "engram.q_weight", 1 + w.randn(hc, dim, std=0.3))
    w.bf16(pre + "engram.k_weight", 1 + w.randn(hc, dim, std=0.3))


def dspark(w, c, s, last):
    dim, rank, V = c["hidden_size"], c["dspark_markov_rank"], c["vocab_size"]
    pre = f"mtp.{s}."
    attention(w, c, pre, False, False, 0)
    moe(w, c, pre, c["dspark_n_routed_experts"])
    hyper(w, c, pre)
    if s == 0:
        w.fp8(pre + "main_proj", dim, dim * len(c["dspark_target_layer_ids"]))
        w.norm(pre + "main_norm", dim)
    if last:
        w.norm(pre + "norm", dim)
        w.bf16(pre + "markov_head.embed.weight", w.randn(V, rank))
        w.bf16(pre + "markov_head.head.weight", w.randn(V, rank, std=rank ** -0.5))
        w.bf16(pre + "confidence_head.proj.weight", w.randn(1, dim + rank, std=(dim + rank) ** -0.5))


def write(model_dir, seed=1, text_overrides=None):
    """Writes config.json, model.safetensors and engram_token_map.json into model_dir."""
    full = full_config()
    full["text_config"].update(text_overrides or {})
    c = full["text_config"]
    os.makedirs(model_dir, exist_ok=True)
    w = Writer(seed)
    dim, V = c["hidden_size"], c["vocab_size"]
    w.bf16("embed.weight", w.randn(V, dim))
    for il in range(c["num_hidden_layers"]):
        pre, r = f"layers.{il}.", c["compress_ratios"][il]
        if il in c["engram_layer_ids"]:
            engram(w, c, pre, c["engram_num_embeddings"][c["engram_layer_ids"].index(il)])
        attention(w, c, pre, il in c["kv_source_layer_ids"], il in c["index_source_layer_ids"], r)
        moe(w, c, pre, c["n_routed_experts"])
        hyper(w, c, pre)
    w.norm("norm", dim)
    w.bf16("head.weight", w.randn(V, dim, std=dim ** -0.5))
    n_st = c["num_nextn_predict_layers"]
    for s in range(n_st):
        dspark(w, c, s, s == n_st - 1)
    st.write_file(os.path.join(model_dir, "model.safetensors"), w.out)
    rng = np.random.default_rng(seed)
    tmap = rng.integers(0, c["engram_compressed_vocab_size"], V)
    with open(os.path.join(model_dir, "engram_token_map.json"), "w") as f:
        json.dump([int(x) for x in tmap], f)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(full, f, indent=1)
    return model_dir
