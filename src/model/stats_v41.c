/*
 * stats_v41.c - the sizes of a DeepSeek-V4.1 model from its config alone (`dsv4 inspect
 * --config`): parameters and bytes of the release's tensors, the Engram tables apart, bytes
 * read per decoded token, and the KV state per sequence.
 *
 * Each tensor is counted with the shape and dtype the official inference/model.py creates
 * (its class names below) and the release stores (docs/MODEL.md "DeepSeek-V4.1", "Sizes"):
 *   FP8 projection [out, in]  in*out e4m3 bytes + ceil(out/32)*ceil(in/32) e8m0 scales
 *                             (`Linear`, fp8_block_size 32: one scale per 32x32 block)
 *   FP4 expert [out, in]      in*out/2 bytes (two e2m1 a byte) + out*in/32 e8m0 scales
 *   BF16 / F32                2 / 4 bytes an element: the compressor, the indexer's
 *                             weights_proj, wk and k_norm, the router, norms, embeddings and
 *                             head (stored bf16, as V4's), the DSpark heads, Engram q/k
 *                             weights; f32 attn_sink, router bias and hyper-connection tensors
 *   (model.py keeps wo_a in bf16 after converting it; the release stores it FP8, as V4's.)
 *   Engram table [rows, d]    rows*d e4m3 + rows*d/32 e8m0 (`ParallelEngramEmbedding`)
 * Scales are bytes, not parameters. Not counted: the vision tower and the routers' image bias
 * (`Gate.bias_vl`), which serve image input only (out of scope).
 */
#include <string.h>

#include "model/model.h"

struct acc {
    struct dsv4_v41_sizes *s;
    bool                   dspark; /* counting a DSpark stage (not read by plain decoding) */
};

/* Adds n tensors of params parameters and bytes bytes, of which a decoded token reads read
 * bytes and touches active parameters (a DSpark stage's: none, plain decoding skips them). */
static void put(struct acc *a, int n, uint64_t params, uint64_t bytes, uint64_t read, uint64_t active)
{
    struct dsv4_v41_sizes *s = a->s;
    s->params += params;
    s->bytes += bytes;
    s->n_tensors += (uint64_t)n;
    if (a->dspark) {
        s->dspark_params += params;
        s->dspark_bytes += bytes;
        return;
    }
    s->bytes_per_token += read;
    s->active_params += active;
}

/* A vector or table of n elements of esize bytes, read whole. */
static void dense(struct acc *a, uint64_t n, uint64_t esize)
{
    put(a, 1, n, n * esize, n * esize, n);
}

