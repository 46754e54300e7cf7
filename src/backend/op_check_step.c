/*
 * op_check_step.c - the op checker's multi-sequence steps (op_check_step.h).
 */
#include <string.h>

#include "backend/op_check_step.h"

static size_t a64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

void chk_step_make(struct chk *h, struct chk_step *f, int n_seqs, const int (*pn)[2], size_t slot_bytes,
                   int page_tokens, size_t page_bytes)
{
    memset(f, 0, sizeof(*f));
    int n_rows = 0, n_pages = 2; /* two spare pages in the pool */
    for (int s = 0; s < n_seqs; s++) {
        int end = pn[s][0] + pn[s][1];
        n_rows += pn[s][1];
        n_pages += end > 0 ? (end + page_tokens - 1) / page_tokens : 1;
    }
    int32_t *perm = chk_alloc(h, sizeof(int32_t) * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++) perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j   = (int)(chk_u64(h) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    if (perm[0] == 0 && perm[1] == 1) perm[0] = 1, perm[1] = 0; /* never the identity */
    f->pos   = chk_alloc(h, sizeof(int) * (size_t)(n_rows > 0 ? n_rows : 1));
    f->tok   = chk_alloc(h, sizeof(int) * (size_t)(n_rows > 0 ? n_rows : 1));
    f->pool_off = a64(slot_bytes) * (size_t)n_seqs;
    f->bytes    = f->pool_off + (size_t)n_pages * page_bytes;
    int row = 0, page = 0;
    for (int s = 0; s < n_seqs; s++) {
        f->slot_off[s] = a64(slot_bytes) * (size_t)s;
        f->seq[s]      = (struct dsv4_step_seq){ .row0 = row, .n = pn[s][1], .p0 = pn[s][0], .page = perm + page };
        for (int t = 0; t < pn[s][1]; t++, row++) f->pos[row] = pn[s][0] + t, f->tok[row] = (int)(chk_u64(h) % 1000);
        int end = pn[s][0] + pn[s][1];
        page += end > 0 ? (end + page_tokens - 1) / page_tokens : 1;
    }
    f->desc = (struct dsv4_step_desc){ .n_seqs = n_seqs, .n_rows = n_rows, .seq = f->seq, .pos = f->pos,
                                       .tok = f->tok, .page_tokens = page_tokens, .page_bytes = page_bytes };
    uint8_t *arena = chk_alloc(h, f->bytes);
    memset(arena, 0xa5, f->bytes);
    chk_step_rebase(f, arena);
}

void chk_step_rebase(struct chk_step *f, uint8_t *arena)
{
    f->arena = arena;
    for (int s = 0; s < f->desc.n_seqs; s++) {
        f->seq[s].slot      = arena + f->slot_off[s];
        f->seq[s].page_base = arena + f->pool_off;
    }
}
