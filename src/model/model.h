/*
 * model.h - the DeepSeek-V4 model as the engine sees it: the validated config, and the
 * weights bound from the checkpoint into typed per-layer structs that point into the mmap.
 *
 * Shape vocabulary (used in every shape comment): n_tok tokens in a batch, d_model, n_head,
 * d_head (512), d_rope (64), d_nope = d_head - d_rope, n_exp, n_exp_used, d_ff_exp, hc (the
 * number of hyper-connection streams), il (layer index).
 */
#ifndef DSV4_MODEL_H
#define DSV4_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h" /* the weight descriptors the ops read: dsv4_linear, dsv4_expert_w */
#include "core/core.h"
#include "io/io.h"
#include "kv/kv_dims.h"
#include "model/engram_hash.h" /* DSV4_ENGRAM_MAX_LAYERS */
#include "model/layer_kind.h"



/* Which release a config describes: its field names, its layer kinds (layer_kind.c) and
 * what the engine can do with it (docs/MODEL.md "DeepSeek-V4.1"). Not dsv4_revision, which
 * picks between numerics of the V4 release. */
enum dsv4_arch {
    DSV4_ARCH_V4   = 0, /* DeepseekV4ForCausalLM, model_type deepseek_v4 */
    DSV4_ARCH_V4_1 = 1, /* DeepseekV41ForCausalLM, model_type deepseek_v41 (text_config): the main
                           model runs on the CPU backend (issue 41); no DSpark drafting, no convert */
};

/* Engram layers: as many as the row-index code holds (engram_hash.h), so a config that parses can be hashed. */
enum { DSV4_MAX_ENGRAM_LAYERS = DSV4_ENGRAM_MAX_LAYERS, DSV4_MAX_DSPARK_TARGETS = 16 };

/* The fields only DeepSeek-V4.1 has (its text_config; docs/MODEL.md "DeepSeek-V4.1"). The
 * per-layer roles they imply (kv / index / candidate source, Engram) are in cfg.kind[]. */
struct dsv4_v41_config {
    int     n_kv_src;          /* kv_source_layer_ids: the layers that compress KV (and own index keys) */
    int     kv_src[DSV4_MAX_LAYERS];
    int     n_idx_src;         /* index_source_layer_ids: the layers that run an indexer */
    int     idx_src[DSV4_MAX_LAYERS];
    int     cand_source;       /* candidate_source_layer_id; -1: no candidate pre-filter */
    int     cand_topk_blocks;  /* candidate_topk_blocks: blocks each query keeps */
    int     cand_block;        /* candidate_block_size: compressed rows per block */
    double  gate_temp;         /* gate_temp: router logits divided by it (1 when absent) */
    int     n_engram;          /* engram_layer_ids entries */
    int     engram_layer[DSV4_MAX_ENGRAM_LAYERS];
    int64_t engram_rows[DSV4_MAX_ENGRAM_LAYERS]; /* engram_num_embeddings: table rows per layer */
    int     engram_max_ngram;  /* engram_max_ngram_size: n-grams of 2 .. this per position */
    int     engram_vocab;      /* engram_vocab_size: where each bucket's prime search starts */
    int     engram_n_head;     /* engram_n_heads: buckets per n-gram size */
    int     engram_d_head;     /* engram_head_dim: width of a table row (FP8, scale per 32) */
    int     engram_pad_id;     /* engram_pad_token_id: fills n-gram slots before the sequence */
    int     engram_cvocab;     /* engram_compressed_vocab_size: size of the token map's range */
    int     dspark_block;      /* dspark_block_size: tokens a stage drafts at once; 0 without DSpark */
    int     dspark_noise_id;   /* dspark_noise_token_id: fills the draft block after its first token */
    int     n_dspark_target;
    int     dspark_target[DSV4_MAX_DSPARK_TARGETS]; /* dspark_target_layer_ids: main layers whose input feeds stage 0 */
    int     dspark_markov_rank;/* dspark_markov_rank: width of the Markov head's embedding */
    int     dspark_n_exp;      /* dspark_n_routed_experts (n_routed_experts when 0 or absent) */
    int     dspark_n_exp_used; /* dspark_num_experts_per_tok (num_experts_per_tok when 0 or absent) */
    bool    vision;            /* vision_config with layers: the checkpoint has a vision tower (vision.*,
                                  aligner.*, image_{start,end,newline}) and routers' ffn.gate.bias_vl */
};

