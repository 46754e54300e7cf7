/*
 * layer_kind.h - what kind each layer of the model is: its attention state (window,
 * compression, indexer, where its compressed rows and selection come from) and its routing,
 * in one description per layer (main stack and MTP). The builder (layer_kind.c, called by
 * dsv4_config_parse) derives it from the config once; the model, the KV layout, the
 * speculative undo and the size estimates read it, and nothing else decides a layer's kind
 * from its compress ratio (docs/MODEL.md §4, "Layer kinds in the code").
 *
 * A leaf header (no model types), so src/kv can read the kinds through kv_dims.h.
 */
#ifndef DSV4_LAYER_KIND_H
#define DSV4_LAYER_KIND_H

#include <stdbool.h>

struct dsv4_layer_kind {
    int  window;       /* raw KV rows of the sliding window a query reads (every layer) */
    int  ratio;        /* positions pooled into one compressed row; 0: the window only */
    bool overlap;      /* the compressor pools the previous block with the current one (two
                          blocks of candidates, its rows coff = 2 halves wide) */
    bool indexer;      /* the lightning indexer keeps idx_topk compressed rows per query (its
                          keys from a compressor of the same ratio); without it a query reads
                          every completed row */
    int  idx_topk;     /* rows the selection keeps; 0 without one */
    int  kv_source;    /* the layer whose compressed rows it attends over (il: it compresses them
                          itself); -1 with ratio 0 */
    int  index_source; /* the layer whose indexer selects the rows it attends over (il: its own
                          indexer); -1 without a selection. V4: il or -1. V4.1: the latest index
                          source, whose keys come from the latest kv source */
    int  cand_source;  /* V4.1: the layer whose candidate blocks pre-filter its indexer's scores
                          (il: it picks them); -1 without (every V4 layer) */
    int  keys_source;  /* the layer whose index keys its own indexer scores; -1 without one.
                          V4: il (its indexer's compressor); V4.1: its kv source (the keys come
                          from that layer's compressed latent, `Indexer.owns_k`) */
    bool owns_keys;    /* it stores index keys (some layer's keys_source is il) */
    bool idx_compress; /* its indexer pools its keys with a compressor of its own (V4's CSA);
                          V4.1's keys are k_norm(wk(latent)) of the kv source's rows */
    bool engram;       /* an Engram lookup on the streams before the block */
    bool hash_routed;  /* routed experts chosen by token id (ffn.gate.tid2eid), not by score */
    bool mtp;          /* an MTP block (after the main stack), not a main layer */
};

/* Halves of a compressor row (values, gates, ape): 2 with overlap, else 1. */
static inline int dsv4_kind_coff(const struct dsv4_layer_kind *k)
{
    return k->overlap ? 2 : 1;
}

struct dsv4_config;

/* Fills cfg->kind[0 .. n_layer + n_mtp) from the validated fields of cfg (compress_ratios,
 * sliding_window, index_topk, num_hash_layers, num_nextn_predict_layers), by cfg->arch. */
void dsv4_layer_kinds_build(struct dsv4_config *cfg);

#endif /* DSV4_LAYER_KIND_H */
