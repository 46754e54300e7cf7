/*
 * kv_state.c - layout of one sequence's attention state (see kv.h): where each layer's ring,
 * frontiers, compressed rows and indexer keys sit inside a slot, a page and a snapshot;
 * binding a state to a slot; the private all-pages-mapped state of a session; snapshots.
 *
 * One walker computes every offset, so the sizes reported for planning and the pointers
 * handed to the forward pass cannot disagree. Every part starts on a 64-byte boundary.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv.h"

static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

struct kv_sizes {
    size_t slot, page, snap;
};

/* The main layers, then with mtp the draft layers: V4's MTP block, V4.1's DSpark stages
 * (each keeps a ring of the main model's rows, model/dspark.c). */
static int n_states_of(const struct dsv4_kv_dims *c, bool mtp)
{
    return c->n_layer + (mtp ? (c->n_mtp > 1 ? c->n_mtp : 1) : 0);
}

/* Frontier rows x floats per row of one compressor of a layer of kind k. */
static size_t frontier_floats(const struct dsv4_layer_kind *k, int d)
{
    int coff = dsv4_kind_coff(k);
    return (size_t)(coff * k->ratio) * (size_t)(coff * d);
}

static bool has_engram(const struct dsv4_kv_dims *c)
{
    for (int il = 0; il < c->n_layer; il++)
        if (c->kind[il].engram) return true;
    return false;
}

/*
 * Walks the layout once. With st != NULL it also points st's layers into `slot` and records
 * the page offsets; otherwise it only measures.
 */
static void walk(const struct dsv4_kv_dims *c, enum dsv4_row_fmt fmt, bool mtp, int page_tokens,
                 struct dsv4_seq_state *st, uint8_t *slot, struct kv_sizes *sz)
{
    size_t rb = (size_t)dsv4_row_bytes(fmt, c->d_head, c->d_rope), ib = (size_t)dsv4_idx_key_bytes(c->d_idx_head);
    int    n  = n_states_of(c, mtp);
    memset(sz, 0, sizeof(*sz));
    for (int il = 0; il < n; il++) {
        struct dsv4_layer_state *ls = st ? &st->layers[il] : NULL;
        const struct dsv4_layer_kind *k = &c->kind[il];
        int                      r  = k->ratio;
        size_t ring = sz->slot, ckv = 0, csc = 0, ikv = 0, isc = 0, comp = 0, idx = 0;
        sz->slot += align64((size_t)(c->window + DSV4_SPEC_MAX_DRAFT) * rb);
        sz->snap += align64((size_t)(c->window + DSV4_SPEC_MAX_DRAFT) * rb);
        /* a layer that only reads another's rows and keys (V4.1) keeps none of its own; a
         * ratio-1 compressor is a plain projection, with no partial group to keep */
        bool own_rows = r && k->kv_source == il, frontier = own_rows && r > 1;
        if (frontier) {
            size_t fb = sizeof(float) * frontier_floats(k, c->d_head);
            ckv = sz->slot, sz->slot += align64(fb);
            csc = sz->slot, sz->slot += align64(fb);
            if (k->overlap) sz->snap += 2 * align64(fb / 2); /* the previous-block rows: half */
        }
        if (own_rows) comp = sz->page, sz->page += align64((size_t)(page_tokens / r) * rb);
        if (k->idx_compress) {
            size_t ifb = sizeof(float) * frontier_floats(k, c->d_idx_head);
            ikv = sz->slot, sz->slot += align64(ifb);
            isc = sz->slot, sz->slot += align64(ifb);
            if (k->overlap) sz->snap += 2 * align64(ifb / 2);
        }
        if (k->owns_keys) idx = sz->page, sz->page += align64((size_t)(page_tokens / r) * ib);
        if (!ls) continue;
        ls->kind     = *k;
        ls->ring     = slot + ring;
        ls->ckv      = frontier ? (float *)(void *)(slot + ckv) : NULL;
        ls->csc      = frontier ? (float *)(void *)(slot + csc) : NULL;
        ls->ikv      = k->idx_compress ? (float *)(void *)(slot + ikv) : NULL;
        ls->isc      = k->idx_compress ? (float *)(void *)(slot + isc) : NULL;
        ls->comp_off = comp;
        ls->idx_off  = idx;
    }
    size_t mtp_bytes = align64(sizeof(float) * (size_t)c->hc * (size_t)c->d_model), mtp_off = sz->slot;
    if (mtp) sz->slot += 2 * mtp_bytes, sz->snap += mtp_bytes;
    /* V4.1's Engram history (the last compressed token ids, model/engram_hash.h): the
     * n-grams of the next chunk reach back into it, so it is state like a ring */
    size_t eng_off = sz->slot;
    if (has_engram(c)) sz->slot += DSV4_KV_ENGRAM_BYTES, sz->snap += DSV4_KV_ENGRAM_BYTES;
    if (st) {
        st->mtp_x  = mtp ? (float *)(void *)(slot + mtp_off) : NULL;
        st->mtp_h  = mtp ? (float *)(void *)(slot + mtp_off + mtp_bytes) : NULL;
        st->engram = has_engram(c) ? slot + eng_off : NULL;
    }
}

