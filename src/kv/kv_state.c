/*
 * kv_state.c - layout, allocation and reset of one sequence's attention state (see kv.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

/* Walks the layout once: with base == NULL it only measures. */
static size_t layout(struct dsv4_seq_state *st, const struct dsv4_config *c, int max_ctx, enum dsv4_row_fmt fmt,
                     bool mtp, uint8_t *base)
{
    int    rb = dsv4_row_bytes(fmt, c->d_head, c->d_rope), ib = dsv4_idx_key_bytes(c->d_idx_head);
    int    n  = c->n_layer + (mtp ? 1 : 0);
    size_t off = 0;
#define TAKE(ptr, bytes)                                                                                           \
    do {                                                                                                           \
        if (base) (ptr) = (void *)(base + off);                                                                    \
        off += align64(bytes);                                                                                     \
    } while (0)
    struct dsv4_layer_state dummy;
    if (base) {
        st->layers = (struct dsv4_layer_state *)(void *)base;
        memset(st->layers, 0, sizeof(*st->layers) * (size_t)n);
    }
    off += align64(sizeof(struct dsv4_layer_state) * (size_t)n);
    for (int il = 0; il < n; il++) {
        struct dsv4_layer_state *ls = base ? &st->layers[il] : &dummy;
        int r                       = c->ratio[il];
        ls->ratio                   = r;
        TAKE(ls->ring, (size_t)c->window * (size_t)rb);
        if (r) {
            int coff = r == 4 ? 2 : 1;
            size_t sb = sizeof(float) * (size_t)(coff * r) * (size_t)(coff * c->d_head);
            TAKE(ls->comp, (size_t)(max_ctx / r) * (size_t)rb);
            TAKE(ls->ckv, sb);
            TAKE(ls->csc, sb);
            if (r == 4) {
                size_t ib2 = sizeof(float) * (size_t)(coff * r) * (size_t)(coff * c->d_idx_head);
                TAKE(ls->idx, (size_t)(max_ctx / r) * (size_t)ib);
                TAKE(ls->ikv, ib2);
                TAKE(ls->isc, ib2);
            }
        }
    }
    if (mtp) TAKE(st->mtp_x, sizeof(float) * (size_t)c->hc * (size_t)c->d_model);
#undef TAKE
    return off;
}

size_t dsv4_seq_state_bytes(const struct dsv4_config *cfg, int max_ctx, enum dsv4_row_fmt fmt, bool mtp)
{
    struct dsv4_seq_state tmp;
    memset(&tmp, 0, sizeof(tmp));
    return layout(&tmp, cfg, max_ctx, fmt, mtp, NULL);
}

int dsv4_seq_state_init(struct dsv4_seq_state *st, const struct dsv4_config *cfg, int max_ctx,
                        enum dsv4_row_fmt fmt, bool mtp, struct dsv4_err *err)
{
    memset(st, 0, sizeof(*st));
    if (max_ctx < 1) return dsv4_err_set(err, DSV4_EINVAL, "context length must be at least 1 (got %d)", max_ctx);
    size_t bytes = layout(st, cfg, max_ctx, fmt, mtp, NULL);
    void  *mem   = NULL;
    if (posix_memalign(&mem, 64, bytes) != 0 || !mem)
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %.1f MiB of KV state for a %d-token context",
                            (double)bytes / 1048576.0, max_ctx);
    memset(mem, 0, bytes); /* touch every page now, not while decoding */
    layout(st, cfg, max_ctx, fmt, mtp, mem);
    st->mem       = mem;
    st->mem_bytes = bytes;
    st->max_ctx   = max_ctx;
    st->fmt       = fmt;
    st->row_bytes = dsv4_row_bytes(fmt, cfg->d_head, cfg->d_rope);
    st->idx_bytes = dsv4_idx_key_bytes(cfg->d_idx_head);
    st->n_states  = cfg->n_layer + (mtp ? 1 : 0);
    st->has_mtp   = mtp;
    dsv4_seq_state_reset(st, cfg);
    return DSV4_OK;
}

void dsv4_seq_state_free(struct dsv4_seq_state *st)
{
    free(st->mem);
    memset(st, 0, sizeof(*st));
}

static void reset_frontier(float *kv, float *sc, int ratio, int d)
{
    int    coff = ratio == 4 ? 2 : 1;
    size_t n    = (size_t)(coff * ratio) * (size_t)(coff * d);
    memset(kv, 0, n * sizeof(float));
    for (size_t i = 0; i < n; i++) sc[i] = -INFINITY;
}

void dsv4_seq_state_reset(struct dsv4_seq_state *st, const struct dsv4_config *cfg)
{
    st->pos = 0;
    for (int il = 0; il < st->n_states; il++) {
        struct dsv4_layer_state *ls = &st->layers[il];
        if (!ls->ratio) continue;
        reset_frontier(ls->ckv, ls->csc, ls->ratio, cfg->d_head);
        if (ls->ratio == 4) reset_frontier(ls->ikv, ls->isc, ls->ratio, cfg->d_idx_head);
    }
}
