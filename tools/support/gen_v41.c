/*
 * gen_v41.c - `dsv4 gen --preset tiny-v41`: a random-weight DeepSeek-V4.1 checkpoint in the
 * release layout (docs/MODEL.md "DeepSeek-V4.1"): config.json with the model under
 * text_config (as models/configs/v41-flash.json), safetensors shards (the globals, one per
 * layer, one per DSpark stage `mtp.S.`) with their index, and engram_token_map.json.
 *
 * The tensors are those of the official inference/model.py state dict, the list
 * src/model/weights_v41.c binds and src/model/stats_v41.c counts: FP8 projections with an
 * e8m0 scale per 32x32 block, FP4 routed experts, the Engram tables of exactly the rows their
 * bucket primes need (src/model/engram_hash.c), no hc_head. Which layer has a compressor, an
 * indexer (with its own keys or not) or an Engram is read off the layer kinds the library
 * derives from the config this writes (src/model/layer_kind.c), so the plan follows the
 * config. Values as gen.c makes them (codes times power-of-two scales, unit-scale activations).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "io/io.h"
#include "model/model.h"
#include "support/gen_plan.h"

/* The tiny model: every V4.1 layer kind in 8 layers (window only; Engram; ratio-2 kv and index
 * source; its consumer; ratio-1 kv, index and candidate source; index source within its
 * candidates, with Engram; their consumer; window only) and 2 DSpark stages. */
static const struct gen_shape TINY = {
    .vocab = 2048, .dim = 256, .n_layers = 8, .n_mtp = 2, .n_heads = 4, .head_dim = 64, .rope_dim = 32,
    .q_lora = 128, .o_groups = 2, .o_lora = 64, .window = 16, .ratios = { 0, 0, 2, 2, 1, 1, 1, 0, 0, 0 },
    .idx_heads = 4, .idx_dim = 64, .idx_topk = 4, .n_exp = 8, .n_exp_used = 2, .inter = 128, .hc = 4,
    .max_pos = 4096, .swiglu_limit = 10.0, .route_scale = 1.5,
};

enum {
    ENGRAM_LAYERS = 2, ENGRAM_NGRAM = 3, ENGRAM_HEADS = 2, ENGRAM_DIM = 64, ENGRAM_VOCAB = 1000, ENGRAM_PAD = 2,
    ENGRAM_CVOCAB = 1536,
};
static const int ENGRAM_IDS[ENGRAM_LAYERS] = { 1, 5 };

static json_t *int_array(const int *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* Rows of each Engram table: exactly the sum of its bucket primes, as the release's
 * engram_num_embeddings (`EngramLayout.from_args`). */
static int engram_rows(int64_t rows[ENGRAM_LAYERS], struct dsv4_err *err)
{
    struct dsv4_engram_params ep = { .n_layers = ENGRAM_LAYERS, .max_ngram = ENGRAM_NGRAM, .n_heads = ENGRAM_HEADS,
                                     .vocab_size = ENGRAM_VOCAB, .compressed_vocab = ENGRAM_CVOCAB };
    for (int l = 0; l < ENGRAM_LAYERS; l++) {
        ep.layer_ids[l]      = ENGRAM_IDS[l];
        ep.num_embeddings[l] = INT64_MAX; /* what we are computing: any table is large enough */
    }
    struct dsv4_engram_hash *h  = malloc(sizeof(*h));
    int                      rc = h ? dsv4_engram_hash_init(h, &ep, err) : dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (int l = 0; rc == DSV4_OK && l < ENGRAM_LAYERS; l++)
        rows[l] = h->offset[l][h->n_cols - 1] + h->prime[l][h->n_cols - 1];
    free(h);
    return rc;
}

/* The fields V4 has too, as V4.1 names them (text_config). */
static json_t *text_config_common(const struct gen_shape *s)
{
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:b, s:i, "
                     "s:f, s:f, s:{s:s, s:f, s:i, s:i, s:i}, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:b, s:f, "
                     "s:f, s:i, s:i, s:f, s:i}",
                     "model_type", "deepseek_v41_text", "vocab_size", s->vocab, "hidden_size", s->dim,
                     "moe_intermediate_size", s->inter, "num_hidden_layers", s->n_layers, "num_attention_heads",
                     s->n_heads, "num_key_value_heads", 1, "head_dim", s->head_dim, "qk_rope_head_dim", s->rope_dim,
                     "q_lora_rank", s->q_lora, "o_lora_rank", s->o_lora, "o_groups", s->o_groups, "hidden_act",
                     "silu", "swiglu_limit", s->swiglu_limit, "rms_norm_eps", 1e-20, "tie_word_embeddings", 0,
                     "max_position_embeddings", s->max_pos, "rope_theta", 10000.0, "compress_rope_theta", 160000.0,
                     "rope_scaling", "rope_type", "yarn", "factor", 16.0, "beta_fast", 32, "beta_slow", 1,
                     "original_max_position_embeddings", 65536, "n_routed_experts", s->n_exp, "n_shared_experts", 1,
                     "num_experts_per_tok", s->n_exp_used, "sliding_window", s->window, "index_n_heads",
                     s->idx_heads, "index_head_dim", s->idx_dim, "scoring_func", "sqrtsoftplus", "topk_method",
                     "noaux_tc", "norm_topk_prob", 1, "routed_scaling_factor", s->route_scale, "gate_temp", 1.25,
                     "hc_mult", s->hc, "hc_sinkhorn_iters", 20, "hc_eps", 1e-6, "index_topk", s->idx_topk);
}

