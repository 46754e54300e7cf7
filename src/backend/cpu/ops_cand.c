/*
 * ops_cand.c - DeepSeek-V4.1's candidate pre-filter inside the CPU's indexer_topk (backend.h
 * struct dsv4_idx_cand; docs/MODEL.md §6; the official select_candidate_blocks and the
 * Indexer's masking). Plain C shared by the reference and every level, as the rest of the
 * top-k: it compares numbers, its cost is a pass over a row's key scores.
 */
#include <math.h>

#include "backend/cpu/ops_data.h"

void dsv4_cpu_cand_pick(struct dsv4_backend *be, const float *score, int n_done, int block, int n_keep, int *blocks)
{
    int    n_blocks = (n_done + block - 1) / block, k = n_keep < n_blocks ? n_keep : n_blocks;
    float *bs       = be->scratch; /* [n_blocks]: each block's best key */
    DSV4_ASSERT((size_t)n_blocks <= be->scratch_len);
    for (int b = 0; b < n_blocks; b++) {
        float m = -INFINITY;
        for (int j = b * block; j < n_done && j < (b + 1) * block; j++) m = score[j] > m ? score[j] : m;
        bs[b] = m;
    }
    if (n_blocks) bs[n_blocks - 1] = INFINITY; /* the newest key's block, partly filled: always kept */
    dsv4_cpu_top_k(bs, n_blocks, k, blocks);
    for (int i = k; i < n_keep; i++) blocks[i] = -1;
}

int dsv4_cpu_cand_top_k(struct dsv4_backend *be, const float *score, int n_done, int block, int n_keep,
                        const int *blocks, int topk, int *sel)
{
    size_t room = ((size_t)n_done + 15) / 16 * 16;
    int   *ids  = (int *)(void *)be->scratch;         /* [n_done]: the candidates' key ids, ascending */
    float *sc   = be->scratch + room;                 /* [n_done]: their scores */
    int   *pos  = (int *)(void *)(be->scratch + 2 * room); /* [k < n_done]: the best, as places in ids */
    DSV4_ASSERT(3 * room <= be->scratch_len);
    int n = 0;
    for (int i = 0; i < n_keep && blocks[i] >= 0; i++)
        for (int j = blocks[i] * block; j < n_done && j < (blocks[i] + 1) * block; j++) ids[n] = j, sc[n++] = score[j];
    int k = topk < n ? topk : n;
    if (k == n) { /* every candidate key is kept */
        for (int i = 0; i < k; i++) sel[i] = ids[i];
        return k;
    }
    dsv4_cpu_top_k(sc, n, k, pos);
    for (int i = 0; i < k; i++) sel[i] = ids[pos[i]];
    return k;
}
