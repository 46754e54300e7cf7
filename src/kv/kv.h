/*
 * kv.h - the per-sequence state of DeepSeek-V4 attention (docs/MODEL.md §R4), split by how it
 * grows:
 *
 *   slot (fixed size, independent of the position) - per layer with state:
 *     ring   [ring_rows, row_bytes]   the last raw KV rows, slot = position % ring_rows: the
 *                                     window plus DSV4_SPEC_MAX_DRAFT rows, so that the rows a
 *                                     rejected speculative verify wrote never overwrite one a
 *                                     later query still reads (docs/SPECULATIVE.md)
 *     ckv/csc, ikv/isc                compressor frontiers: values and gate logits (gate + ape)
 *                                     of the tokens of the incomplete block; with overlap
 *                                     (the layer kind's, model/layer_kind.h) rows
 *                                     0..ratio-1 hold the previous complete block and rows
 *                                     ratio..2*ratio-1 the current one
 *     mtp_x  [hc, d_model]            (MTP only) final streams of position mtp_pos
 *     mtp_h  [hc, d_model]            (MTP only) the MTP block's output streams of the last
 *                                     draft row, the input of a chained draft
 *   pages (what grows) - page k holds positions [k * page_tokens, (k+1) * page_tokens) of
 *   every layer, laid out layer after layer:
 *     comp   [page_tokens / ratio, row_bytes]   compressed rows; row j covers positions
 *                                               j*ratio..(j+1)*ratio-1
 *     idx    [page_tokens / ratio, idx_bytes]   indexer key rows (layers with an indexer)
 *   page_tokens is a power of two that every compression ratio divides (256 by default), so a
 *   compressed block never straddles two pages and a full page is final: nothing writes into
 *   it once the sequence has moved past it (the prefix cache shares such pages read-only).
 *
 * The forward pass reaches rings, frontiers, compressed rows and indexer keys only through
 * the step descriptor (backend.h: per sequence its slot, page base and page table) and a
 * layer's offsets in a slot (dsv4_kv_slot_off) and a page (comp_off, idx_off); where the
 * pages come from is the owner's business: a session
 * (kv_state.c) owns one slot and every page its context needs in one allocation; the serving
 * pool (kv_pool.h) maps pages from a shared free list as positions advance.
 *
 * Rows are stored in the compact lossless form (backend.h dsv4_row_fmt: e4m3 codes + e8m0
 * scales for the nope dims, bf16 for the rope dims) or as bf16 for the initial demo revision,
 * whose cached KV is not FP8-rounded. Indexer keys are e2m1 codes + e8m0 scales (lossless
 * after the FP4 simulation). Frontier states are f32.
 *
 * A snapshot is what a sequence needs, besides its full pages, to resume bit-exactly at a
 * page boundary: the rings and, for overlapping compressors, the previous complete block;
 * with the MTP block's state, its ring and the pending streams (mtp_x) too.
 * At a block boundary every other frontier row is overwritten before it is read again, so
 * the snapshot leaves them out.
 */
#ifndef DSV4_KV_H
#define DSV4_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "kv/kv_dims.h"

enum { DSV4_KV_PAGE_TOKENS = 256 };
/* Slot bytes of V4.1's Engram history (at least sizeof(struct dsv4_engram_seq), which the
 * model checks; 64 keeps the slot's parts aligned). */
enum { DSV4_KV_ENGRAM_BYTES = 64 };

/* DSV4_SPEC_MAX_DRAFT (dsv4.h), the most draft tokens of a verify step: the rings keep that
 * many rows beyond the window. */

/*
 * Where KV memory (slots, pages, snapshots) lives: the backend's memory (kind->alloc with
 * DSV4_MEM_KV), written only through its upload and copy, so the rows and frontiers can sit
 * where the ops run. kind NULL: the host heap (tools and tests without a model).
 */
struct dsv4_kv_mem {
    const struct dsv4_backend_kind *kind;
    void                           *impl;
};

void *dsv4_kv_mem_alloc(const struct dsv4_kv_mem *m, size_t bytes);
void  dsv4_kv_mem_free(const struct dsv4_kv_mem *m, void *p, size_t bytes);

struct dsv4_layer_state {
    struct dsv4_layer_kind kind; /* the layer's (dims->kind[il]): ratio, overlap (coff), indexer */
    uint8_t *ring;      /* [ring_rows, row_bytes] */
    float   *ckv, *csc; /* [coff*ratio, coff*d_head] */
    float   *ikv, *isc; /* [coff*ratio, coff*d_idx_head] (with an indexer) */
    size_t   comp_off;  /* byte offset in a page of [page_tokens / ratio, row_bytes] */
    size_t   idx_off;   /* byte offset in a page of [page_tokens / ratio, idx_bytes] (with an indexer) */
};