/* The fields only V4.1 has: sources, candidates, Engram, DSpark (docs/MODEL.md §6, "Config"). */
static void text_config_v41(json_t *t, const struct gen_shape *s, const int64_t rows[ENGRAM_LAYERS])
{
    const int kv_src[] = { 2, 4 }, idx_src[] = { 2, 4, 5 }, targets[] = { 3, 5, 7 };
    json_object_set_new(t, "compress_ratios", int_array(s->ratios, s->n_layers + s->n_mtp));
    json_object_set_new(t, "kv_source_layer_ids", int_array(kv_src, 2));
    json_object_set_new(t, "index_source_layer_ids", int_array(idx_src, 3));
    json_object_set_new(t, "candidate_source_layer_id", json_integer(4));
    json_object_set_new(t, "candidate_topk_blocks", json_integer(3));
    json_object_set_new(t, "candidate_block_size", json_integer(2));
    json_object_set_new(t, "engram_layer_ids", int_array(ENGRAM_IDS, ENGRAM_LAYERS));
    json_object_set_new(t, "engram_num_embeddings", json_pack("[I, I]", (json_int_t)rows[0], (json_int_t)rows[1]));
    json_object_set_new(t, "engram_max_ngram_size", json_integer(ENGRAM_NGRAM));
    json_object_set_new(t, "engram_vocab_size", json_integer(ENGRAM_VOCAB));
    json_object_set_new(t, "engram_n_heads", json_integer(ENGRAM_HEADS));
    json_object_set_new(t, "engram_head_dim", json_integer(ENGRAM_DIM));
    json_object_set_new(t, "engram_pad_token_id", json_integer(ENGRAM_PAD));
    json_object_set_new(t, "engram_compressed_vocab_size", json_integer(ENGRAM_CVOCAB));
    json_object_set_new(t, "num_nextn_predict_layers", json_integer(s->n_mtp));
    json_object_set_new(t, "dspark_block_size", json_integer(3));
    json_object_set_new(t, "dspark_noise_token_id", json_integer(3));
    json_object_set_new(t, "dspark_target_layer_ids", int_array(targets, 3));
    json_object_set_new(t, "dspark_markov_rank", json_integer(32));
    json_object_set_new(t, "dspark_n_routed_experts", json_integer(4));
    json_object_set_new(t, "dspark_num_experts_per_tok", json_integer(2));
}

static int write_json(const char *dir, const char *name, json_t *j, size_t flags, struct dsv4_err *err)
{
    char *path = dsv4_path_join(dir, name);
    int   rc   = path && json_dump_file(j, path, flags) == 0 ? DSV4_OK
                                                             : dsv4_err_set(err, DSV4_EIO, "cannot write %s", path);
    free(path);
    json_decref(j);
    return rc;
}

/* config.json as the release writes it: bos / eos / quantization_config at the top, the
 * model in text_config (models/configs/v41-flash.json). */
static int write_config(const char *dir, const struct gen_shape *s, struct dsv4_err *err)
{
    int64_t rows[ENGRAM_LAYERS];
    int     rc = engram_rows(rows, err);
    if (rc) return rc;
    json_t *t = text_config_common(s);
    if (!t) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory writing config.json");
    text_config_v41(t, s, rows);
    json_t *c = json_pack("{s:[s], s:s, s:s, s:i, s:i, s:i, s:{s:s, s:s, s:s, s:[i,i], s:s, s:s}, s:o}",
                          "architectures", "DeepseekV41ForCausalLM", "model_type", "deepseek_v41", "dtype",
                          "bfloat16", "bos_token_id", 0, "eos_token_id", 1, "pad_token_id", 2, "quantization_config",
                          "quant_method", "fp8", "fmt", "e4m3", "activation_scheme", "dynamic", "weight_block_size",
                          32, 32, "scale_fmt", "ue8m0", "expert_dtype", "fp4", "text_config", t);
    return write_json(dir, "config.json", c, JSON_INDENT(2) | JSON_PRESERVE_ORDER, err);
}