struct dsv4_config {
    enum dsv4_arch arch;     /* the release the config describes */
    int   fp8_block;         /* FP8 weight block edge and activation group: 128 (V4), 32 (V4.1) */
    int   vocab_size;
    int   d_model;           /* hidden_size */
    int   n_layer;           /* num_hidden_layers (main stack) */
    int   n_head;            /* num_attention_heads */
    int   d_head;            /* head_dim (q, k and v width per head) */
    int   d_rope;            /* qk_rope_head_dim: the last d_rope dims of a head */
    int   d_nope;            /* d_head - d_rope */
    int   q_lora_rank;
    int   o_lora_rank;
    int   o_groups;
    int   window;            /* sliding_window */
    int   ratio[DSV4_MAX_LAYERS]; /* compress_ratios, n_layer + n_mtp entries used */
    float rope_theta;        /* ratio-0 layers, no YaRN */
    float compress_rope_theta;
    bool  yarn;              /* rope_scaling of type yarn present */
    float rope_factor;
    int   original_seq_len;
    float beta_fast, beta_slow;
    int   max_ctx;           /* max_position_embeddings */
    int   n_idx_head;        /* index_n_heads */
    int   d_idx_head;        /* index_head_dim */
    int   idx_topk;          /* index_topk */
    int   n_exp;             /* n_routed_experts */
    int   n_exp_shared;      /* n_shared_experts (must be 1) */
    int   n_exp_used;        /* num_experts_per_tok */
    int   d_ff_exp;          /* moe_intermediate_size */
    int   n_hash_layer;      /* num_hash_layers */
    double route_scale;      /* routed_scaling_factor */
    double swiglu_limit;
    int   hc;                /* hc_mult */
    int   hc_sinkhorn_iters;
    double hc_eps;
    double norm_eps;         /* rms_norm_eps */
    int   n_mtp;             /* num_nextn_predict_layers: V4 its MTP block (0 or 1), V4.1 its DSpark stages */
    int   bos_id, eos_id;
    bool  fp8;               /* quantization_config: fp8 e4m3, fp8_block x fp8_block blocks, dynamic activations */
    enum dsv4_wfmt wfmt;     /* format of the quantised dense projections (FP8 or BF16) */
    enum dsv4_wfmt expert_wfmt; /* routed experts: FP4, FP8 or BF16 */
    struct dsv4_layer_kind kind[DSV4_MAX_LAYERS]; /* each layer's kind, n_layer + n_mtp used (layer_kind.h) */
    struct dsv4_kv_dims kv;  /* the widths above that the KV state is laid out by (src/kv reads only these) */
    struct dsv4_v41_config v41; /* arch DSV4_ARCH_V4_1 only */
};

/* Parses and validates a HF config.json text. err names the field at fault. */
int dsv4_config_parse(struct dsv4_config *cfg, const char *json_text, size_t len, const char *what,
                      struct dsv4_err *err);
int dsv4_config_load(struct dsv4_config *cfg, const char *dir, struct dsv4_err *err);
/* The same from a config.json file named by path (no checkpoint beside it needed). */
int dsv4_config_load_file(struct dsv4_config *cfg, const char *path, struct dsv4_err *err);
/* DSV4_OK when `dsv4 convert` can convert the checkpoint cfg describes; DSV4_EUNSUPPORTED with
 * the reason (a DeepSeek-V4.1 config: its conversion is not implemented, issue 41). Checked
 * before any shard is opened. */
int dsv4_config_check_convertible(const struct dsv4_config *cfg, struct dsv4_err *err);

/* ------------------------------------------------------------------ weights */


