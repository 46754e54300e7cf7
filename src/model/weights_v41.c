/*
 * weights_v41.c - binds a DeepSeek-V4.1 checkpoint's tensors, each checked by name, dtype and
 * shape with weights.c's binder (weights_bind.h), every problem named.
 *
 * The names, shapes and dtypes are those of the official inference/model.py state dict
 * (docs/MODEL.md "DeepSeek-V4.1"; src/model/stats_v41.c counts the same tensors):
 *   embed.weight, head.weight [vocab, d_model] bf16, norm.weight; no hc_head (lagged mixes)
 *   layers.N.attn.*   as V4's (`Attention`), FP8 with an e8m0 scale per 32x32 block (wo_a too,
 *                     as the release stores it); compressor.{wkv, wgate, norm} on kv sources only,
 *                     no ape, no wgate at ratio 1 (`Compressor`); indexer.{wq_b, weights_proj}
 *                     on index sources, + indexer.{wk, k_norm} on kv sources (`Indexer.owns_k`)
 *   layers.N.ffn.*    gate.{weight, bias} (no hash routing), shared_experts, experts (`MoE`)
 *   layers.N.engram.* embed.{weight e4m3 [rows, d], scale e8m0 [rows, d/32]}, wkv, q_weight,
 *                     k_weight [hc, d_model] bf16 (`Engram`, `ParallelEngramEmbedding`)
 *   mtp.S.*           a window-only block with dspark_n_routed_experts experts (`DSparkBlock`);
 *                     stage 0 main_proj, main_norm; the last norm, markov_head.{embed, head},
 *                     confidence_head.proj [1, d_model + rank] (stored bf16)
 * The stages share the model's embed and head (model.py assigns the modules): not stored again.
 * With a vision_config, the routers' bias_vl and the image tensors too (accept_vision).
 */
#include <stdio.h>
#include <string.h>

#include "model/weights_bind.h"

#define NAME(suffix) (snprintf(n, sizeof(n), "%s%s", p, suffix), n)

/* `Compressor` on a kv source: wkv, wgate above ratio 1 (a softmax over ratio tokens), norm. */
static void bind_compressor(struct dsv4_binder *b, struct dsv4_compressor_w *cw, const char *p, int ratio)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    cw->ratio = ratio;
    cw->d_out = c->d_head;
    cw->coff  = 1;
    dsv4_bind_linear(b, &cw->wkv, NAME("attn.compressor.wkv"), DSV4_WFMT_BF16, c->d_head, c->d_model);
    if (ratio > 1) dsv4_bind_linear(b, &cw->wgate, NAME("attn.compressor.wgate"), DSV4_WFMT_BF16, c->d_head, c->d_model);
    cw->norm = dsv4_bind_expect_data(b, NAME("attn.compressor.norm.weight"), DSV4_DT(BF16), 1, c->d_head, 0);
}

/* `Indexer` on an index source; its keys' projection only where it owns them (a kv source). */
static void bind_indexer(struct dsv4_binder *b, struct dsv4_indexer_w *ix, const char *p, bool owns_k)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    dsv4_bind_linear(b, &ix->wq_b, NAME("attn.indexer.wq_b"), c->wfmt, c->n_idx_head * c->d_idx_head, c->q_lora_rank);
    dsv4_bind_linear(b, &ix->weights_proj, NAME("attn.indexer.weights_proj"), DSV4_WFMT_BF16, c->n_idx_head,
                     c->d_model);
    if (!owns_k) return;
    dsv4_bind_linear(b, &ix->wk, NAME("attn.indexer.wk"), DSV4_WFMT_BF16, c->d_idx_head, c->d_head);
    ix->k_norm = dsv4_bind_expect_data(b, NAME("attn.indexer.k_norm.weight"), DSV4_DT(BF16), 1, c->d_idx_head, 0);
}

/* `Engram` of layer il: its table (l-th Engram layer's rows) stays mapped, never copied. */
static void bind_engram(struct dsv4_binder *b, struct dsv4_engram_w *e, const char *p, int il)
{
    const struct dsv4_config     *c = b->cfg;
    const struct dsv4_v41_config *v = &c->v41;
    char                          n[160];
    int                           l = 0;
    while (l < v->n_engram - 1 && v->engram_layer[l] != il) l++;
    int d = v->engram_d_head, cols = (v->engram_max_ngram - 1) * v->engram_n_head;
    e->rows = v->engram_rows[l];
    const struct dsv4_tensor *t = dsv4_bind_expect(b, NAME("engram.embed.weight"), DSV4_DT(F8_E4M3), 2, e->rows, d);
    const struct dsv4_tensor *s = dsv4_bind_expect(b, NAME("engram.embed.scale"), DSV4_DT(F8_E8M0), 2, e->rows, d / 32);
    e->table = t ? t->data : NULL;
    e->scale = s ? s->data : NULL;
    dsv4_bind_linear(b, &e->wkv, NAME("engram.wkv"), c->wfmt, (c->hc + 1) * c->d_model, cols * d);
    e->q_weight = dsv4_bind_expect_data(b, NAME("engram.q_weight"), DSV4_DT(BF16), 2, c->hc, c->d_model);
    e->k_weight = dsv4_bind_expect_data(b, NAME("engram.k_weight"), DSV4_DT(BF16), 2, c->hc, c->d_model);
}

/* `Block` il under prefix p ("layers.N." or "mtp.S."): Engram, attention and its compressor
 * and indexer by the layer's kind, the MoE with n_exp routed experts, norms and mixes. */
