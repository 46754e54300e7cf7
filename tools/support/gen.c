/*
 * gen.c - writes random-weight DeepSeek-V4 checkpoints in the official release layout.
 *
 * Layout as released (docs/MODEL.md §R2): config.json with Hugging Face field names; safetensors
 * shards (one for the globals, one per layer, one for the MTP block) and
 * model.safetensors.index.json; FP8 e4m3 projections with e8m0 128x128 block scales; routed
 * experts as I8-packed FP4 e2m1 (low nibble = even input index) with e8m0 per-32 scales;
 * BF16 norms, embedding, head, router and compressor weights; F32 hyper-connection
 * parameters, sinks, router bias and ape; I64 hash-routing tables.
 *
 * Values: quantised weights are generated directly as codes (e4m3 codes with exponents in a
 * narrow band, uniform e2m1 codes) times power-of-two block scales chosen so that every
 * projection has standard deviation ~1/sqrt(n_in): activations keep unit scale through the
 * layers and router logits are spread, so routing is not degenerate. Every tensor draws from
 * its own random stream seeded by (seed, name): output does not depend on write order, and
 * each tensor streams through a fixed buffer, so multi-GB checkpoints cost no memory.
 *
 * DeepSeek-V4.1 (--preset tiny-v41) is planned in gen_v41.c with the steps here (gen_plan.h).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/core.h"
#include "support/gen_plan.h"
#include "io/io.h"

void gen_opts_default(struct gen_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->preset       = "tiny-a";
    o->seed         = 1;
    o->layers       = 2;
    o->swiglu_limit = -1;
}

/* ------------------------------------------------------------------ model shape */

