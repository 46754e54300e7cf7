/*
 * kv.h - the per-sequence state of DeepSeek-V4 attention (model-v4.md §4).
 *
 * Per layer (and for the MTP block, which is a sliding-window layer):
 *   ring   [window] rows      the last `window` raw KV rows, slot = position % window
 *   comp   [max_ctx/ratio]    compressed KV rows, row j covers positions j*ratio..(j+1)*ratio-1
 *   idx    [max_ctx/4]        indexer key rows (CSA layers only)
 *   ckv/csc, ikv/isc          compressor frontiers: values and gate logits (gate + ape) of the
 *                             tokens of the incomplete block; with overlap (ratio 4) slots
 *                             0..3 hold the previous complete block and 4..7 the current one
 * Rows are stored in the compact lossless form (backend.h dsv4_row_fmt: e4m3 codes + e8m0
 * scales for the nope dims, bf16 for the rope dims) or as bf16 for the initial demo revision,
 * whose cached KV is not FP8-rounded. Indexer keys are e2m1 codes + e8m0 scales (lossless after
 * the FP4 simulation). Frontier states are f32.
 *
 * Memory: one allocation per sequence, sized once from max_ctx and zero-filled at creation on
 * purpose, so that page faults happen at session creation and not in the token loop.
 */
#ifndef DSV4_KV_H
#define DSV4_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"

struct dsv4_layer_state {
    int      ratio;
    uint8_t *ring;     /* [window, row_bytes] */
    uint8_t *comp;     /* [max_ctx / ratio, row_bytes] */
    uint8_t *idx;      /* [max_ctx / 4, idx_key_bytes] */
    float   *ckv, *csc; /* [coff*ratio, coff*d_head] */
    float   *ikv, *isc; /* [coff*ratio, coff*d_idx_head] */
};

struct dsv4_seq_state {
    int                      pos;        /* tokens consumed so far */
    int                      max_ctx;
    enum dsv4_row_fmt        fmt;
    int                      row_bytes;
    int                      idx_bytes;
    int                      n_states;   /* n_layer, + 1 when the MTP block has state */
    struct dsv4_layer_state *layers;     /* [n_states]; the MTP block's state is last */
    bool                     has_mtp;
    float                   *mtp_x;      /* [hc, d_model] final streams of position pos-1 */
    void                    *mem;
    size_t                   mem_bytes;
};

/* Bytes one sequence needs (the figure behind the public memory estimate). */
size_t dsv4_seq_state_bytes(const struct dsv4_config *cfg, int max_ctx, enum dsv4_row_fmt fmt, bool mtp);
int    dsv4_seq_state_init(struct dsv4_seq_state *st, const struct dsv4_config *cfg, int max_ctx,
                           enum dsv4_row_fmt fmt, bool mtp, struct dsv4_err *err);
void   dsv4_seq_state_free(struct dsv4_seq_state *st);
/* Back to position 0: compressor frontiers to (value 0, gate -inf). */
void   dsv4_seq_state_reset(struct dsv4_seq_state *st, const struct dsv4_config *cfg);

#endif
