/*
 * model_v41.c - what a DeepSeek-V4.1 model computes once at load for its forward
 * (docs/MODEL.md §6): the Engram hashing (engram_hash.h) with the checkpoint's token map
 * (its engram_token_map.json, else computed from its tokenizer.json: engram_map.h), each Engram layer's gate weights
 * w = f32(q_weight * k_weight) (official Engram.forward multiplies them per call) and the zero
 * APE table its ratio-2 compressors pool with (the official Compressor has no ape).
 */
#include <stdlib.h>

#include "model/engram_map.h"
#include "model/runtime.h"

_Static_assert(sizeof(struct dsv4_engram_seq) <= DSV4_KV_ENGRAM_BYTES, "Engram history exceeds its slot bytes");

/* The token map and the hashing of the config's Engram layers. */
static int load_hash(struct dsv4_model *m, struct dsv4_v41_model *v, const char *dir, struct dsv4_err *err)
{
    const struct dsv4_v41_config *c = &m->cfg.v41;
    enum dsv4_engram_map_source src;
    int rc = dsv4_engram_map_open(dir, 0, c->engram_cvocab, &v->map, &v->map_n, &src, err);
    if (rc) return rc;
    if (c->engram_pad_id < 0 || c->engram_pad_id >= v->map_n)
        return dsv4_err_set(err, DSV4_EFORMAT, "%s: engram_pad_token_id %d is not in the Engram token map (%s, %lld tokens)",
                            dir, c->engram_pad_id, dsv4_engram_map_source_name(src), (long long)v->map_n);
    struct dsv4_engram_params p = { .n_layers = c->n_engram, .max_ngram = c->engram_max_ngram,
                                    .n_heads = c->engram_n_head, .vocab_size = c->engram_vocab,
                                    .compressed_vocab = c->engram_cvocab,
                                    .pad_compressed = v->map[c->engram_pad_id] };
    for (int i = 0; i < c->n_engram; i++) {
        p.layer_ids[i]      = c->engram_layer[i];
        p.num_embeddings[i] = c->engram_rows[i];
    }
    return dsv4_engram_hash_init(&v->hash, &p, err);
}

/* w[hc, d_model] = f32(q_weight * k_weight) of Engram layer il. */
static float *gate_weights(struct dsv4_model *m, const struct dsv4_engram_w *e)
{
    size_t n = (size_t)m->cfg.hc * (size_t)m->cfg.d_model;
    float *w = dsv4_arena_alloc(&m->arena, sizeof(float) * n, 64);
    for (size_t i = 0; w && i < n; i++)
        w[i] = (float)((double)dsv4_f32_from_bf16(e->q_weight[i]) * (double)dsv4_f32_from_bf16(e->k_weight[i]));
    return w;
}

int dsv4_model_load_v41(struct dsv4_model *m, const char *dir, struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    if (c->arch != DSV4_ARCH_V4_1) return DSV4_OK;
    struct dsv4_v41_model *v = dsv4_arena_zalloc(&m->arena, sizeof(*v), 64);
    if (!v) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    m->v41      = v;
    v->zero_ape = dsv4_arena_zalloc(&m->arena, sizeof(float) * 2 * (size_t)c->d_head, 64);
    if (!v->zero_ape) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    for (int il = 0; il < DSV4_MAX_LAYERS; il++) v->engram_of[il] = -1;
    v->n_engram = c->v41.n_engram;
    if (!v->n_engram) return DSV4_OK;
    int rc = load_hash(m, v, dir, err);
    for (int e = 0; rc == DSV4_OK && e < v->n_engram; e++) {
        int il = c->v41.engram_layer[e];
        v->engram_of[il] = e;
        v->engram_w[e]   = gate_weights(m, &m->w.layers[il].engram);
        if (!v->engram_w[e]) rc = dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    return rc;
}

void dsv4_model_free_v41(struct dsv4_model *m)
{
    if (m->v41) free(m->v41->map);
}
