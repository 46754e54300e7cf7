/*
 * spec.c - undoing the rejected rows of a speculative verify chunk (runtime.h, struct
 * dsv4_spec_undo; docs/SPECULATIVE.md).
 *
 * A verify chunk feeds the next token and K draft tokens at positions p0 .. p0 + K in one
 * forward step; the sampler keeps a prefix of them. What the rejected rows changed:
 *   - window rings: their rows, at position % ring_rows; the rings are DSV4_SPEC_MAX_DRAFT
 *     rows longer than the window, so no row a later query reads was overwritten (kv.h);
 *   - compressed rows and indexer keys of blocks a rejected row completed: garbage in the
 *     pages, rewritten when the block completes again, before any query reads it;
 *   - compressor frontiers: the slots of the rejected positions and, when a rejected row
 *     completed a block, the pooled state (an overlapping compressor moves its current block
 *     to the previous-block rows; another's block slots are reused by the next block). These
 *     are the only state that must come back: the rows the chunk overwrites are saved before
 *     its compress op, restored, and the kept rows' inputs replayed through the same op, so
 *     the frontier holds exactly what a chunk of the kept rows would have left;
 *   - the MTP block's frontier (st->mtp_pos, st->mtp_x: the final streams of the last kept
 *     row, saved by the forward);
 *   - DeepSeek-V4.1's Engram history (the last compressed token ids, in the slot): saved with
 *     the chunk's ids by the forward (engram_fwd.c), restored and advanced over the kept ones.
 *     Its DSpark rings need nothing: a rejected row sits at a ring slot no later draft reads,
 *     and is rewritten when its position is verified again (as the main rings).
 * Nothing of the whole state is copied: per compressor layer a few frontier rows and the
 * chunk's inputs.
 */
#include <stdlib.h>
#include <string.h>

#include "model/runtime.h"

static size_t a64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

/* Frontier rows a chunk of n rows can overwrite: every row of an overlapping compressor
 * (both blocks), whose completion moves rows; the n slots of the others (n <= ratio). */
static int saved_rows(const struct dsv4_layer_kind *k, int n)
{
    if (k->overlap) return 2 * k->ratio;
    return n < k->ratio ? n : k->ratio;
}

/* The compressors of layer il with a frontier (a partial block kept in the slot): the layer's
 * own above ratio 1, then the indexer's (V4's CSA). */
static int n_frontiers(const struct dsv4_layer_kind *k, int il)
{
    return (k->ratio > 1 && k->kv_source == il) + k->idx_compress;
}

/* Lays out (base != NULL) or measures the undo memory: per compressor saved kv/sc rows and
 * the chunk's a/g inputs, then the final streams. */
static size_t layout(const struct dsv4_config *c, int n_max, uint8_t *base, struct dsv4_spec_undo *u)
{
    size_t off = 0;
#define TAKE(ptr, floats)                                                                                          \
    do {                                                                                                           \
        if (base) (ptr) = (float *)(void *)(base + off);                                                          \
        off += a64(sizeof(float) * (size_t)(floats));                                                             \
    } while (0)
    for (int il = 0; il < c->n_layer; il++) {
        const struct dsv4_layer_kind *kind = &c->kind[il];
        for (int k = 0; k < n_frontiers(kind, il); k++) {
            struct dsv4_spec_comp  tmp, *sc = base ? &u->comp[2 * il + k] : &tmp;
            int                    d = k ? c->d_idx_head : c->d_head, width = dsv4_kind_coff(kind) * d;
            int                    rows = saved_rows(kind, n_max);
            TAKE(sc->kv, (size_t)rows * (size_t)width);
            TAKE(sc->sc, (size_t)rows * (size_t)width);
            TAKE(sc->a, (size_t)n_max * (size_t)width);
            TAKE(sc->g, (size_t)n_max * (size_t)width);
        }
    }
    float *xf = NULL;
    TAKE(xf, (size_t)n_max * (size_t)c->hc * (size_t)c->d_model);
    if (base) u->xf = xf;
#undef TAKE
    return off;
}

size_t dsv4_spec_undo_bytes(const struct dsv4_config *c, int n_max)
{
    return layout(c, n_max, NULL, NULL) + sizeof(struct dsv4_spec_comp) * 2 * (size_t)c->n_layer;
}

int dsv4_spec_undo_init(struct dsv4_spec_undo *u, const struct dsv4_model *m, int n_max, struct dsv4_err *err)
{
    const struct dsv4_config *c = &m->cfg;
    memset(u, 0, sizeof(*u));
    if (n_max < 1 || n_max > DSV4_SPEC_MAX_DRAFT + 1)
        return dsv4_err_set(err, DSV4_EINVAL, "a verify chunk of %d rows (1 .. %d)", n_max, DSV4_SPEC_MAX_DRAFT + 1);
    u->comp = calloc((size_t)(2 * c->n_layer), sizeof(*u->comp));
    if (!u->comp) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the speculative undo table");
    u->kvmem     = dsv4_model_kv_mem(m);
    u->mem_bytes = layout(c, n_max, NULL, NULL);
    u->mem       = dsv4_kv_mem_alloc(&u->kvmem, u->mem_bytes);
    if (!u->mem) {
        free(u->comp);
        u->comp = NULL;
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %zu bytes for the speculative undo buffers",
                            u->mem_bytes);
    }
    layout(c, n_max, u->mem, u);
    u->n_max   = n_max;
    u->n_layer = c->n_layer;
    return DSV4_OK;
}

void dsv4_spec_undo_free(struct dsv4_spec_undo *u)
{
    if (!u) return;
    if (u->mem) dsv4_kv_mem_free(&u->kvmem, u->mem, u->mem_bytes);
    free(u->comp);
    memset(u, 0, sizeof(*u));
}