struct dsv4_compressor_w {
    int                ratio;
    bool               overlap;  /* the layer kind's (layer_kind.h) */
    int                d_out;    /* Dc: d_head (main) or d_idx_head (indexer) */
    int                coff;     /* 2 when overlapping, else 1 */
    const float       *ape;      /* [ratio, coff*d_out] f32 */
    struct dsv4_linear wkv;      /* [coff*d_out, d_model] bf16 */
    struct dsv4_linear wgate;    /* [coff*d_out, d_model] bf16 */
    const uint16_t    *norm;     /* [d_out] bf16 */
};

struct dsv4_indexer_w {
    struct dsv4_linear       wq_b;         /* [n_idx_head*d_idx_head, q_lora_rank] */
    struct dsv4_linear       weights_proj; /* [n_idx_head, d_model] bf16 */
    struct dsv4_compressor_w comp;         /* V4 only */
    /* V4.1, on a kv source only (`Indexer.owns_k`): the index keys k_norm(wk(latent)) */
    struct dsv4_linear       wk;           /* [d_idx_head, d_head] bf16 */
    const uint16_t          *k_norm;       /* [d_idx_head] bf16 */
};

/* V4.1's Engram on a layer (`Engram`, `ParallelEngramEmbedding`; docs/MODEL.md "DeepSeek-V4.1").
 * The table stays in the mmap and is read by row (a token reads (max_ngram - 1) * n_heads of
 * them): never copied, decoded or uploaded whole. */
struct dsv4_engram_w {
    int64_t            rows;     /* engram_num_embeddings of this layer */
    const uint8_t     *table;    /* [rows, engram_d_head] e4m3 */
    const uint8_t     *scale;    /* [rows, engram_d_head/32] e8m0 */
    struct dsv4_linear wkv;      /* [(hc+1)*d_model, (max_ngram-1)*n_heads*engram_d_head]: hc keys, a value */
    const uint16_t    *q_weight; /* [hc, d_model] bf16 */
    const uint16_t    *k_weight; /* [hc, d_model] bf16 */
};


struct dsv4_layer_w {
    int   il;
    struct dsv4_layer_kind kind;                     /* cfg.kind[il] */
    const uint16_t *attn_norm, *ffn_norm;            /* [d_model] bf16 */
    const float    *hc_attn_fn, *hc_ffn_fn;          /* [(2+hc)*hc, hc*d_model] */
    const float    *hc_attn_base, *hc_ffn_base;      /* [(2+hc)*hc] */
    const float    *hc_attn_scale, *hc_ffn_scale;    /* [3] */
    const float    *attn_sink;                       /* [n_head] */
    struct dsv4_linear wq_a;                         /* [q_lora_rank, d_model] */
    const uint16_t    *q_norm;                       /* [q_lora_rank] */
    struct dsv4_linear wq_b;                         /* [n_head*d_head, q_lora_rank] */
    struct dsv4_linear wkv;                          /* [d_head, d_model] */
    const uint16_t    *kv_norm;                      /* [d_head] */
    struct dsv4_linear wo_a;                         /* [o_groups*o_lora_rank, n_head*d_head/o_groups] */
    struct dsv4_linear wo_b;                         /* [d_model, o_groups*o_lora_rank] */
    struct dsv4_compressor_w comp;                   /* kind.ratio != 0 (V4.1: kind.kv_source == il; no ape,
                                                        no wgate at ratio 1) */
    struct dsv4_indexer_w    idx;                    /* kind.indexer */
    struct dsv4_linear gate;                         /* [n_exp, d_model] bf16 */
    const int64_t     *tid2eid;                      /* [vocab, n_exp_used] (hash layers) */
    const float       *gate_bias;                    /* [n_exp] (score-routed layers) */
    struct dsv4_expert_w  shared;
    struct dsv4_expert_w *experts;                   /* [n_exp] */
    /* MTP block only */
    struct dsv4_linear e_proj, h_proj;               /* [d_model, d_model] */
    const uint16_t    *enorm, *hnorm, *mtp_norm;     /* [d_model] */
    const float       *hc_head_fn, *hc_head_base, *hc_head_scale;
    /* V4.1 */
    struct dsv4_engram_w engram;                     /* kind.engram */
    int                  n_exp;                      /* routed experts (the DSpark stages' own count) */
    /* V4.1 DSpark stage (`DSparkBlock`): stage 0 projects the target layers' inputs; the last
     * has the final norm (mtp_norm above), the Markov and confidence heads */
    struct dsv4_linear main_proj;                    /* [d_model, n_dspark_target*d_model] (stage 0) */
    const uint16_t    *main_norm;                    /* [d_model] (stage 0) */
    const uint16_t    *markov_embed;                 /* [vocab, dspark_markov_rank] bf16 (last stage) */
    struct dsv4_linear markov_head;                  /* [vocab, dspark_markov_rank] bf16 (last stage) */
    struct dsv4_linear confidence;                   /* [1, d_model + dspark_markov_rank] bf16 (last stage) */
};

