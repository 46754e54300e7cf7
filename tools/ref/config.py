"""config.py - the HF config.json of a DeepSeek-V4 checkpoint, as the reference uses it.

Owns: reading config.json (Hugging Face field names, docs/MODEL.md §R1.1) into a plain object
with the demo's ModelArgs names, and the revision switches of docs/MODEL.md §R0.

Why here: the reference reads the released layout directly; every other file uses the demo's
names (dim, n_heads, window_size, ...) so that the code reads like the paper and the demo.
"""

import json
import os


class Revision:
    """Behaviour switches that differ between the two published revisions of the demo.
    current: the shared expert is clamped with swiglu_limit and cached KV nope dims are
    really rounded to e4m3 (window rows and main compressed rows).
    initial: no shared-expert clamp; the KV FP8 simulation was a no-op."""

    def __init__(self, name="current", shared_clamp=None, kv_fp8_sim=None):
        if name not in ("current", "initial"):
            raise ValueError(f"unknown revision {name!r} (current, initial)")
        self.name = name
        cur = name == "current"
        self.shared_clamp = cur if shared_clamp is None else shared_clamp
        self.kv_fp8_sim = cur if kv_fp8_sim is None else kv_fp8_sim

    def __repr__(self):
        return f"Revision({self.name}, shared_clamp={self.shared_clamp}, kv_fp8_sim={self.kv_fp8_sim})"


class Config:
    def __init__(self, d):
        g = d.get
        self.raw = d
        self.vocab_size = d["vocab_size"]
        self.dim = d["hidden_size"]
        self.n_layers = d["num_hidden_layers"]
        self.n_heads = d["num_attention_heads"]
        self.head_dim = d["head_dim"]
        self.rope_head_dim = d["qk_rope_head_dim"]
        self.nope_head_dim = self.head_dim - self.rope_head_dim
        self.q_lora_rank = d["q_lora_rank"]
        self.o_lora_rank = d["o_lora_rank"]
        self.o_groups = d["o_groups"]
        self.window_size = d["sliding_window"]
        self.rope_theta = float(d["rope_theta"])
        self.compress_rope_theta = float(d["compress_rope_theta"])
        rs = g("rope_scaling") or {}
        self.rope_factor = float(rs.get("factor", 1.0))
        self.original_seq_len = int(rs.get("original_max_position_embeddings", 0)) if rs else 0
        self.beta_fast = float(rs.get("beta_fast", 32))
        self.beta_slow = float(rs.get("beta_slow", 1))
        self.index_n_heads = d["index_n_heads"]
        self.index_head_dim = d["index_head_dim"]
        self.index_topk = d["index_topk"]
        self.n_routed_experts = d["n_routed_experts"]
        self.n_shared_experts = d["n_shared_experts"]
        self.n_activated_experts = d["num_experts_per_tok"]
        self.moe_inter_dim = d["moe_intermediate_size"]
        self.n_hash_layers = g("num_hash_layers", 0)
        self.score_func = g("scoring_func", "sqrtsoftplus")
        self.route_scale = float(d["routed_scaling_factor"])
        self.swiglu_limit = float(g("swiglu_limit", 0.0) or 0.0)
        self.hc_mult = d["hc_mult"]
        self.hc_sinkhorn_iters = d["hc_sinkhorn_iters"]
        self.hc_eps = float(d["hc_eps"])
        self.norm_eps = float(d["rms_norm_eps"])
        self.n_mtp_layers = g("num_nextn_predict_layers", 0)
        self.compress_ratios = list(d["compress_ratios"])
        self.expert_dtype = g("expert_dtype")
        if self.n_shared_experts != 1:
            raise ValueError("the demo supports exactly one shared expert")
        if self.score_func != "sqrtsoftplus":
            raise ValueError(f"scoring_func {self.score_func!r}: only sqrtsoftplus is implemented")
        if len(self.compress_ratios) < self.n_layers + self.n_mtp_layers:
            raise ValueError("compress_ratios is shorter than layers + MTP layers")

    def ratio(self, layer_id):
        """Compression ratio of main layer layer_id (or n_layers + k for MTP block k)."""
        return self.compress_ratios[layer_id]


def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        return Config(json.load(f))
