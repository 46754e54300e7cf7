"""config.py - the HF config.json of a DeepSeek-V4 checkpoint, as the reference uses it.

Owns: reading config.json (Hugging Face field names, docs/MODEL.md §R1.1) into a plain object
with the demo's ModelArgs names, and the revision switches of docs/MODEL.md §R0.

Also DeepSeek-V4.1 configs (docs/MODEL.md §6 "Config"): the model's fields under `text_config`,
`quantization_config` at the top; `ConfigV41` adds the V4.1 fields and the layer kinds
(`LayerKind`: kv source, index source, candidate source/user, Engram, DSpark stage) built by
the rules of docs/MODEL.md §6 "Layer kinds" (src/model/layer_kind.c `v41_kind`).

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
    arch = "v4"

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
    """Config (V4) or ConfigV41 (a config.json with a `text_config`: DeepSeek-V4.1)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        d = json.load(f)
    return ConfigV41(d) if "text_config" in d else Config(d)


# ============================================================================ DeepSeek-V4.1


def _latest_at_or_before(ids, layer):
    """The last entry of the ascending list `ids` that is <= layer, or -1."""
    found = [i for i in ids if i <= layer]
    return found[-1] if found else -1


class LayerKind:
    """What one V4.1 layer (main layer or DSpark stage) does (docs/MODEL.md §6 "Layer kinds").

    ratio         compression ratio of the rows it attends over (0: window only)
    kv_source     the layer whose compressed rows (and index keys) it reads: the latest kv
                  source at or before it; == the layer itself when it compresses (-1: none)
    index_source  the layer whose selection it uses: the latest index source at or before it;
                  == the layer itself when it runs an indexer (-1: none)
    cand          for an own indexer: "source" (picks candidate blocks), "user" (scores only
                  inside them) or None
    engram        position in engram_layer_ids, or -1
    stage         DSpark stage number, or -1 for a main layer
    """

    def __init__(self, ratio, kv_source, index_source, cand, engram, stage):
        self.ratio, self.kv_source, self.index_source = ratio, kv_source, index_source
        self.cand, self.engram, self.stage = cand, engram, stage

    def __repr__(self):
        return (f"LayerKind(ratio={self.ratio}, kv={self.kv_source}, index={self.index_source}, "
                f"cand={self.cand}, engram={self.engram}, stage={self.stage})")


class ConfigV41(Config):
    """A DeepSeek-V4.1 config.json (docs/MODEL.md §6 "Config"). Field names as the release
    spells them (e.g. `engram_pad_token_id`, `dspark_num_experts_per_tok`)."""

    arch = "v4.1"

    def __init__(self, top):
        d = dict(top["text_config"])
        q = top.get("quantization_config") or {}
        d.setdefault("expert_dtype", q.get("expert_dtype"))
        super().__init__(d)
        g = d.get
        blk = q.get("weight_block_size", [128, 128])
        if blk[0] != blk[1]:
            raise ValueError(f"weight_block_size {blk}: square blocks expected")
        self.weight_block = int(blk[0])          # FP8 scale per block x block weights
        self.act_block = self.weight_block       # activations quantised per weight_block
        self.gate_temp = float(g("gate_temp", 1.0))
        self.norm_topk_prob = bool(g("norm_topk_prob", True))
        self.kv_sources = list(g("kv_source_layer_ids", []))
        self.index_sources = list(g("index_source_layer_ids", []))
        cs = g("candidate_source_layer_id")
        self.cand_source = -1 if cs is None else int(cs)        # -1 or absent: no pre-filter
        self.cand_topk_blocks = int(g("candidate_topk_blocks", 0))
        self.cand_block_size = int(g("candidate_block_size", 0))
        self._read_engram(g)
        self._read_dspark(g)
        if self.n_hash_layers:
            raise ValueError("num_hash_layers: DeepSeek-V4.1 has no hash-routed layers")
        if len(self.compress_ratios) != self.n_layers + self.n_mtp_layers:
            raise ValueError("compress_ratios: one per main layer and DSpark stage, exactly")
        self.kinds = [self._kind(i) for i in range(self.n_layers + self.n_mtp_layers)]
        self._check()

    def _read_engram(self, g):
        self.engram_layers = list(g("engram_layer_ids", []))
        self.engram_rows = list(g("engram_num_embeddings", []))
        self.engram_max_ngram = int(g("engram_max_ngram_size", 0))
        self.engram_vocab = int(g("engram_vocab_size", 0))
        self.engram_n_heads = int(g("engram_n_heads", 0))
        self.engram_head_dim = int(g("engram_head_dim", 0))
        self.engram_pad_id = int(g("engram_pad_token_id", 2))
        self.engram_cvocab = int(g("engram_compressed_vocab_size", 0))

    def _read_dspark(self, g):
        self.dspark_block = int(g("dspark_block_size", 0))
        self.dspark_noise_id = int(g("dspark_noise_token_id", 0))
        self.dspark_targets = list(g("dspark_target_layer_ids", []))
        self.dspark_markov_rank = int(g("dspark_markov_rank", 0))
        # ModelArgs.get_moe_config: 0 / absent = the main layers' counts
        self.dspark_n_experts = int(g("dspark_n_routed_experts", 0) or self.n_routed_experts)
        self.dspark_n_active = int(g("dspark_num_experts_per_tok", 0) or self.n_activated_experts)

    def _kind(self, il):
        r = self.compress_ratios[il]
        stage = il - self.n_layers if il >= self.n_layers else -1
        main = stage < 0
        kvs = _latest_at_or_before(self.kv_sources, il) if r and main else -1
        ixs = _latest_at_or_before(self.index_sources, il) if r and main else -1
        cand = None
        if ixs == il and 0 <= self.cand_source <= il:
            cand = "source" if self.cand_source == il else "user"
        eng = self.engram_layers.index(il) if main and il in self.engram_layers else -1
        return LayerKind(r, kvs, ixs, cand, eng, stage)

    def _check(self):
        for il, k in enumerate(self.kinds):
            if k.ratio not in (0, 1, 2):
                raise ValueError(f"compress_ratios[{il}] = {k.ratio}: V4.1 ratios are 0, 1 or 2")
            if k.stage >= 0 and k.ratio:
                raise ValueError(f"compress_ratios[{il}]: DSpark stages are window-only")
            if k.ratio and (k.kv_source < 0 or k.index_source < 0):
                raise ValueError(f"layer {il}: ratio {k.ratio} but no kv / index source at or before it")
            if k.ratio and self.compress_ratios[k.kv_source] != k.ratio:
                raise ValueError(f"layer {il}: its kv source {k.kv_source} has another ratio")
        for s in self.kv_sources:
            if s not in self.index_sources:
                raise ValueError(f"kv source {s} is not an index source (its indexer publishes the keys)")
        if self.n_mtp_layers and not (self.dspark_block and self.dspark_targets and self.dspark_markov_rank):
            raise ValueError("DSpark stages need dspark_block_size, dspark_target_layer_ids and dspark_markov_rank")
        if self.engram_layers and (self.engram_head_dim % 32 or len(self.engram_rows) != len(self.engram_layers)):
            raise ValueError("engram: head dim a multiple of 32, one row count per Engram layer")

    def moe_config(self, layer_id):
        """(routed experts, experts per token) of a main layer or DSpark stage."""
        if layer_id < self.n_layers:
            return self.n_routed_experts, self.n_activated_experts
        return self.dspark_n_experts, self.dspark_n_active
