/*
 * resident.c - dsv4_engine_make_resident: one read pass over the weights the backend reads
 * in place from the mapped checkpoint, for a hot standby (docs/DEPLOY.md "Hot standby").
 *
 * The loader only asks the kernel to read ahead (MADV_WILLNEED), which it may do lazily or
 * not at all under memory pressure; a standby must have every page in memory, and in this
 * process's page tables, before it is promoted, or its first requests fault the weights in
 * from disk. The projections a backend copied into its own layout (the CPU's interleaved
 * tiles, a device's upload: linear->prep) are not read again, so their checkpoint pages are
 * skipped: reading them would only fill the page cache.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/session.h"

struct gone_ctx {
    const struct dsv4_checkpoint *ck;
    bool                         *gone;
};

static void mark_copied(struct dsv4_linear *l, void *ud)
{
    struct gone_ctx *g = ud;
    if (!l->prep) return;
    if (l->wt) g->gone[l->wt - g->ck->tensors] = true;
    if (l->st) g->gone[l->st - g->ck->tensors] = true;
}

/* Reads one byte per page of [p, p + n) (volatile: the reads are the point). */
static void touch(const void *p, size_t n, size_t pg)
{
    if (!n) return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    (void)madvise((void *)a, (uintptr_t)p + n - a, MADV_WILLNEED);
    const volatile uint8_t *b = p;
    for (size_t off = 0; off < n; off += pg) (void)b[off];
    (void)b[n - 1];
}

int64_t dsv4_engine_make_resident(dsv4_engine *e)
{
    struct dsv4_model            *m  = &e->model;
    const struct dsv4_checkpoint *ck = &m->ck;
    struct gone_ctx               g  = { ck, calloc(ck->n_tensors + 1, sizeof(bool)) };
    if (!g.gone) return -1;
    dsv4_weights_each_linear_of(&m->w, &m->cfg, m->exp_lo, m->exp_hi, m->trunk, mark_copied, &g);
    struct dsv4_engine_settings es;
    dsv4_engine_settings(e, &es);
    size_t  pg    = (size_t)sysconf(_SC_PAGESIZE);
    int64_t bytes = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const struct dsv4_tensor *t  = &ck->tensors[i];
        size_t                    nl = strlen(t->name);
        /* stored tiles ("NAME.i16") are read in place only when the backend uses tiles */
        bool stored_tiles = !es.tiles && nl > 4 && !strcmp(t->name + nl - 4, ".i16");
        if (g.gone[i] || stored_tiles || !t->data || !dsv4_model_holds(m, t)) continue;
        touch(t->data, t->nbytes, pg);
        bytes += (int64_t)t->nbytes;
    }
    free(g.gone);
    return bytes;
}