size_t dsv4_kv_slot_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, bool mtp)
{
    struct kv_sizes sz;
    walk(dims, fmt, mtp, DSV4_KV_PAGE_TOKENS, NULL, NULL, &sz);
    return sz.slot;
}

size_t dsv4_kv_page_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, int page_tokens)
{
    struct kv_sizes sz;
    walk(dims, fmt, false, page_tokens, NULL, NULL, &sz);
    return sz.page;
}

size_t dsv4_kv_snap_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, bool mtp)
{
    struct kv_sizes sz;
    walk(dims, fmt, mtp, DSV4_KV_PAGE_TOKENS, NULL, NULL, &sz);
    return sz.snap;
}

bool dsv4_kv_page_tokens_ok(const struct dsv4_kv_dims *dims, int page_tokens)
{
    if (page_tokens < 4 || page_tokens > (1 << 20) || (page_tokens & (page_tokens - 1))) return false;
    for (int il = 0; il < dims->n_layer + dims->n_mtp; il++)
        if (dims->kind[il].ratio && page_tokens % dims->kind[il].ratio) return false;
    return true;
}

/* ------------------------------------------------------------------ memory */

void *dsv4_kv_mem_alloc(const struct dsv4_kv_mem *m, size_t bytes)
{
    if (m && m->kind) return m->kind->alloc(m->impl, bytes, DSV4_MEM_KV);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    memset(p, 0, bytes); /* touch every page now, not while decoding */
    return p;
}

void dsv4_kv_mem_free(const struct dsv4_kv_mem *m, void *p, size_t bytes)
{
    if (!p) return;
    if (m && m->kind) m->kind->free(m->impl, p, bytes);
    else free(p);
}

static void kv_copy(const struct dsv4_kv_mem *m, void *dst, const void *src, size_t bytes)
{
    if (m->kind) m->kind->copy(m->impl, dst, src, bytes);
    else memcpy(dst, src, bytes);
}

/* n floats of KV memory set to v, uploaded from a host block */
static void kv_fill(const struct dsv4_kv_mem *m, float *dst, float v, size_t n)
{
    float blk[256];
    for (int i = 0; i < 256; i++) blk[i] = v;
    for (size_t i = 0; i < n; i += 256) {
        size_t k = n - i < 256 ? n - i : 256;
        if (m->kind) m->kind->upload(m->impl, dst + i, blk, sizeof(float) * k);
        else memcpy(dst + i, blk, sizeof(float) * k);
    }
}

/* ------------------------------------------------------------------ binding */