struct dsv4_weights {
    const uint16_t      *embed;         /* [vocab, d_model] bf16 */
    struct dsv4_linear   head;          /* [vocab, d_model] bf16 */
    const uint16_t      *norm;          /* [d_model] */
    const float         *hc_head_fn;    /* [hc, hc*d_model] */
    const float         *hc_head_base;  /* [hc] */
    const float         *hc_head_scale; /* [1] */
    struct dsv4_layer_w *layers;        /* [n_layer] */
    bool                 has_mtp;       /* V4: mtp bound; V4.1: every DSpark stage bound */
    struct dsv4_layer_w  mtp;           /* V4 */
    struct dsv4_layer_w *dspark;        /* V4.1: [n_mtp] DSpark stages (mtp.S.), NULL when absent */
};

/* One problem found while binding (a line for `dsv4 inspect`). */
struct dsv4_problem {
    char text[400];
};

struct dsv4_bind_report {
    struct dsv4_problem *problems; /* malloc'd */
    int                  n_problems;
    int                  n_missing, n_dtype, n_shape, n_unexpected;
    int                  n_vision;    /* V4.1: vision tower tensors (vision.*, aligner.*), accepted unchecked */
    bool                 mtp_absent;  /* no mtp.* tensor at all (not a problem) */
};

/*
 * Binds every tensor the config requires (docs/MODEL.md §R2; V4.1: §6, weights_v41.c) into w,
 * allocating the per-layer structs in arena. The iterators below cover V4's tensors only:
 * V4.1's own (index keys wk / k_norm, Engram, DSpark) are not handed to prepare_weights, so
 * the CPU reads them in the checkpoint's layout and no device backend runs V4.1 yet (the
 * forward refuses one). Every problem (missing tensor, wrong dtype, wrong shape, unexpected
 * tensor) is collected in report; returns DSV4_ECHECKPOINT when there is any, with err
 * holding the count and the first one.
 */
int  dsv4_weights_bind(struct dsv4_weights *w, const struct dsv4_config *cfg,
                       const struct dsv4_checkpoint *ck, struct dsv4_arena *arena,
                       struct dsv4_bind_report *report, struct dsv4_err *err);
void dsv4_bind_report_free(struct dsv4_bind_report *r);
/* Calls fn on every projection of w, in a fixed order (unbound ones have n_out 0). */
void dsv4_weights_each_linear(struct dsv4_weights *w, const struct dsv4_config *c,
                              void (*fn)(struct dsv4_linear *l, void *ud), void *ud);
/* The same for one rank of expert parallelism: its routed experts [exp_lo, exp_hi), and the
 * other projections when trunk is set (src/dist/ep.h). */
void dsv4_weights_each_linear_of(struct dsv4_weights *w, const struct dsv4_config *c, int exp_lo, int exp_hi,
                                 bool trunk, void (*fn)(struct dsv4_linear *l, void *ud), void *ud);
/* Every other tensor the ops read, with its size in bytes (prepare_weights may repoint it). */
void dsv4_weights_each_tensor(struct dsv4_weights *w, const struct dsv4_config *c,
                              void (*fn)(const void **t, size_t bytes, void *ud), void *ud);

