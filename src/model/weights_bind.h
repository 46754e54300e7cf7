/*
 * weights_bind.h - the checking binder that weights.c (DeepSeek-V4) and weights_v41.c
 * (DeepSeek-V4.1) share: each tensor is looked up by name, its dtype and shape checked against
 * what the config implies, and every problem collected in the report with the tensor named
 * (missing, wrong dtype, wrong shape; weights.c adds the unexpected ones at the end).
 * Internal to src/model.
 */
#ifndef DSV4_WEIGHTS_BIND_H
#define DSV4_WEIGHTS_BIND_H

#include "model/model.h"

#define DSV4_DT(x) (1u << DSV4_DTYPE_##x)

struct dsv4_binder {
    const struct dsv4_config     *cfg;
    const struct dsv4_checkpoint *ck;
    struct dsv4_arena            *arena;
    struct dsv4_bind_report      *rep;
    uint8_t                      *used; /* [ck->n_tensors] */
    int                           cap;
    bool                          oom;
    dsv4_layout_fn                layout; /* layout only (ck NULL): each tensor goes to layout */
    void                         *layout_ud;
};

void dsv4_bind_problem(struct dsv4_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Looks up one tensor and checks dtype (one of the mask) and shape ([d0] or [d0, d1]).
 * Returns it, or NULL (problem reported) when missing, of a wrong dtype or shape. */
const struct dsv4_tensor *dsv4_bind_expect(struct dsv4_binder *b, const char *name, uint32_t dtypes, int ndim,
                                           int64_t d0, int64_t d1);
/* The same, returning the data to read as a typed array (copied once when misaligned). */
const void *dsv4_bind_expect_data(struct dsv4_binder *b, const char *name, uint32_t dtypes, int ndim, int64_t d0,
                                  int64_t d1);
/* A projection [n_out, n_in] named prefix.weight (+ prefix.scale for FP8, whose blocks are
 * cfg->fp8_block square, and FP4, a scale per 32 inputs). */
void dsv4_bind_linear(struct dsv4_binder *b, struct dsv4_linear *l, const char *prefix, enum dsv4_wfmt fmt,
                      int n_out, int n_in);
/* A block's norms and hyper-connection mixes (p: "layers.N." or "mtp.S."). */
void dsv4_bind_block_common(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p);
/* attn_sink, the q / kv / output projections and their norms (p: the block's prefix). */
void dsv4_bind_attn_core(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p);
/* The shared expert and n_exp routed experts of ffn (allocated in the arena). */
void dsv4_bind_experts(struct dsv4_binder *b, struct dsv4_layer_w *L, const char *p, int n_exp);

/* weights_v41.c: the DeepSeek-V4.1 tensors (docs/MODEL.md "DeepSeek-V4.1"); the DSpark stages
 * only when any_mtp (some mtp.* tensor is in the checkpoint). */
void dsv4_bind_v41(struct dsv4_binder *b, struct dsv4_weights *w, bool any_mtp);

#endif /* DSV4_WEIGHTS_BIND_H */