int dsv4_seq_state_bind(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims, int max_ctx, int page_tokens,
                        enum dsv4_row_fmt fmt, bool mtp, const struct dsv4_kv_mem *mem, void *slot,
                        struct dsv4_err *err)
{
    memset(st, 0, sizeof(*st));
    if (mem) st->kvmem = *mem;
    if (max_ctx < 1) return dsv4_err_set(err, DSV4_EINVAL, "context length must be at least 1 (got %d)", max_ctx);
    if (!dsv4_kv_page_tokens_ok(dims, page_tokens))
        return dsv4_err_set(err, DSV4_EINVAL,
                            "page size %d is not a power of two that every compression ratio divides", page_tokens);
    int    n       = n_states_of(dims, mtp);
    int    n_pages = (max_ctx + page_tokens - 1) / page_tokens;
    size_t lb      = align64(sizeof(struct dsv4_layer_state) * (size_t)n);
    uint8_t *meta  = calloc(1, lb + sizeof(int32_t) * (size_t)n_pages);
    if (!meta) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a %d-page table", n_pages);
    st->meta        = meta;
    st->layers      = (struct dsv4_layer_state *)(void *)meta;
    st->page        = (int32_t *)(void *)(meta + lb);
    for (int k = 0; k < n_pages; k++) st->page[k] = -1;
    st->n_pages     = n_pages;
    st->page_tokens = page_tokens;
    st->max_ctx     = max_ctx;
    st->fmt         = fmt;
    st->row_bytes   = dsv4_row_bytes(fmt, dims->d_head, dims->d_rope);
    st->idx_bytes   = dsv4_idx_key_bytes(dims->d_idx_head);
    st->window      = dims->window;
    st->ring_rows   = dims->window + DSV4_SPEC_MAX_DRAFT;
    st->d_head      = dims->d_head;
    st->d_idx_head  = dims->d_idx_head;
    st->n_states    = n;
    st->slot        = slot;
    st->has_mtp     = mtp;
    st->mtp_floats  = dims->hc * dims->d_model;
    struct kv_sizes sz;
    walk(dims, fmt, mtp, page_tokens, st, slot, &sz);
    dsv4_seq_state_reset(st, dims);
    return DSV4_OK;
}

void dsv4_seq_state_unbind(struct dsv4_seq_state *st)
{
    free(st->meta);
    memset(st, 0, sizeof(*st));
}

/* ------------------------------------------------------------------ sessions */

static size_t session_bytes(const struct dsv4_kv_dims *dims, int max_ctx, enum dsv4_row_fmt fmt, bool mtp)
{
    size_t n_pages = (size_t)(max_ctx + DSV4_KV_PAGE_TOKENS - 1) / DSV4_KV_PAGE_TOKENS;
    return dsv4_kv_slot_bytes(dims, fmt, mtp) + n_pages * dsv4_kv_page_bytes(dims, fmt, DSV4_KV_PAGE_TOKENS);
}

size_t dsv4_seq_state_bytes(const struct dsv4_kv_dims *dims, int max_ctx, enum dsv4_row_fmt fmt, bool mtp)
{
    size_t n_pages = (size_t)(max_ctx + DSV4_KV_PAGE_TOKENS - 1) / DSV4_KV_PAGE_TOKENS;
    return session_bytes(dims, max_ctx, fmt, mtp) + sizeof(int32_t) * n_pages +
           sizeof(struct dsv4_layer_state) * (size_t)n_states_of(dims, mtp);
}

int dsv4_seq_state_init(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims, int max_ctx,
                        enum dsv4_row_fmt fmt, bool mtp, const struct dsv4_kv_mem *kvmem, struct dsv4_err *err)
{
    memset(st, 0, sizeof(*st));
    if (max_ctx < 1) return dsv4_err_set(err, DSV4_EINVAL, "context length must be at least 1 (got %d)", max_ctx);
    size_t bytes = session_bytes(dims, max_ctx, fmt, mtp);
    void  *mem   = dsv4_kv_mem_alloc(kvmem, bytes);
    if (!mem)
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %.1f MiB of KV state for a %d-token context",
                            (double)bytes / 1048576.0, max_ctx);
    int rc = dsv4_seq_state_bind(st, dims, max_ctx, DSV4_KV_PAGE_TOKENS, fmt, mtp, kvmem, mem, err);
    if (rc) {
        dsv4_kv_mem_free(kvmem, mem, bytes);
        return rc;
    }
    size_t slot = dsv4_kv_slot_bytes(dims, fmt, mtp), page = dsv4_kv_page_bytes(dims, fmt, DSV4_KV_PAGE_TOKENS);
    st->page_base  = (uint8_t *)mem + slot;
    st->page_bytes = page;
    for (int k = 0; k < st->n_pages; k++) st->page[k] = k;
    st->mem       = mem;
    st->mem_bytes = bytes;
    return DSV4_OK;
}