/* Every tensor the config requires, as the official release stores it (name, dtype, shape;
 * shape[1] unused when ndim is 1), in binding order, without any checkpoint: what memory
 * planning for a model not at hand (`dsv4 inspect --config`) sizes the weights by. The MTP
 * block is listed when with_mtp and the config has one. DSV4_EFORMAT names a width the
 * tensors cannot have (FP4 inputs not a multiple of 32). */
typedef void (*dsv4_layout_fn)(void *ud, const char *name, enum dsv4_dtype dtype, int ndim, const int64_t shape[2]);
int dsv4_weights_layout(const struct dsv4_config *cfg, bool with_mtp, dsv4_layout_fn fn, void *ud,
                        struct dsv4_err *err);

/* ------------------------------------------------------------------ sizes (inspect, planning) */

struct dsv4_model_stats {
    uint64_t params_by_dtype[DSV4_DTYPE_COUNT]; /* elements */
    uint64_t bytes_by_dtype[DSV4_DTYPE_COUNT];
    uint64_t bytes_total;             /* the checkpoint's tensors, stored tiles included */
    uint64_t bytes_tiles;             /* of which interleaved tiles (`dsv4 convert --tiles`) */
    uint64_t bytes_per_token;         /* weights read to decode one token (batch 1) */
    uint64_t bytes_experts_per_token; /* of which routed experts */
    uint64_t active_params;           /* parameters touched per token (embedding: one row) */
    int      n_swa, n_csa, n_hca;
};

void dsv4_model_stats(const struct dsv4_config *cfg, const struct dsv4_checkpoint *ck,
                      struct dsv4_model_stats *st);

/* The sizes of a DeepSeek-V4.1 model from its config alone (stats_v41.c says how each figure
 * is derived from the official code's tensor shapes): its text model, vision tower aside. */
struct dsv4_v41_sizes {
    uint64_t n_tensors;
    uint64_t params, bytes;               /* every tensor (Engram tables and DSpark stages included) */
    uint64_t engram_params, engram_bytes; /* of which the Engram tables (mapped, read by row) */
    uint64_t dspark_params, dspark_bytes; /* of which the DSpark stages */
    uint64_t bytes_per_token;             /* weights a decoded token reads (batch 1, no DSpark), Engram rows apart */
    uint64_t expert_bytes_per_token;      /* of which routed experts */
    uint64_t engram_bytes_per_token;      /* the Engram table rows a token reads */
    uint64_t active_params;               /* parameters a token touches (Engram rows included) */
    uint64_t kv_fixed_per_seq;            /* window rings and compressor partial groups */
    double   kv_bytes_per_position;       /* compressed KV and index keys of the kv sources */
};
void dsv4_v41_sizes(const struct dsv4_config *cfg, struct dsv4_v41_sizes *s);


/* ------------------------------------------------------------------ KV state sizes */

/* Bytes of one cached main-attention row in the compact lossless form: d_nope e4m3 codes,
 * one e8m0 scale per 64 of them, d_rope bf16 (docs/MODEL.md §R4). */
static inline uint64_t dsv4_kv_row_bytes(const struct dsv4_config *c)
{
    return (uint64_t)c->d_nope + (uint64_t)c->d_nope / 64 + (uint64_t)c->d_rope * 2;
}

/* Bytes of one indexer key row: d_idx_head e2m1 codes (two per byte), one e8m0 per 32. */
static inline uint64_t dsv4_idx_row_bytes(const struct dsv4_config *c)
{
    return (uint64_t)c->d_idx_head / 2 + (uint64_t)c->d_idx_head / 32;
}

struct dsv4_kv_sizes {
    uint64_t fixed_per_seq;   /* window rings + compressor frontier states, all layers + MTP */
    double   bytes_per_token; /* compressed rows and indexer keys, averaged per position */
};

void dsv4_kv_sizes(const struct dsv4_config *cfg, bool with_mtp, struct dsv4_kv_sizes *s);

#endif /* DSV4_MODEL_H */