/* engram_token_map.json: token id -> compressed id, a fixed pseudo-random map (from the seed)
 * in which every compressed id occurs, as build_compressed_token_map assigns them (dense). */
static int write_token_map(const char *dir, int vocab, int cvocab, unsigned long long seed, struct dsv4_err *err)
{
    int32_t *m = malloc((size_t)vocab * sizeof(*m));
    if (!m) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (int i = 0; i < vocab; i++) {
        uint64_t h = dsv4_hash_bytes(&i, sizeof(i), seed ^ 0x656e6772616dull);
        m[i]       = i < cvocab ? i : (int32_t)(h % (uint64_t)cvocab);
    }
    for (int i = vocab - 1; i > 0; i--) { /* Fisher-Yates, keyed by position */
        int      k = -1 - i;
        uint64_t h = dsv4_hash_bytes(&k, sizeof(k), seed);
        int      j = (int)(h % (uint64_t)(i + 1)), t = m[i];
        m[i]       = m[j];
        m[j]       = t;
    }
    json_t *a = json_array();
    for (int i = 0; i < vocab; i++) json_array_append_new(a, json_integer(m[i]));
    free(m);
    return write_json(dir, "engram_token_map.json", a, JSON_COMPACT, err);
}

#define N(suffix) (snprintf(n, sizeof(n), "%s%s", pre, suffix), n)

/* `Engram`: the table (rows of unit scale), wkv to hc keys and a value, the gate weights. */
static void add_engram(struct plan *p, const struct gen_shape *s, const char *pre, int64_t rows)
{
    char n[200];
    int  cols = (ENGRAM_NGRAM - 1) * ENGRAM_HEADS * ENGRAM_DIM;
    gen_add(p, N("engram.embed.weight"), DSV4_DTYPE_F8_E4M3, 2, rows, ENGRAM_DIM, FILL_E4M3, 0, 0);
    struct job *j = gen_add(p, N("engram.embed.scale"), DSV4_DTYPE_F8_E8M0, 2, rows, ENGRAM_DIM / 32, FILL_SCALE, 0, 1.0);
    if (j) j->code_std = gen_e4m3_code_std();
    gen_add_linear(p, N("engram.wkv"), LIN_FP8, (s->hc + 1) * s->dim, cols, 1.0 / sqrt(cols));
    gen_add(p, N("engram.q_weight"), DSV4_DTYPE_BF16, 2, s->hc, s->dim, FILL_UNIFORM, 1.0, 0.1);
    gen_add(p, N("engram.k_weight"), DSV4_DTYPE_BF16, 2, s->hc, s->dim, FILL_UNIFORM, 1.0, 0.1);
}

/* The compressor of a kv source (no ape; a gate above ratio 1) and the indexer of an index
 * source (its keys' wk and k_norm where it owns them: on a kv source). */
static void add_sources(struct plan *p, const struct gen_shape *s, const char *pre, const struct dsv4_layer_kind *k,
                        bool kv_source)
{
    char   n[200];
    double sd = 1.0 / sqrt(s->dim);
    if (kv_source) {
        gen_add_linear(p, N("attn.compressor.wkv"), LIN_BF16, s->head_dim, s->dim, sd);
        if (k->ratio > 1) gen_add_linear(p, N("attn.compressor.wgate"), LIN_BF16, s->head_dim, s->dim, sd);
        gen_add(p, N("attn.compressor.norm.weight"), DSV4_DTYPE_BF16, 1, s->head_dim, 0, FILL_UNIFORM, 1.0, 0.1);
    }
    if (!k->indexer) return;
    gen_add_linear(p, N("attn.indexer.wq_b"), LIN_FP8, s->idx_heads * s->idx_dim, s->q_lora, 1.0 / sqrt(s->q_lora));
    gen_add_linear(p, N("attn.indexer.weights_proj"), LIN_BF16, s->idx_heads, s->dim, sd);
    if (!kv_source) return;
    gen_add_linear(p, N("attn.indexer.wk"), LIN_BF16, s->idx_dim, s->head_dim, 1.0 / sqrt(s->head_dim));
    gen_add(p, N("attn.indexer.k_norm.weight"), DSV4_DTYPE_BF16, 1, s->idx_dim, 0, FILL_UNIFORM, 1.0, 0.1);
}