static uint64_t cdiv(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* Bytes of a projection [out, in] in format f, its scales included. */
static uint64_t lin_bytes(enum dsv4_wfmt f, uint64_t in, uint64_t out)
{
    switch (f) {
    case DSV4_WFMT_FP8: return in * out + cdiv(out, 32) * cdiv(in, 32);
    case DSV4_WFMT_FP4: return in * out / 2 + out * (in / 32);
    case DSV4_WFMT_F32: return in * out * 4;
    case DSV4_WFMT_BF16: break;
    }
    return in * out * 2;
}

/* A projection [out, in] in format f, read whole: its weight and (FP8, FP4) its scales. */
static void linear(struct acc *a, enum dsv4_wfmt f, uint64_t in, uint64_t out)
{
    uint64_t b = lin_bytes(f, in, out);
    put(a, f == DSV4_WFMT_FP8 || f == DSV4_WFMT_FP4 ? 2 : 1, in * out, b, b, in * out);
}

/* `Attention` (and `DSparkAttention`, which has no compressor or indexer): the compressor on
 * a kv source (`Compressor`: wkv, wgate above ratio 1, norm; no APE), the indexer on an index
 * source (`Indexer`: wq_b, weights_proj, and on a kv source wk and k_norm). */
static void attention(struct acc *a, const struct dsv4_config *c, int il)
{
    const struct dsv4_layer_kind *k = &c->kind[il];
    uint64_t dm = (uint64_t)c->d_model, dh = (uint64_t)c->d_head, hd = (uint64_t)c->n_head * dh;
    uint64_t og = (uint64_t)c->o_groups * (uint64_t)c->o_lora_rank, qr = (uint64_t)c->q_lora_rank;
    dense(a, (uint64_t)c->n_head, 4);                         /* attn_sink */
    linear(a, c->wfmt, dm, qr);                               /* wq_a */
    dense(a, qr, 2);                                          /* q_norm */
    linear(a, c->wfmt, qr, hd);                               /* wq_b */
    linear(a, c->wfmt, dm, dh);                               /* wkv */
    dense(a, dh, 2);                                          /* kv_norm */
    linear(a, c->wfmt, hd / (uint64_t)c->o_groups, og);       /* wo_a (stored FP8, as V4's) */
    linear(a, c->wfmt, og, dm);                               /* wo_b */
    if (k->kv_source == il) {
        linear(a, DSV4_WFMT_BF16, dm, dh);                    /* compressor.wkv */
        if (k->ratio > 1) linear(a, DSV4_WFMT_BF16, dm, dh);  /* compressor.wgate */
        dense(a, dh, 2);                                      /* compressor.norm */
    }
    if (k->indexer) {
        uint64_t di = (uint64_t)c->d_idx_head;
        linear(a, c->wfmt, qr, (uint64_t)c->n_idx_head * di); /* indexer.wq_b */
        linear(a, DSV4_WFMT_BF16, dm, (uint64_t)c->n_idx_head); /* indexer.weights_proj */
        if (k->kv_source == il) {
            linear(a, DSV4_WFMT_BF16, dh, di);                /* indexer.wk */
            dense(a, di, 2);                                  /* indexer.k_norm */
        }
    }
}

/* `MoE`: the router (`Gate`: weight, bias), n_exp routed experts (w1, w3 [d_ff, d_model],
 * w2 [d_model, d_ff]) of which a token reads n_used, and the shared expert (in the
 * projections' format). */
static void moe(struct acc *a, const struct dsv4_config *c, int n_exp, int n_used)
{
    uint64_t       dm = (uint64_t)c->d_model, ff = (uint64_t)c->d_ff_exp;
    enum dsv4_wfmt f  = c->expert_wfmt;
    uint64_t       p1 = 3 * dm * ff, b1 = 2 * lin_bytes(f, dm, ff) + lin_bytes(f, ff, dm);
    int            nt = 3 * (f == DSV4_WFMT_FP8 || f == DSV4_WFMT_FP4 ? 2 : 1);
    dense(a, (uint64_t)n_exp * dm, 2);
    dense(a, (uint64_t)n_exp, 4);
    put(a, nt * n_exp, p1 * (uint64_t)n_exp, b1 * (uint64_t)n_exp, b1 * (uint64_t)n_used, p1 * (uint64_t)n_used);
    if (!a->dspark) a->s->expert_bytes_per_token += b1 * (uint64_t)n_used;
    linear(a, c->wfmt, dm, ff);
    linear(a, c->wfmt, ff, dm);
    linear(a, c->wfmt, dm, ff);
}

/* `Engram`: the table (rows the token's hashes pick: (max_ngram - 1) * n_heads of them), wkv
 * to hc keys and a value, and the q / k gate weights. */
static void engram(struct acc *a, const struct dsv4_config *c, int il)
{
    const struct dsv4_v41_config *v = &c->v41;
    int                           l = 0;
    while (l < v->n_engram && v->engram_layer[l] != il) l++;
    uint64_t d = (uint64_t)v->engram_d_head, rows = (uint64_t)v->engram_rows[l];
    uint64_t cols = (uint64_t)(v->engram_max_ngram - 1) * (uint64_t)v->engram_n_head;
    uint64_t row_bytes = d + d / 32;
    put(a, 2, rows * d, rows * row_bytes, 0, cols * d); /* embed.weight, embed.scale: the rows apart */
    a->s->engram_params += rows * d;
    a->s->engram_bytes += rows * row_bytes;
    a->s->engram_bytes_per_token += cols * row_bytes;
    uint64_t hc = (uint64_t)c->hc, dm = (uint64_t)c->d_model;
    linear(a, c->wfmt, cols * d, dm * (hc + 1));
    dense(a, hc * dm, 2); /* q_weight */
    dense(a, hc * dm, 2); /* k_weight */
}

/* `Block`: attention, MoE, the two norms and the hyper-connection mixes (no hc_head). */
static void block(struct acc *a, const struct dsv4_config *c, int il, int n_exp, int n_used)
{
    uint64_t hc = (uint64_t)c->hc, dm = (uint64_t)c->d_model, mix = (2 + hc) * hc;
    if (c->kind[il].engram) engram(a, c, il);
    attention(a, c, il);
    moe(a, c, n_exp, n_used);
    for (int s = 0; s < 2; s++) { /* attn / ffn */
        dense(a, dm, 2);          /* *_norm */
        dense(a, mix * hc * dm, 4);
        dense(a, mix, 4);
        dense(a, 3, 4);
    }
}

/* `DSparkBlock` stage s: a block with the DSpark experts; stage 0 adds main_proj and
 * main_norm, the last the final norm, `DSparkMarkovHead` (embed, head) and
 * `DSparkConfidenceHead` (proj, stored bf16). */
static void dspark_stage(struct acc *a, const struct dsv4_config *c, int s)
{
    const struct dsv4_v41_config *v  = &c->v41;
    uint64_t                      dm = (uint64_t)c->d_model, rk = (uint64_t)v->dspark_markov_rank;
    block(a, c, c->n_layer + s, v->dspark_n_exp, v->dspark_n_exp_used);
    if (s == 0) {
        linear(a, c->wfmt, dm * (uint64_t)v->n_dspark_target, dm);
        dense(a, dm, 2);
    }
    if (s == c->n_mtp - 1) {
        dense(a, dm, 2);
        dense(a, (uint64_t)c->vocab_size * rk, 2);
        dense(a, (uint64_t)c->vocab_size * rk, 2);
        dense(a, dm + rk, 2);
    }
}

/* KV per sequence as the official code keeps it: per main layer a ring of `window` rows in
 * FP8 (e4m3 + an e8m0 scale per 32, `_window_kv`); per kv source a row per `ratio`
 * positions of compressed KV in FP4 (e2m1 + an e4m3 scale per 16) and of index keys in FP4
 * (e2m1 + an e8m0 scale per 32), and above ratio 1 the compressor's partial group (kv_state,
 * score_state: ratio x d_head f32 each). */
static void kv(const struct dsv4_config *c, struct dsv4_v41_sizes *s)
{
    uint64_t dh = (uint64_t)c->d_head, di = (uint64_t)c->d_idx_head;
    for (int il = 0; il < c->n_layer; il++) {
        const struct dsv4_layer_kind *k = &c->kind[il];
        s->kv_fixed_per_seq += (uint64_t)k->window * (dh + dh / 32);
        if (k->kv_source != il) continue;
        s->kv_bytes_per_position += (double)(dh / 2 + dh / 16 + di / 2 + di / 32) / k->ratio;
        if (k->ratio > 1) s->kv_fixed_per_seq += 2 * (uint64_t)k->ratio * dh * sizeof(float);
    }
}

void dsv4_v41_sizes(const struct dsv4_config *c, struct dsv4_v41_sizes *s)
{
    memset(s, 0, sizeof(*s));
    struct acc a  = { s, false };
    uint64_t   dm = (uint64_t)c->d_model, vocab = (uint64_t)c->vocab_size;
    put(&a, 1, vocab * dm, vocab * dm * 2, dm * 2, dm); /* embed: a token reads its row */
    for (int il = 0; il < c->n_layer; il++) block(&a, c, il, c->n_exp, c->n_exp_used);
    dense(&a, dm, 2);         /* norm */
    dense(&a, vocab * dm, 2); /* head */
    a.dspark = true;
    for (int st = 0; st < c->n_mtp; st++) dspark_stage(&a, c, st);
    kv(c, s);
}
