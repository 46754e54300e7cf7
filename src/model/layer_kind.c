/*
 * layer_kind.c - the builders of the per-layer descriptions (layer_kind.h): the one place
 * where a layer's kind is read off its compress ratio (DeepSeek-V4) or off its ratio and the
 * source lists of the config (DeepSeek-V4.1).
 */
#include "model/model.h"

/*
 * DeepSeek-V4 (docs/MODEL.md §R1.3, "Layer schedule"): ratio 0 is a window-only layer;
 * ratio 4 is CSA, whose compressor overlaps two blocks and whose lightning indexer keeps
 * index_topk of the compressed rows; any other ratio is HCA (a non-overlapping compressor,
 * every completed row attended). Every layer compresses and selects over its own rows, none
 * has an Engram, and the first num_hash_layers main layers are hash-routed (never MTP).
 */
static struct dsv4_layer_kind v4_kind(const struct dsv4_config *c, int il)
{
    int  r   = c->ratio[il];
    bool csa = r == 4, mtp = il >= c->n_layer;
    return (struct dsv4_layer_kind){ .window       = c->window,
                                     .ratio        = r,
                                     .overlap      = csa,
                                     .indexer      = csa,
                                     .idx_topk     = csa ? c->idx_topk : 0,
                                     .kv_source    = r ? il : -1,
                                     .index_source = csa ? il : -1,
                                     .cand_source  = -1,
                                     .keys_source  = csa ? il : -1,
                                     .owns_keys    = csa,
                                     .idx_compress = csa,
                                     .engram       = false,
                                     .hash_routed  = !mtp && il < c->n_hash_layer,
                                     .mtp          = mtp };
}

/* The last entry of the ascending list ids[0 .. n) that is at most il; -1 when none is. */
static int latest_at_or_before(const int *ids, int n, int il)
{
    int last = -1;
    for (int i = 0; i < n && ids[i] <= il; i++) last = ids[i];
    return last;
}

static bool listed(const int *ids, int n, int il)
{
    return latest_at_or_before(ids, n, il) == il;
}

/*
 * DeepSeek-V4.1 (docs/MODEL.md "DeepSeek-V4.1"; the official inference/model.py): a main
 * layer of ratio r > 0 attends over the compressed rows of the latest kv source at or before
 * it (`Attention._compress_kv` reads `shared_attn.compress_kv`, which only `is_kv_source`
 * layers write) and over the selection of the latest index source (`_compress_topk_idxs`
 * reuses `shared_attn.topk_idxs` unless `is_index_source`), whose indexer scores the keys the
 * latest kv source published (`Indexer.owns_k`). The compressor never overlaps (ratio 2 is a
 * softmax over 2 tokens, ratio 1 a plain projection: `Compressor.forward`). An index source
 * at the candidate source picks the candidate blocks, later ones keep only their rows
 * (`Indexer.is_candidate_source`, `uses_candidates`). No layer is hash-routed; the DSpark
 * stages (`DSparkBlock`, after the main layers) are window-only.
 */
static struct dsv4_layer_kind v41_kind(const struct dsv4_config *c, int il)
{
    const struct dsv4_v41_config *v = &c->v41;
    int  r   = c->ratio[il];
    bool mtp = il >= c->n_layer;
    int  kvs = r && !mtp ? latest_at_or_before(v->kv_src, v->n_kv_src, il) : -1;
    int  ixs = r && !mtp ? latest_at_or_before(v->idx_src, v->n_idx_src, il) : -1;
    bool own = ixs == il && ixs >= 0;
    return (struct dsv4_layer_kind){ .window       = c->window,
                                     .ratio        = r,
                                     .overlap      = false,
                                     .indexer      = own,
                                     .idx_topk     = ixs >= 0 ? c->idx_topk : 0,
                                     .kv_source    = kvs,
                                     .index_source = ixs,
                                     .cand_source  = own && v->cand_source >= 0 && v->cand_source <= il ? v->cand_source : -1,
                                     .keys_source  = own ? kvs : -1,
                                     .owns_keys    = kvs == il && kvs >= 0, /* every kv source is an index source */
                                     .idx_compress = false,
                                     .engram       = !mtp && listed(v->engram_layer, v->n_engram, il),
                                     .hash_routed  = false,
                                     .mtp          = mtp };
}

void dsv4_layer_kinds_build(struct dsv4_config *c)
{
    for (int il = 0; il < c->n_layer + c->n_mtp; il++)
        c->kind[il] = c->arch == DSV4_ARCH_V4_1 ? v41_kind(c, il) : v4_kind(c, il);
}