struct dsv4_seq_state {
    int                      pos;         /* tokens consumed so far */
    int                      max_ctx;
    enum dsv4_row_fmt        fmt;
    int                      row_bytes;
    int                      idx_bytes;
    int                      window;
    int                      ring_rows;   /* window + DSV4_SPEC_MAX_DRAFT */
    int                      d_head, d_idx_head;
    int                      n_states;    /* n_layer, + the draft layers (kv_state.c) when they have state */
    struct dsv4_layer_state *layers;      /* [n_states]; the MTP block's state is last */
    uint8_t                 *slot;        /* the slot the layers point into (the step
                                             descriptor's per-sequence base) */
    bool                     has_mtp;
    float                   *mtp_x;       /* [hc, d_model] final streams of position mtp_pos */
    float                   *mtp_h;       /* [hc, d_model] the last draft row's MTP output streams */
    int                      mtp_floats;  /* hc * d_model */
    int                      mtp_pos;     /* next position the MTP block runs for (every one below
                                             is done): pos - 1 after a forward step, pos after a
                                             draft ran the pending one (0 at the start) */
    uint8_t                 *engram;      /* [DSV4_KV_ENGRAM_BYTES] in the slot: V4.1's Engram history
                                             (struct dsv4_engram_seq, model/engram_hash.h; the forward
                                             resets it at position 0), NULL without Engram layers */
    int                      page_tokens; /* positions per page */
    int                      n_pages;     /* entries of page: ceil(max_ctx / page_tokens) */
    int32_t                 *page;        /* [n_pages] page table: id of the page of positions
                                             k*page_tokens.. in the pool, or -1 (unmapped) */
    uint8_t                 *page_base;   /* the pool: page id i at page_base + i * page_bytes */
    size_t                   page_bytes;
    struct dsv4_kv_mem       kvmem;       /* where the slot and pages live */
    void                    *meta;        /* layers and page table (one allocation, host) */
    void                    *mem;         /* sessions: slot then pages, one allocation */
    size_t                   mem_bytes;
};

/* ------------------------------------------------------------------ sizes */

/* Bytes of one slot, one page and one snapshot for this model (64-byte aligned parts). */
size_t dsv4_kv_slot_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, bool mtp);
size_t dsv4_kv_page_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, int page_tokens);
size_t dsv4_kv_snap_bytes(const struct dsv4_kv_dims *dims, enum dsv4_row_fmt fmt, bool mtp);
/* True when page_tokens is a power of two that every compression ratio of dims divides. */
bool   dsv4_kv_page_tokens_ok(const struct dsv4_kv_dims *dims, int page_tokens);

/* ------------------------------------------------------------------ sessions (private pages) */

/* Bytes one session sequence needs (the figure behind the public memory estimate). */
size_t dsv4_seq_state_bytes(const struct dsv4_kv_dims *dims, int max_ctx, enum dsv4_row_fmt fmt, bool mtp);
/* One allocation holding the slot and every page of the context, zero-filled on purpose so
 * that page faults happen here and not in the token loop; all pages mapped. */
int    dsv4_seq_state_init(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims, int max_ctx,
                           enum dsv4_row_fmt fmt, bool mtp, const struct dsv4_kv_mem *mem, struct dsv4_err *err);
void   dsv4_seq_state_free(struct dsv4_seq_state *st);
/* Back to position 0: compressor frontiers to (value 0, gate -inf). Pages stay mapped. */
void   dsv4_seq_state_reset(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims);
/* Copies the whole state of src into dst (both from dsv4_seq_state_init, same parameters). */
void   dsv4_seq_state_copy(struct dsv4_seq_state *dst, const struct dsv4_seq_state *src);

/* ------------------------------------------------------------------ pool slots */

/* Points st at a slot of dsv4_kv_slot_bytes() bytes (caller-owned) with an empty page table
 * of ceil(max_ctx / page_tokens) entries; allocates only the table (start-up). */
int  dsv4_seq_state_bind(struct dsv4_seq_state *st, const struct dsv4_kv_dims *dims, int max_ctx, int page_tokens,
                         enum dsv4_row_fmt fmt, bool mtp, const struct dsv4_kv_mem *mem, void *slot,
                         struct dsv4_err *err);
void dsv4_seq_state_unbind(struct dsv4_seq_state *st);

/* ------------------------------------------------------------------ snapshots */

/* Saves the resumable part of the state (rings, previous-block frontiers) to dst
 * [dsv4_kv_snap_bytes]; valid when st->pos is a page boundary. */
void dsv4_kv_snapshot_save(const struct dsv4_seq_state *st, void *dst);
/* Restores a snapshot taken at position pos (the pages below pos must be mapped by the
 * caller). The frontier rows a snapshot leaves out keep whatever they held: they are
 * written before they are next read. */
void dsv4_kv_snapshot_restore(struct dsv4_seq_state *st, const void *src, int pos);

/* ------------------------------------------------------------------ accessors */

/* Where p (a ring or frontier of st's layers) lies in the slot: the same offset in every
 * slot of a model, which a whole-step op takes once for all the sequences of a step. */
static inline size_t dsv4_kv_slot_off(const struct dsv4_seq_state *st, const void *p)
{
    return (size_t)((const uint8_t *)p - st->slot);
}

/* True when every page holding positions [p0, p1) is mapped. */
static inline bool dsv4_kv_mapped(const struct dsv4_seq_state *st, int p0, int p1)
{
    for (int k = p0 / st->page_tokens; p1 > p0 && k <= (p1 - 1) / st->page_tokens; k++)
        if (k >= st->n_pages || st->page[k] < 0) return false;
    return true;
}

#endif