static void bind_block(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p, int il, int n_exp)
{
    const struct dsv4_config *c = b->cfg;
    char                      n[160];
    L->il   = il;
    L->kind = c->kind[il];
    dsv4_bind_block_common(b, L, p);
    if (L->kind.engram) bind_engram(b, &L->engram, p, il);
    dsv4_bind_attn_core(b, L, p);
    if (L->kind.kv_source == il) bind_compressor(b, &L->comp, p, L->kind.ratio);
    if (L->kind.indexer) bind_indexer(b, &L->idx, p, L->kind.kv_source == il);
    dsv4_bind_linear(b, &L->gate, NAME("ffn.gate"), DSV4_WFMT_BF16, n_exp, c->d_model);
    L->gate_bias = dsv4_bind_expect_data(b, NAME("ffn.gate.bias"), DSV4_DT(F32), 1, n_exp, 0);
    if (c->v41.vision) dsv4_bind_expect(b, NAME("ffn.gate.bias_vl"), DSV4_DT(F32), 1, n_exp, 0); /* image spans */
    dsv4_bind_experts(b, L, p, n_exp);
}

/* DSpark stage s (`DSparkBlock`, `DSparkMarkovHead`, `DSparkConfidenceHead`). */
static void bind_stage(struct dsv4_binder *b, struct dsv4_layer_w *L, int s)
{
    const struct dsv4_config     *c = b->cfg;
    const struct dsv4_v41_config *v = &c->v41;
    char                          p[32], n[160];
    snprintf(p, sizeof(p), "mtp.%d.", s);
    bind_block(b, L, p, c->n_layer + s, v->dspark_n_exp);
    if (s == 0) {
        dsv4_bind_linear(b, &L->main_proj, NAME("main_proj"), c->wfmt, c->d_model, v->n_dspark_target * c->d_model);
        L->main_norm = dsv4_bind_expect_data(b, NAME("main_norm.weight"), DSV4_DT(BF16), 1, c->d_model, 0);
    }
    if (s < c->n_mtp - 1) return;
    int rk       = v->dspark_markov_rank;
    L->mtp_norm  = dsv4_bind_expect_data(b, NAME("norm.weight"), DSV4_DT(BF16), 1, c->d_model, 0);
    L->markov_embed = dsv4_bind_expect_data(b, NAME("markov_head.embed.weight"), DSV4_DT(BF16), 2, c->vocab_size, rk);
    dsv4_bind_linear(b, &L->markov_head, NAME("markov_head.head"), DSV4_WFMT_BF16, c->vocab_size, rk);
    dsv4_bind_linear(b, &L->confidence, NAME("confidence_head.proj"), DSV4_WFMT_BF16, 1, c->d_model + rk);
}

/* The DSpark stages: absent as a whole is fine (reported unavailable), in part a problem. */
static void bind_dspark(struct dsv4_binder *b, struct dsv4_weights *w)
{
    const struct dsv4_config *c = b->cfg;
    w->dspark = dsv4_arena_zalloc(b->arena, (size_t)c->n_mtp * sizeof(*w->dspark), 16);
    if (!w->dspark) {
        b->oom = true;
        return;
    }
    int before = b->rep->n_problems;
    for (int s = 0; s < c->n_mtp && !b->oom; s++) bind_stage(b, &w->dspark[s], s);
    w->has_mtp = b->rep->n_problems == before;
}

/*
 * A VL release's image input, unused (out of scope): the span delimiters' embeddings are
 * checked like the others; the vision tower (`ViT`, `Aligner`: vision.*, aligner.*) is
 * accepted by name only, its shapes come from vision_config, which dsv4 does not read.
 */
static void accept_vision(struct dsv4_binder *b)
{
    const struct dsv4_config *c = b->cfg;
    static const char *const  delims[] = { "image_start", "image_end", "image_newline" };
    for (int i = 0; i < 3; i++) dsv4_bind_expect(b, delims[i], DSV4_DT(BF16) | DSV4_DT(F32), 1, c->d_model, 0);
    for (size_t i = 0; i < b->ck->n_tensors; i++) {
        const char *n = b->ck->tensors[i].name;
        if (strncmp(n, "vision.", 7) != 0 && strncmp(n, "aligner.", 8) != 0) continue;
        b->used[i] = 1;
        b->rep->n_vision++;
    }
}

void dsv4_bind_v41(struct dsv4_binder *b, struct dsv4_weights *w, bool any_mtp)
{
    const struct dsv4_config *c = b->cfg;
    w->embed = dsv4_bind_expect_data(b, "embed.weight", DSV4_DT(BF16), 2, c->vocab_size, c->d_model);
    dsv4_bind_linear(b, &w->head, "head", DSV4_WFMT_BF16, c->vocab_size, c->d_model);
    w->norm   = dsv4_bind_expect_data(b, "norm.weight", DSV4_DT(BF16), 1, c->d_model, 0);
    w->layers = dsv4_arena_zalloc(b->arena, (size_t)c->n_layer * sizeof(*w->layers), 16);
    if (!w->layers) b->oom = true;
    for (int il = 0; il < c->n_layer && !b->oom; il++) {
        char p[32];
        snprintf(p, sizeof(p), "layers.%d.", il);
        bind_block(b, &w->layers[il], p, il, c->n_exp);
    }
    if (c->n_mtp > 0 && any_mtp && !b->oom) bind_dspark(b, w);
    if (c->v41.vision && b->ck) accept_vision(b);
}
