/*
 * layer_kind.c - the builder of the per-layer descriptions (layer_kind.h): the one place
 * where a DeepSeek-V4 layer's kind is read off its compress ratio.
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
                                     .engram       = false,
                                     .hash_routed  = !mtp && il < c->n_hash_layer,
                                     .mtp          = mtp };
}

void dsv4_layer_kinds_build(struct dsv4_config *c)
{
    for (int il = 0; il < c->n_layer + c->n_mtp; il++) c->kind[il] = v4_kind(c, il);
}