static int preset_shape(const struct gen_opts *o, struct gen_shape *s, struct dsv4_err *err)
{
    memset(s, 0, sizeof(*s));
    if (!strcmp(o->preset, "tiny-a") || !strcmp(o->preset, "tiny-b")) {
        bool b = !strcmp(o->preset, "tiny-b");
        *s     = (struct gen_shape){ .vocab = 2048, .dim = 256, .n_layers = 4, .n_mtp = 1, .n_hash = 2,
                                 .n_heads = 4, .head_dim = 128, .rope_dim = 64, .q_lora = 128, .o_groups = 2,
                                 .o_lora = 64, .window = b ? 128 : 16, .idx_heads = 4, .idx_dim = 128,
                                 .idx_topk = b ? 16 : 4, .n_exp = 8, .n_exp_used = 2, .inter = 128, .hc = 4,
                                 .max_pos = 4096, .swiglu_limit = 10.0, .route_scale = 1.5 };
        int r[5] = { 0, 4, b ? 128 : 16, 4, 0 };
        memcpy(s->ratios, r, sizeof(r));
    } else if (!strcmp(o->preset, "flash-shaped")) {
        if (o->layers < 1 || o->layers > 43)
            return dsv4_err_set(err, DSV4_EINVAL, "flash-shaped: --layers must be in [1, 43]");
        *s = (struct gen_shape){ .vocab = 129280, .dim = 4096, .n_layers = o->layers, .n_mtp = 1,
                             .n_hash = o->layers > 1 ? (o->layers - 1 < 3 ? o->layers - 1 : 3) : 0,
                             .n_heads = 64, .head_dim = 512, .rope_dim = 64, .q_lora = 1024, .o_groups = 8,
                             .o_lora = 1024, .window = 128, .idx_heads = 64, .idx_dim = 128, .idx_topk = 512,
                             .n_exp = 256, .n_exp_used = 6, .inter = 2048, .hc = 4, .max_pos = 1048576,
                             .swiglu_limit = 10.0, .route_scale = 1.5 };
        if (o->experts) {
            /* fewer experts keep more layers within a machine's memory at a layer's per-token
             * reads (the same 6 of them per token): a benchmark with V4-Flash's byte mix */
            if (o->experts < s->n_exp_used || o->experts > 256)
                return dsv4_err_set(err, DSV4_EINVAL, "flash-shaped: --experts must be in [%d, 256]", s->n_exp_used);
            s->n_exp = o->experts;
        }
        for (int i = 0; i < o->layers; i++) s->ratios[i] = (i % 2 == 0) ? 4 : 128;
        s->ratios[o->layers] = 0;
    } else {
        return dsv4_err_set(err, DSV4_EINVAL, "unknown preset '%s' (tiny-a, tiny-b, flash-shaped, tiny-v41)", o->preset);
    }
    if (o->swiglu_limit >= 0) s->swiglu_limit = o->swiglu_limit;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ tensor jobs */

double gen_e4m3_code_std(void)
{
    double ms = 0;
    for (int e = 5; e <= 9; e++)
        for (int m = 0; m < 8; m++) {
            double v = dsv4_f32_from_e4m3((uint8_t)((e << 3) | m));
            ms += v * v;
        }
    return sqrt(ms / 40);
}

static double fp4_code_std(void)
{
    double ms = 0;
    for (int c = 0; c < 16; c++) ms += (double)dsv4_f32_from_e2m1((uint8_t)c) * dsv4_f32_from_e2m1((uint8_t)c);
    return sqrt(ms / 16);
}

struct job *gen_add(struct plan *p, const char *name, enum dsv4_dtype dt, int ndim, int64_t d0, int64_t d1,
                       enum fill fill, double a, double b)
{
    if (p->n == p->cap) {
        int   nc = p->cap ? p->cap * 2 : 256;
        void *nj = realloc(p->jobs, (size_t)nc * sizeof(*p->jobs));
        if (!nj) {
            p->oom = true;
            return NULL;
        }
        p->jobs = nj;
        p->cap  = nc;
    }
    struct job *j = &p->jobs[p->n++];
    memset(j, 0, sizeof(*j));
    snprintf(j->name, sizeof(j->name), "%s", name);
    j->dtype    = dt;
    j->ndim     = ndim;
    j->shape[0] = d0;
    j->shape[1] = d1;
    j->fill     = fill;
    j->a        = a;
    j->b        = b;
    j->shard    = p->shard;
    j->seq      = p->n - 1;
    return j;
}

void gen_add_linear(struct plan *p, const char *prefix, enum lin_kind kind, int n_out, int n_in, double std)
{
    char wn[160], sn[160];
    snprintf(wn, sizeof(wn), "%s.weight", prefix);
    snprintf(sn, sizeof(sn), "%s.scale", prefix);
    enum dsv4_dtype sdt = p->o->f32_scales ? DSV4_DTYPE_F32 : DSV4_DTYPE_F8_E8M0;
    if (kind == LIN_BF16) {
        gen_add(p, wn, DSV4_DTYPE_BF16, 2, n_out, n_in, FILL_UNIFORM, 0, std);
    } else if (kind == LIN_FP8) {
        gen_add(p, wn, DSV4_DTYPE_F8_E4M3, 2, n_out, n_in, FILL_E4M3, 0, 0);
        int         b = p->fp8_block;
        struct job *j = gen_add(p, sn, sdt, 2, (n_out + b - 1) / b, (n_in + b - 1) / b, FILL_SCALE, 0, std);
        if (j) j->code_std = gen_e4m3_code_std();
    } else {
        gen_add(p, wn, DSV4_DTYPE_I8, 2, n_out, n_in / 2, FILL_FP4, 0, 0);
        struct job *j = gen_add(p, sn, sdt, 2, n_out, n_in / 32, FILL_SCALE, 0, std);
        if (j) j->code_std = fp4_code_std();
    }
}

void gen_add_hc(struct plan *p, const char *pre, const char *which, int hc, int dim)
{
    char n[160];
    int  mix = (2 + hc) * hc;
    snprintf(n, sizeof(n), "%shc_%s_fn", pre, which);
    gen_add(p, n, DSV4_DTYPE_F32, 2, mix, (int64_t)hc * dim, FILL_UNIFORM, 0, 1.0 / sqrt((double)hc * dim));
    snprintf(n, sizeof(n), "%shc_%s_base", pre, which);
    gen_add(p, n, DSV4_DTYPE_F32, 1, mix, 0, FILL_UNIFORM, 0, 0.5);
    snprintf(n, sizeof(n), "%shc_%s_scale", pre, which);
    gen_add(p, n, DSV4_DTYPE_F32, 1, 3, 0, FILL_UNIFORM, 1.0, 0.25);
}

void gen_add_block_norms(struct plan *p, const struct gen_shape *s, const char *pre)
{
    char n[200];
    snprintf(n, sizeof(n), "%sattn_norm.weight", pre);
    gen_add(p, n, DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    snprintf(n, sizeof(n), "%sffn_norm.weight", pre);
    gen_add(p, n, DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    gen_add_hc(p, pre, "attn", s->hc, s->dim);
    gen_add_hc(p, pre, "ffn", s->hc, s->dim);
}

void gen_add_attn_core(struct plan *p, const struct gen_shape *s, const char *pre)
{
    char          n[200];
    enum lin_kind q = LIN_FP8;
#define N(suffix) (snprintf(n, sizeof(n), "%s%s", pre, suffix), n)
    gen_add(p, N("attn.attn_sink"), DSV4_DTYPE_F32, 1, s->n_heads, 0, FILL_UNIFORM, 0, 1.0);
    gen_add_linear(p, N("attn.wq_a"), q, s->q_lora, s->dim, 1.0 / sqrt(s->dim));
    gen_add(p, N("attn.q_norm.weight"), DSV4_DTYPE_BF16, 1, s->q_lora, 0, FILL_UNIFORM, 1.0, 0.1);
    gen_add_linear(p, N("attn.wq_b"), q, s->n_heads * s->head_dim, s->q_lora, 1.0 / sqrt(s->q_lora));
    gen_add_linear(p, N("attn.wkv"), q, s->head_dim, s->dim, 1.0 / sqrt(s->dim));
    gen_add(p, N("attn.kv_norm.weight"), DSV4_DTYPE_BF16, 1, s->head_dim, 0, FILL_UNIFORM, 1.0, 0.1);
    int wo_in = s->n_heads * s->head_dim / s->o_groups;
    gen_add_linear(p, N("attn.wo_a"), q, s->o_groups * s->o_lora, wo_in, 1.0 / sqrt(wo_in));
    gen_add_linear(p, N("attn.wo_b"), q, s->dim, s->o_groups * s->o_lora, 1.0 / sqrt(s->o_groups * s->o_lora));
#undef N
}

void gen_add_experts(struct plan *p, const struct gen_shape *s, const char *pre, int n_exp, enum lin_kind ek)
{
    char n[200];
    snprintf(n, sizeof(n), "%sffn.shared_experts.w1", pre);
    gen_add_linear(p, n, LIN_FP8, s->inter, s->dim, 1.0 / sqrt(s->dim));
    snprintf(n, sizeof(n), "%sffn.shared_experts.w3", pre);
    gen_add_linear(p, n, LIN_FP8, s->inter, s->dim, 1.0 / sqrt(s->dim));
    snprintf(n, sizeof(n), "%sffn.shared_experts.w2", pre);
    gen_add_linear(p, n, LIN_FP8, s->dim, s->inter, 1.0 / sqrt(s->inter));
    for (int e = 0; e < n_exp; e++) {
        snprintf(n, sizeof(n), "%sffn.experts.%d.w1", pre, e);
        gen_add_linear(p, n, ek, s->inter, s->dim, 1.0 / sqrt(s->dim));
        snprintf(n, sizeof(n), "%sffn.experts.%d.w3", pre, e);
        gen_add_linear(p, n, ek, s->inter, s->dim, 1.0 / sqrt(s->dim));
        snprintf(n, sizeof(n), "%sffn.experts.%d.w2", pre, e);
        gen_add_linear(p, n, ek, s->dim, s->inter, 1.0 / sqrt(s->inter));
    }
}

static void add_compressor(struct plan *p, const char *pre, int ratio, int d_out, const struct gen_shape *s)
{
    char n[160];
    int  coff = ratio == 4 ? 2 : 1;
    snprintf(n, sizeof(n), "%s.ape", pre);
    gen_add(p, n, DSV4_DTYPE_F32, 2, ratio, (int64_t)coff * d_out, FILL_UNIFORM, 0, 0.5);
    snprintf(n, sizeof(n), "%s.wkv", pre);
    gen_add_linear(p, n, LIN_BF16, coff * d_out, s->dim, 1.0 / sqrt(s->dim));
    snprintf(n, sizeof(n), "%s.wgate", pre);
    gen_add_linear(p, n, LIN_BF16, coff * d_out, s->dim, 1.0 / sqrt(s->dim));
    snprintf(n, sizeof(n), "%s.norm.weight", pre);
    gen_add(p, n, DSV4_DTYPE_BF16, 1, d_out, 0, FILL_UNIFORM, 1.0, 0.1);
}

static void add_layer(struct plan *p, const struct gen_shape *s, const char *pre, int il, bool mtp)
{
    char n[200];
    int  ratio = s->ratios[il];
    enum lin_kind q = LIN_FP8, ek = p->o->fp8_experts ? LIN_FP8 : LIN_FP4;
#define N(suffix) (snprintf(n, sizeof(n), "%s%s", pre, suffix), n)
    gen_add_block_norms(p, s, pre);
    gen_add_attn_core(p, s, pre);
    if (ratio) add_compressor(p, N("attn.compressor"), ratio, s->head_dim, s);
    if (ratio == 4) {
        gen_add_linear(p, N("attn.indexer.wq_b"), q, s->idx_heads * s->idx_dim, s->q_lora, 1.0 / sqrt(s->q_lora));
        gen_add_linear(p, N("attn.indexer.weights_proj"), LIN_BF16, s->idx_heads, s->dim, 1.0 / sqrt(s->dim));
        add_compressor(p, N("attn.indexer.compressor"), ratio, s->idx_dim, s);
    }
    gen_add_linear(p, N("ffn.gate"), LIN_BF16, s->n_exp, s->dim, 2.0 / sqrt(s->dim));
    if (!mtp && il < s->n_hash) {
        struct job *j = gen_add(p, N("ffn.gate.tid2eid"), DSV4_DTYPE_I64, 2, s->vocab, s->n_exp_used, FILL_TID2EID, 0, 0);
        if (j) j->n_exp = s->n_exp;
    } else {
        gen_add(p, N("ffn.gate.bias"), DSV4_DTYPE_F32, 1, s->n_exp, 0, FILL_UNIFORM, 0, 0.1);
    }
    gen_add_experts(p, s, pre, s->n_exp, ek);
    if (mtp) {
        gen_add_linear(p, N("e_proj"), q, s->dim, s->dim, 1.0 / sqrt(s->dim));
        gen_add_linear(p, N("h_proj"), q, s->dim, s->dim, 1.0 / sqrt(s->dim));
        gen_add(p, N("enorm.weight"), DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
        gen_add(p, N("hnorm.weight"), DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
        gen_add(p, N("norm.weight"), DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
        gen_add(p, N("hc_head_fn"), DSV4_DTYPE_F32, 2, s->hc, (int64_t)s->hc * s->dim, FILL_UNIFORM, 0,
            1.0 / sqrt((double)s->hc * s->dim));
        gen_add(p, N("hc_head_base"), DSV4_DTYPE_F32, 1, s->hc, 0, FILL_UNIFORM, 0, 0.5);
        gen_add(p, N("hc_head_scale"), DSV4_DTYPE_F32, 1, 1, 0, FILL_UNIFORM, 1.0, 0.25);
    }
#undef N
}

static void build_plan(struct plan *p, const struct gen_shape *s)
{
    p->shard = 0;
    gen_add(p, "embed.weight", DSV4_DTYPE_BF16, 2, s->vocab, s->dim, FILL_UNIFORM, 0, 1.0);
    gen_add_linear(p, "head", LIN_BF16, s->vocab, s->dim, 1.0 / sqrt(s->dim));
    gen_add(p, "norm.weight", DSV4_DTYPE_BF16, 1, s->dim, 0, FILL_UNIFORM, 1.0, 0.1);
    gen_add(p, "hc_head_fn", DSV4_DTYPE_F32, 2, s->hc, (int64_t)s->hc * s->dim, FILL_UNIFORM, 0,
        1.0 / sqrt((double)s->hc * s->dim));
    gen_add(p, "hc_head_base", DSV4_DTYPE_F32, 1, s->hc, 0, FILL_UNIFORM, 0, 0.5);
    gen_add(p, "hc_head_scale", DSV4_DTYPE_F32, 1, 1, 0, FILL_UNIFORM, 1.0, 0.25);
    for (int il = 0; il < s->n_layers; il++) {
        char pre[32];
        snprintf(pre, sizeof(pre), "layers.%d.", il);
        p->shard = il + 1;
        add_layer(p, s, pre, il, false);
    }
    if (s->n_mtp && !p->o->no_mtp) {
        p->shard = s->n_layers + 1;
        add_layer(p, s, "mtp.0.", s->n_layers, true);
    }
}

/* ------------------------------------------------------------------ filling */

struct rng {
    uint64_t s;
};

static uint64_t rng_u64(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unit(struct rng *r) /* uniform in [-1, 1) */
{
    return (double)(rng_u64(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

enum { CHUNK = 1 << 20 };

static int fill_job(struct dsv4_st_writer *w, const struct job *j, unsigned long long seed, uint8_t *buf,
                    struct dsv4_err *err)
{
    struct rng r = { dsv4_hash_bytes(j->name, strlen(j->name), seed) };
    uint64_t   numel = 1;
    for (int i = 0; i < j->ndim; i++) numel *= (uint64_t)j->shape[i];
    size_t   es = dsv4_dtype_size(j->dtype);
    uint64_t done = 0;
    uint64_t row = j->ndim == 2 ? (uint64_t)j->shape[1] : 0;
    while (done < numel) {
        uint64_t n = numel - done;
        if (n * es > CHUNK) n = CHUNK / es;
        if (j->fill == FILL_TID2EID && n % row) n -= n % row;
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *dst = buf + i * es;
            switch (j->fill) {
            case FILL_UNIFORM: {
                double v = j->a + rng_unit(&r) * sqrt(3.0) * j->b;
                if (j->dtype == DSV4_DTYPE_BF16) {
                    uint16_t h = dsv4_bf16_from_f32((float)v);
                    memcpy(dst, &h, 2);
                } else {
                    float f = (float)v;
                    memcpy(dst, &f, 4);
                }
                break;
            }
            case FILL_E4M3: {
                uint64_t x = rng_u64(&r);
                *dst = (uint8_t)((x & 0x80) | ((5 + (x >> 8) % 5) << 3) | ((x >> 16) & 7));
                break;
            }
            case FILL_FP4:
                *dst = (uint8_t)rng_u64(&r);
                break;
            case FILL_SCALE: {
                int e = (int)lround(log2(j->b / j->code_std)) + (int)(rng_u64(&r) % 3) - 1;
                if (j->dtype == DSV4_DTYPE_F8_E8M0) {
                    *dst = (uint8_t)(127 + e);
                } else {
                    float f = ldexpf(1.0f, e) * (float)(1.0 + 0.25 * rng_unit(&r));
                    memcpy(dst, &f, 4);
                }
                break;
            }
            case FILL_TID2EID: {
                /* one row of b distinct ids: a partial Fisher-Yates shuffle */
                int perm[4096];
                for (int e = 0; e < j->n_exp; e++) perm[e] = e;
                for (uint64_t k = 0; k < row; k++) {
                    int     pick = (int)k + (int)(rng_u64(&r) % (uint64_t)(j->n_exp - (int)k));
                    int     tmp  = perm[k];
                    perm[k]      = perm[pick];
                    perm[pick]   = tmp;
                    int64_t v    = perm[k];
                    memcpy(buf + (i + k) * 8, &v, 8);
                }
                i += row - 1;
                break;
            }
            }
        }
        int rc = dsv4_st_writer_write(w, buf, (size_t)(n * es), err);
        if (rc) return rc;
        done += n;
    }
    return DSV4_OK;
}

/* ------------------------------------------------------------------ config.json */

static int write_config(const char *dir, const struct gen_shape *s, const struct gen_opts *o, struct dsv4_err *err)
{
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "DeepseekV4ForCausalLM"));
    json_object_set_new(c, "model_type", json_string("deepseek_v4"));
    json_object_set_new(c, "vocab_size", json_integer(s->vocab));
    json_object_set_new(c, "hidden_size", json_integer(s->dim));
    json_object_set_new(c, "num_hidden_layers", json_integer(s->n_layers));
    json_object_set_new(c, "num_attention_heads", json_integer(s->n_heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(1));
    json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_object_set_new(c, "qk_rope_head_dim", json_integer(s->rope_dim));
    json_object_set_new(c, "q_lora_rank", json_integer(s->q_lora));
    json_object_set_new(c, "o_lora_rank", json_integer(s->o_lora));
    json_object_set_new(c, "o_groups", json_integer(s->o_groups));
    json_object_set_new(c, "sliding_window", json_integer(s->window));
    json_t *cr = json_array();
    for (int i = 0; i < s->n_layers + s->n_mtp; i++) json_array_append_new(cr, json_integer(s->ratios[i]));
    json_object_set_new(c, "compress_ratios", cr);
    json_object_set_new(c, "compress_rope_theta", json_real(160000.0));
    json_object_set_new(c, "rope_theta", json_real(10000.0));
    json_object_set_new(c, "rope_scaling",
                        json_pack("{s:s, s:f, s:i, s:i, s:i}", "type", "yarn", "factor", 16.0,
                                  "original_max_position_embeddings", 65536, "beta_fast", 32, "beta_slow", 1));
    json_object_set_new(c, "max_position_embeddings", json_integer(s->max_pos));
    json_object_set_new(c, "index_n_heads", json_integer(s->idx_heads));
    json_object_set_new(c, "index_head_dim", json_integer(s->idx_dim));
    json_object_set_new(c, "index_topk", json_integer(s->idx_topk));
    json_object_set_new(c, "n_routed_experts", json_integer(s->n_exp));
    json_object_set_new(c, "n_shared_experts", json_integer(1));
    json_object_set_new(c, "num_experts_per_tok", json_integer(s->n_exp_used));
    json_object_set_new(c, "moe_intermediate_size", json_integer(s->inter));
    json_object_set_new(c, "num_hash_layers", json_integer(s->n_hash));
    json_object_set_new(c, "scoring_func", json_string("sqrtsoftplus"));
    json_object_set_new(c, "routed_scaling_factor", json_real(s->route_scale));
    json_object_set_new(c, "norm_topk_prob", json_true());
    json_object_set_new(c, "topk_method", json_string("noaux_tc"));
    json_object_set_new(c, "swiglu_limit", json_real(s->swiglu_limit));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hc_mult", json_integer(s->hc));
    json_object_set_new(c, "hc_sinkhorn_iters", json_integer(20));
    json_object_set_new(c, "hc_eps", json_real(1e-6));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "num_nextn_predict_layers", json_integer(s->n_mtp));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "bos_token_id", json_integer(0));
    json_object_set_new(c, "eos_token_id", json_integer(1));
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(c, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "scale_fmt", "ue8m0", "weight_block_size", 128,
                                  128));
    if (!o->fp8_experts) json_object_set_new(c, "expert_dtype", json_string("fp4"));
    char *path = dsv4_path_join(dir, "config.json");
    int   rc   = json_dump_file(c, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    int ret = rc == 0 ? DSV4_OK : dsv4_err_set(err, DSV4_EIO, "cannot write %s", path);
    free(path);
    return ret;
}

/* ------------------------------------------------------------------ driver */

static enum dsv4_dtype other_dtype(enum dsv4_dtype t)
{
    switch (t) {
    case DSV4_DTYPE_BF16:    return DSV4_DTYPE_F16;
    case DSV4_DTYPE_F32:     return DSV4_DTYPE_I32;
    case DSV4_DTYPE_F8_E4M3: return DSV4_DTYPE_F8_E5M2;
    case DSV4_DTYPE_F8_E8M0: return DSV4_DTYPE_U8;
    case DSV4_DTYPE_I8:      return DSV4_DTYPE_BOOL;
    case DSV4_DTYPE_I64:     return DSV4_DTYPE_F64;
    default:                 return DSV4_DTYPE_U8;
    }
}

static int cmp_job(const void *a, const void *b)
{
    const struct job *x = a, *y = b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    size_t ex = dsv4_dtype_size(x->dtype), ey = dsv4_dtype_size(y->dtype);
    if (ex != ey) return ex > ey ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq); /* keep declaration order */
}

int gen_mkdir(const char *dir, struct dsv4_err *err)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return dsv4_err_set(err, DSV4_EIO, "cannot create directory %s: %s", dir, strerror(errno));
    return DSV4_OK;
}

int gen_checkpoint(const struct gen_opts *o, const char *dir, struct dsv4_err *err)
{
    if (!strcmp(o->preset, "tiny-v41")) return gen_v41_checkpoint(o, dir, err);
    struct gen_shape s;
    int          rc = preset_shape(o, &s, err);
    if (rc == DSV4_OK) rc = gen_mkdir(dir, err);
    if (rc) return rc;
    struct plan p = { .o = o, .fp8_block = 128 };
    build_plan(&p, &s);
    rc = write_config(dir, &s, o, err);
    if (rc) {
        free(p.jobs);
        return rc;
    }
    return gen_write_plan(&p, dir, err);
}

int gen_write_plan(struct plan *p_, const char *dir, struct dsv4_err *err)
{
    struct plan            p  = *p_;
    const struct gen_opts *o  = p.o;
    int                    rc = DSV4_OK;
    if (o->extra_tensor) gen_add(&p, o->extra_tensor, DSV4_DTYPE_F32, 1, 4, 0, FILL_UNIFORM, 0, 1);
    if (p.oom) {
        free(p.jobs);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory planning the checkpoint");
    }
    int n_shards = 0;
    for (int i = 0; i < p.n; i++) {
        if (o->single_file) p.jobs[i].shard = 0;
        if (p.jobs[i].shard + 1 > n_shards) n_shards = p.jobs[i].shard + 1;
    }
    /* within a shard, larger elements first (stable): every tensor stays aligned to its element
     * size, as the reference safetensors writer arranges it */
    qsort(p.jobs, (size_t)p.n, sizeof(*p.jobs), cmp_job);
    uint8_t *buf   = malloc(CHUNK);
    json_t  *wmap  = json_object();
    uint64_t total = 0;
    if (!buf) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (int sh = 0; sh < n_shards && rc == DSV4_OK; sh++) {
        char fname[64];
        if (o->single_file) snprintf(fname, sizeof(fname), "model.safetensors");
        else snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        char *path = dsv4_path_join(dir, fname);
        struct dsv4_st_writer *w;
        rc = dsv4_st_writer_open(&w, path, err);
        if (rc) {
            free(path);
            break;
        }
        if (!o->quiet) fprintf(stderr, "  writing %s\n", path);
        free(path);
        for (int i = 0; i < p.n && rc == DSV4_OK; i++) {
            struct job *j = &p.jobs[i];
            if (j->shard != sh || (o->drop_tensor && !strcmp(j->name, o->drop_tensor))) continue;
            int64_t         shape[2] = { j->shape[0], j->shape[1] };
            enum dsv4_dtype dt       = j->dtype;
            if (o->bad_shape && !strcmp(j->name, o->bad_shape)) shape[0] += 1;
            if (o->bad_dtype && !strcmp(j->name, o->bad_dtype)) dt = other_dtype(dt);
            rc = dsv4_st_writer_add(w, j->name, dt, j->ndim, shape, err);
            json_object_set_new(wmap, j->name, json_string(fname));
        }
        for (int i = 0; i < p.n && rc == DSV4_OK; i++) {
            struct job *j = &p.jobs[i];
            if (j->shard != sh || (o->drop_tensor && !strcmp(j->name, o->drop_tensor))) continue;
            struct job jj = *j;
            if (o->bad_shape && !strcmp(j->name, o->bad_shape)) jj.shape[0] += 1;
            rc = fill_job(w, &jj, o->seed, buf, err);
            uint64_t nb = dsv4_dtype_size(jj.dtype);
            for (int d = 0; d < jj.ndim; d++) nb *= (uint64_t)jj.shape[d];
            total += nb;
        }
        if (rc) dsv4_st_writer_abort(w);
        else rc = dsv4_st_writer_close(w, err);
    }
    if (rc == DSV4_OK && !o->single_file) {
        json_t *idx = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        char   *ip  = dsv4_path_join(dir, "model.safetensors.index.json");
        if (json_dump_file(idx, ip, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
            rc = dsv4_err_set(err, DSV4_EIO, "cannot write %s", ip);
        free(ip);
        json_decref(idx);
    }
    json_decref(wmap);
    free(buf);
    free(p.jobs);
    return rc;
}