/* `Block` il (a main layer or a DSpark stage) with n_exp routed experts. */
static void add_block(struct plan *p, const struct gen_shape *s, const struct dsv4_config *c, const char *pre, int il,
                      int n_exp)
{
    const struct dsv4_layer_kind *k = &c->kind[il];
    char                          n[200];
    gen_add_block_norms(p, s, pre);
    for (int l = 0; k->engram && l < c->v41.n_engram; l++)
        if (c->v41.engram_layer[l] == il) add_engram(p, s, pre, c->v41.engram_rows[l]);
    gen_add_attn_core(p, s, pre);
    add_sources(p, s, pre, k, k->kv_source == il);
    gen_add_linear(p, N("ffn.gate"), LIN_BF16, n_exp, s->dim, 2.0 / sqrt(s->dim));
    gen_add(p, N("ffn.gate.bias"), DSV4_DTYPE_F32, 1, n_exp, 0, FILL_UNIFORM, 0, 0.1);
    gen_add_experts(p, s, pre, n_exp, LIN_FP4);
}

/* DSpark stage st (`DSparkBlock`): stage 0's main_proj / main_norm, the last one's norm,
 * Markov head and confidence head (stored bf16). */
static void add_stage(struct plan *p, const struct gen_shape *s, const struct dsv4_config *c, int st)
{
    const struct dsv4_v41_config *v = &c->v41;
    char                          pre[32], n[200];
    int                           rk = v->dspark_markov_rank;
    snprintf(pre, sizeof(pre), "mtp.%d.", st);
    add_block(p, s, c, pre, c->n_layer + st, v->dspark_n_exp);
    if (st == 0) {
        int in = v->n_dspark_target * s->dim;
        gen_add_linear(p, N("main_proj"), LIN_FP8, s->dim, in, 1.0 / sqrt(in));
        gen_add(p, N("main_norm.weight"), DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    }
    if (st < c->n_mtp - 1) return;
    gen_add(p, N("norm.weight"), DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    gen_add(p, N("markov_head.embed.weight"), DSV4_DTYPE_BF16, 2, s->vocab, rk, FILL_UNIFORM, 0, 1.0);
    gen_add_linear(p, N("markov_head.head"), LIN_BF16, s->vocab, rk, 1.0 / sqrt(rk));
    gen_add_linear(p, N("confidence_head.proj"), LIN_BF16, 1, s->dim + rk, 1.0 / sqrt(s->dim + rk));
}

#undef N

static void build_plan(struct plan *p, const struct gen_shape *s, const struct dsv4_config *c)
{
    p->shard = 0;
    gen_add(p, "embed.weight", DSV4_DTYPE_BF16, 2, s->vocab, s->dim, FILL_UNIFORM, 0, 1.0);
    gen_add_linear(p, "head", LIN_BF16, s->vocab, s->dim, 1.0 / sqrt(s->dim));
    gen_add(p, "norm.weight", DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    for (int il = 0; il < c->n_layer; il++) {
        char pre[32];
        snprintf(pre, sizeof(pre), "layers.%d.", il);
        p->shard = il + 1;
        add_block(p, s, c, pre, il, c->n_exp);
    }
    for (int st = 0; st < c->n_mtp && !p->o->no_mtp; st++) {
        p->shard = c->n_layer + 1 + st;
        add_stage(p, s, c, st);
    }
}

int gen_v41_checkpoint(const struct gen_opts *o, const char *dir, struct dsv4_err *err)
{
    if (o->fp8_experts || o->f32_scales)
        return dsv4_err_set(err, DSV4_EINVAL, "tiny-v41: --fp8-experts and --f32-scales are DeepSeek-V4 options "
                            "(V4.1 is released with FP4 experts and e8m0 scales)");
    struct gen_shape s = TINY;
    if (o->swiglu_limit >= 0) s.swiglu_limit = o->swiglu_limit;
    int rc = gen_mkdir(dir, err);
    if (rc == DSV4_OK) rc = write_config(dir, &s, err);
    struct dsv4_config *c = rc == DSV4_OK ? malloc(sizeof(*c)) : NULL;
    if (rc == DSV4_OK && !c) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    if (rc == DSV4_OK) rc = dsv4_config_load(c, dir, err); /* the layer kinds the plan follows */
    if (rc == DSV4_OK) rc = write_token_map(dir, s.vocab, c->v41.engram_cvocab, o->seed, err);
    if (rc == DSV4_OK) {
        struct plan p = { .o = o, .fp8_block = c->fp8_block };
        build_plan(&p, &s, c);
        rc = gen_write_plan(&p, dir, err);
    }
    free(c);
    return rc;
}