void dsv4_seq_state_free(struct dsv4_seq_state *st)
{
    dsv4_kv_mem_free(&st->kvmem, st->mem, st->mem_bytes);
    dsv4_seq_state_unbind(st);
}

void dsv4_seq_state_copy(struct dsv4_seq_state *dst, const struct dsv4_seq_state *src)
{
    DSV4_ASSERT(dst->mem && src->mem && dst->mem_bytes == src->mem_bytes);
    kv_copy(&dst->kvmem, dst->mem, src->mem, src->mem_bytes);
    dst->pos     = src->pos;
    dst->mtp_pos = src->mtp_pos;
}

static void reset_frontier(const struct dsv4_kv_mem *m, float *kv, float *sc, const struct dsv4_layer_kind *k, int d)
{
    size_t n = frontier_floats(k, d);
    kv_fill(m, kv, 0.0f, n);
    kv_fill(m, sc, -INFINITY, n);
}

void dsv4_seq_state_reset(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims)
{
    st->pos     = 0;
    st->mtp_pos = 0;
    for (int il = 0; il < st->n_states; il++) {
        struct dsv4_layer_state *ls = &st->layers[il];
        if (ls->ckv) reset_frontier(&st->kvmem, ls->ckv, ls->csc, &ls->kind, dims->d_head);
        if (ls->ikv) reset_frontier(&st->kvmem, ls->ikv, ls->isc, &ls->kind, dims->d_idx_head);
    }
}

/* ------------------------------------------------------------------ snapshots */

/* Copies between a state and a snapshot buffer, in the walker's snapshot order. */
static void snap_copy(const struct dsv4_seq_state *st, uint8_t *snap, bool save)
{
    size_t off = 0;
    int    n   = st->n_states;
#define PART(ptr, bytes)                                                                                           \
    do {                                                                                                           \
        if (save) kv_copy(&st->kvmem, snap + off, (ptr), (bytes));                                                 \
        else kv_copy(&st->kvmem, (ptr), snap + off, (bytes));                                                      \
        off += align64(bytes);                                                                                     \
    } while (0)
    for (int il = 0; il < n; il++) {
        const struct dsv4_layer_state *ls = &st->layers[il];
        PART(ls->ring, (size_t)st->ring_rows * (size_t)st->row_bytes);
        if (!ls->kind.overlap) continue; /* only an overlapping frontier keeps rows past a block */
        size_t fb = sizeof(float) * frontier_floats(&ls->kind, st->d_head) / 2;
        PART(ls->ckv, fb);
        PART(ls->csc, fb);
        if (ls->kind.idx_compress) {
            size_t ib = sizeof(float) * frontier_floats(&ls->kind, st->d_idx_head) / 2;
            PART(ls->ikv, ib);
            PART(ls->isc, ib);
        }
    }
    if (st->has_mtp) PART(st->mtp_x, sizeof(float) * (size_t)st->mtp_floats);
    if (st->engram) PART(st->engram, DSV4_KV_ENGRAM_BYTES);
#undef PART
}

void dsv4_kv_snapshot_save(const struct dsv4_seq_state *st, void *dst)
{
    DSV4_ASSERT(st->pos % st->page_tokens == 0);
    snap_copy(st, dst, true);
}

void dsv4_kv_snapshot_restore(struct dsv4_seq_state *st, const void *src, int pos)
{
    DSV4_ASSERT(pos % st->page_tokens == 0 && pos <= st->max_ctx);
    snap_copy(st, (uint8_t *)src, false);
    st->pos     = pos;
    st->mtp_pos = pos > 0 ? pos - 1 : 0; /* the pending MTP row, as after a forward step */
}