/* Row i of the saved rows <-> the frontier row it came from: every row with overlap, the
 * slot of position p0 + i otherwise. */
static int frontier_row(const struct dsv4_layer_kind *k, int p0, int i)
{
    return k->overlap ? i : (p0 + i) % k->ratio;
}

static void copy_floats(struct dsv4_step *S, float *dst, const float *src, size_t n)
{
    S->m->backend->copy(S->m->backend_impl, dst, src, sizeof(float) * n);
    dsv4_prof_xfer(S->m->prof, DSV4_XFER_COPY, sizeof(float) * n);
}

void dsv4_spec_save_compressor(struct dsv4_step *S, struct dsv4_spec_undo *u, int il, bool is_indexer,
                               const struct dsv4_layer_state *ls, int d, const float *a, const float *g, int n, int p0)
{
    struct dsv4_spec_comp *sc = &u->comp[2 * il + (is_indexer ? 1 : 0)];
    size_t W = (size_t)(dsv4_kind_coff(&ls->kind) * d);
    const float *kv = is_indexer ? ls->ikv : ls->ckv, *gs = is_indexer ? ls->isc : ls->csc;
    DSV4_ASSERT(n <= u->n_max && p0 == u->p0 && n == u->n);
    sc->rows = saved_rows(&ls->kind, n);
    for (int i = 0; i < sc->rows; i++) {
        size_t f = (size_t)frontier_row(&ls->kind, p0, i) * W;
        copy_floats(S, sc->kv + (size_t)i * W, kv + f, W);
        copy_floats(S, sc->sc + (size_t)i * W, gs + f, W);
    }
    copy_floats(S, sc->a, a, (size_t)n * W);
    copy_floats(S, sc->g, g, (size_t)n * W);
}

/* Restores one compressor's frontier and replays the kept rows through the compress op. */
static void rewind_compressor(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_step_desc *desc,
                              struct dsv4_spec_undo *u, const struct dsv4_seq_state *st, struct dsv4_layer_state *ls,
                              const struct dsv4_compressor_w *cw, int il, bool is_indexer)
{
    struct dsv4_spec_comp *sc = &u->comp[2 * il + (is_indexer ? 1 : 0)];
    int    d = cw->d_out;
    size_t W = (size_t)(cw->coff * d);
    float *kv = is_indexer ? ls->ikv : ls->ckv, *gs = is_indexer ? ls->isc : ls->csc;
    for (int i = 0; i < sc->rows; i++) {
        size_t f = (size_t)frontier_row(&ls->kind, u->p0, i) * W;
        copy_floats(S, kv + f, sc->kv + (size_t)i * W, W);
        copy_floats(S, gs + f, sc->sc + (size_t)i * W, W);
    }
    /* the pooled rows of blocks the kept rows complete are already in the pages: only the
     * frontier is wanted, S->crows takes the pooled output */
    const float *ape = cw->ape ? cw->ape : m->v41->zero_ape; /* V4.1's compressors have none */
    S->be.ops->compress(&S->be, desc, cw->ratio, cw->overlap, d, sc->a, sc->g, ape, dsv4_kv_slot_off(st, kv),
                        dsv4_kv_slot_off(st, gs), S->crows);
}

/* V4.1's Engram history back to before the chunk, then over its kept tokens. */
static void rewind_engram(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_seq_state *st,
                          struct dsv4_spec_undo *u, int keep)
{
    struct dsv4_engram_seq *hist = (struct dsv4_engram_seq *)(void *)st->engram;
    struct dsv4_err         err;
    *hist  = u->engram_hist;
    int rc = dsv4_engram_chunk(&m->v41->hash, hist, u->engram_ids, keep, S->eids, &err);
    DSV4_ASSERT(rc == DSV4_OK); /* the same ids the forward hashed */
}

void dsv4_spec_rollback(const struct dsv4_model *m, struct dsv4_step *S, struct dsv4_seq_state *st,
                        struct dsv4_spec_undo *u, int keep)
{
    const struct dsv4_config *c = &m->cfg;
    DSV4_ASSERT(u->n > 0 && keep >= 1 && keep <= u->n && st->pos == u->p0 + u->n);
    /* the replay is a step of one sequence: the kept rows, their inputs rows 0 .. keep - 1 */
    struct dsv4_step_seq  seq  = { .row0 = 0, .n = keep, .p0 = u->p0, .slot = st->slot, .page_base = st->page_base,
                                   .page = st->page };
    struct dsv4_step_desc desc = { .n_seqs = 1, .n_rows = keep, .seq = &seq, .page_tokens = st->page_tokens,
                                   .page_bytes = st->page_bytes };
    if (keep < u->n) {
        S->be.ops->step_begin(&S->be, &desc);
        for (int il = 0; il < c->n_layer; il++) {
            const struct dsv4_layer_w *L  = &m->w.layers[il];
            struct dsv4_layer_state   *ls = &st->layers[il];
            if (ls->ikv) rewind_compressor(m, S, &desc, u, st, ls, &L->idx.comp, il, true);
            if (ls->ckv) rewind_compressor(m, S, &desc, u, st, ls, &L->comp, il, false);
        }
        if (u->engram_saved) rewind_engram(m, S, st, u, keep);
    }
    u->engram_saved = false;
    st->pos = u->p0 + keep;
    if (st->has_mtp && c->arch == DSV4_ARCH_V4) {
        size_t sd = (size_t)c->hc * (size_t)c->d_model;
        copy_floats(S, st->mtp_x, u->xf + (size_t)(keep - 1) * sd, sd);
        if (st->mtp_pos > st->pos - 1) st->mtp_pos = st->pos - 1;
    }
    u->n = 0;
}
