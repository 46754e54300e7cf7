/*
 * backend.h - the internal op table: model-level fused ops the forward pass calls.
 *
 * One level of indirection, chosen at run time (house style "Backend interface"): the model
 * code in src/model/ never contains SIMD or loops over weights; it calls these ops with
 * explicit dims. The CPU backend provides a plain scalar reference of every op (ref_*.c) and
 * optimised variants selected per machine; every optimised op is tested against the
 * reference. A backend implements every op: there is no silent fallback.
 *
 * Activations are float arrays. Where the official demo holds a tensor in bf16, the value
 * stored here is rounded to bf16 (exactly representable in float), so numerics follow the
 * demo's dtype boundaries while the code stays in one type. Shapes are row-major; `ld`
 * arguments are row strides in elements.
 */
#ifndef DSV4_BACKEND_H
#define DSV4_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/core.h"
#include "io/io.h"

/* Bounds the ops rely on (stack arrays per row); the config is checked against them. */
enum { DSV4_MAX_LAYERS = 256, DSV4_MAX_HC = 8, DSV4_MAX_EXPERTS = 4096 };

/* ------------------------------------------------------------------ weights the ops read */

/* Storage format of a projection's weight, decided by the config and checked at bind. */
enum dsv4_wfmt {
    DSV4_WFMT_BF16, /* [n_out, n_in] bf16 */
    DSV4_WFMT_F32,  /* [n_out, n_in] f32 */
    DSV4_WFMT_FP8,  /* [n_out, n_in] e4m3 + scale [ceil(n_out/128), ceil(n_in/128)] */
    DSV4_WFMT_FP4,  /* [n_out, n_in/2] packed e2m1 (low nibble = even k) + scale [n_out, n_in/32] */
};

const char *dsv4_wfmt_name(enum dsv4_wfmt f);

/* One projection as the ops see it: bound by the model layer to checkpoint memory (or to a
 * backend's own copy, prepared at load). */
struct dsv4_linear {
    enum dsv4_wfmt  fmt;
    int             n_out, n_in;
    int             row_off;   /* first row of the tensor this view covers (grouped wo_a) */
    const void     *w;         /* see enum dsv4_wfmt for the layout */
    const void     *scale;     /* NULL for BF16/F32 */
    bool            scale_f32; /* scale tensor is F32 (base checkpoints) instead of E8M0 */
    const struct dsv4_tensor *wt, *st;
    /* The same weights as interleaved 16-row tiles for the bf16 kernels (backend/cpu/repack.c,
     * made at load), or NULL; si: FP4's scales in tile order. A view (row_off) shares them. */
    const void *wi, *si;
};

struct dsv4_expert_w {
    struct dsv4_linear w1; /* gate [d_ff_exp, d_model] */
    struct dsv4_linear w3; /* up   [d_ff_exp, d_model] */
    struct dsv4_linear w2; /* down [d_model, d_ff_exp] */
};

/* How a projection treats its input. */
enum dsv4_act {
    DSV4_ACT_NONE, /* use x as it is */
    DSV4_ACT_FP8,  /* quantise x per 128 along K to e4m3 with power-of-two (ue8m0) scales */
};

/* How a projection rounds its output. */
enum dsv4_out {
    DSV4_OUT_F32,  /* keep f32 */
    DSV4_OUT_BF16, /* round to bf16 */
};

/* Storage of one cached attention row (window ring or compressed row). */
enum dsv4_row_fmt {
    DSV4_ROW_FP8,  /* d_nope e4m3 codes, d_nope/64 e8m0 scales, d_rope bf16 (lossless after FP8 sim) */
    DSV4_ROW_BF16, /* d_head bf16 (initial revision: the nope part is not FP8-rounded) */
};

/* One RoPE frequency set: angle of pair i at position p = f32(p) * freq[i] (computed in f32
 * and passed through cosf/sinf, as the demo's torch.polar on an f32 outer product). */
struct dsv4_rope_table {
    int          d_rope;
    const float *freq; /* [d_rope / 2] */
};

struct dsv4_backend;

struct dsv4_backend_ops {
    const char *name;

    /* y[n_tok, w->n_out] = x[n_tok, w->n_in] . W^T, any weight format (dsv4_wfmt). With
     * DSV4_ACT_FP8 each 128-block of a row of x is quantised to e4m3 (scale
     * 2^ceil(log2(max(amax,1e-4)/448))); partial sums per block are scaled by the activation
     * and weight scales, as the demo's fp8_gemm/fp4_gemm. */
    void (*linear)(struct dsv4_backend *be, const struct dsv4_linear *w, int n_tok, const float *x, int ldx,
                   float *y, int ldy, enum dsv4_act act, enum dsv4_out out);

    /* y[n, d] = bf16(w * x / sqrt(mean(x^2) + eps)), f32 inside (w bf16 [d]). x may equal y. */
    void (*rmsnorm)(struct dsv4_backend *be, int n, int d, const float *x, int ldx, const uint16_t *w, double eps,
                    float *y, int ldy);

    /* In place over q[n, n_head, d_head]: unweighted RMS per head, every step rounded to
     * bf16 as the demo computes it on a bf16 tensor (square, mean, + eps, rsqrt, product). */
    void (*head_rms)(struct dsv4_backend *be, int n, int n_head, int d_head, float *q, double eps);

    /* In place: rotate interleaved pairs of the last d_rope dims of n_vec vectors per row
     * (row r has position pos[r]; vectors of d_full dims, the row holds n_vec of them),
     * inverse = rotate by -angle. Result rounded to bf16. */
    void (*rope)(struct dsv4_backend *be, int n, int n_vec, int d_full, float *x, const int *pos,
                 const struct dsv4_rope_table *t, bool inverse);

    /* In place quantise->dequantise of x[n, d] (row stride ld) in blocks of `block`:
     * e4m3 with qmax 448 and amax floor 1e-4, or e2m1 with qmax 6 and floor 6*2^-126. */
    void (*fp8_sim)(struct dsv4_backend *be, int n, int d, int ld, float *x, int block);
    void (*fp4_sim)(struct dsv4_backend *be, int n, int d, int ld, float *x, int block);

    /* In place: x[n, d] = bf16(H_d x / sqrt(d)), Sylvester Walsh-Hadamard, d a power of two. */
    void (*hadamard)(struct dsv4_backend *be, int n, int d, float *x);

    /* Hyper-connection pre: X[n, hc, d] -> u[n, d] (bf16), post[n, hc], comb[n, hc, hc]
     * (docs/MODEL.md §R3.2, Sinkhorn with `iters` iterations). */
    void (*hc_pre)(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                   const float *scale, const float *base, int iters, double norm_eps, double hc_eps, float *u,
                   float *post, float *comb);
    /* Hyper-connection post: Xout[n,hc,d] = bf16(post[k] f + sum_j comb[j][k] Xres[j]). */
    void (*hc_post)(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                    const float *post, const float *comb, float *Xout);
    /* Final collapse: y[n, d] = bf16(sum_j (sigmoid(mix_j scale + base_j) + eps) X[j]). */
    void (*hc_head)(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                    const float *scale, const float *base, double norm_eps, double hc_eps, float *y);

    /* Sink attention of one query position: q[n_head, d_head] against n_rows cached rows
     * (rows[i] in `fmt`, shared K = V), o[n_head, d_head] = bf16(sum_t p_t V_t / (sum_t p_t +
     * exp(sink_h - m))) with p_t = exp(s_t - m), s_t = q.K_t * scale (probabilities rounded to
     * bf16 in the numerator, as the demo's kernel). */
    void (*attention)(struct dsv4_backend *be, int n_head, int d_head, int d_rope, const float *q,
                      const uint8_t *const *rows, int n_rows, enum dsv4_row_fmt fmt, const float *sink,
                      float scale, float *o);

    /* Indexer scores of one query over n_keys compact FP4 key rows (docs/MODEL.md §R3.7, bf16 at
     * the four points of §11.2): score[j] = sum_h bf16(w_h * relu(bf16(q_h . k_j))). Keys sit
     * in blocks of block_keys rows (the KV pages): key j at blocks[j / block_keys] +
     * (j % block_keys) * dsv4_idx_key_bytes(d). */
    void (*indexer_scores)(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                           const uint8_t *const *blocks, int block_keys, int n_keys, float *score);

    /* Router: scores[n, n_exp] = sqrt(softplus(x . G^T)) in f32; selects n_used experts per
     * row (tid2eid rows when given, else top-k of scores + bias, ties to the lower index);
     * weights = selected scores / their sum * route_scale. scratch: [(n + 1) * n_exp]. */
    void (*router)(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                   const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                   double route_scale, int *ids, float *weights, float *scratch);

    /* One SwiGLU expert over n rows of x[n, d_model] (FP8/FP4 activations as the demo):
     * h = silu(min(g, limit)) * clamp(v, +-limit) (no clamp when limit <= 0), times
     * row_w[r] when row_w is given, then y[n, d_model] = bf16(W2 . bf16(h)). */
    void (*expert)(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                   const float *row_w, double limit, float *y, float *scratch);

    /* The routed experts of one MoE layer over a whole step, as `expert` for each group:
     * group g runs experts[ids[g]] on rows x[off[g] .. off[g+1]) of the gathered rows
     * x[n_pairs, d_model] with weights row_w[off[g] ..], writing y[off[g] ..]. Lets the
     * backend read each expert once and spread all experts over its threads in one go.
     * scratch: [2 * n_pairs * d_ff_exp] floats. */
    void (*experts)(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_groups, const int *ids,
                    const int *off, const float *x, const float *row_w, double limit, float *y, float *scratch);
};

/*
 * An execution context: the op table, the backend's shared state (thread pool, ...) and
 * scratch owned by this context alone. One context per session (or per worker), never
 * shared between threads, so ops can use the scratch without locks and without allocating.
 */
struct dsv4_prof;

struct dsv4_backend {
    const struct dsv4_backend_ops *ops;
    void                          *impl;        /* backend state shared by contexts */
    float                         *scratch;     /* [scratch_len] */
    size_t                         scratch_len;
    struct dsv4_prof              *prof;        /* op profiler (prof.c) when ops is its table */
};

/* ------------------------------------------------------------------ profiler (prof.c) */

/*
 * DSV4_PROFILE=FILE: every op call is timed into a buffer allocated up front; at the end a
 * Chrome/Perfetto trace (FILE, JSON "X" events) is written and a table of time share per op
 * is printed. The profiled op table wraps the real one; nested op calls (the router and the
 * experts call linear) appear nested in the trace.
 */
extern const struct dsv4_backend_ops dsv4_prof_ops;

struct dsv4_prof *dsv4_prof_create(const char *path, const struct dsv4_backend_ops *inner, size_t max_events);
/* Writes the trace and prints the table to f (stderr); frees the profiler. */
void              dsv4_prof_finish(struct dsv4_prof *p, FILE *f);
/* A named span that is not an op (a forward step). */
void              dsv4_prof_begin(struct dsv4_prof *p, const char *name);
void              dsv4_prof_end(struct dsv4_prof *p);

/* The CPU backend with the scalar reference ops. */
extern const struct dsv4_backend_ops dsv4_cpu_ref_ops;

/* ------------------------------------------------------------------ row codecs (shared) */

/* Bytes per cached row for a format. */
static inline int dsv4_row_bytes(enum dsv4_row_fmt fmt, int d_head, int d_rope)
{
    int d_nope = d_head - d_rope;
    return fmt == DSV4_ROW_FP8 ? d_nope + d_nope / 64 + 2 * d_rope : 2 * d_head;
}

/* Encodes a row whose nope part is already FP8-simulated (values code * 2^k per 64):
 * lossless. For DSV4_ROW_BF16 stores the bf16 values. */
void dsv4_row_encode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const float *x, uint8_t *row);
void dsv4_row_decode(enum dsv4_row_fmt fmt, int d_head, int d_rope, const uint8_t *row, float *x);

/* Indexer key rows: d e2m1 codes (two per byte, low nibble first) and d/32 e8m0 scales. */
static inline int dsv4_idx_key_bytes(int d)
{
    return d / 2 + d / 32;
}
void dsv4_idx_key_encode(int d, const float *x, uint8_t *row);
void dsv4_idx_key_decode(int d, const uint8_t *row, float *x);

/* Activation quantisation shared by the reference ops: per-block power-of-two scale. */
float dsv4_act_scale(float amax, float qmax, float floor_);

/* ------------------------------------------------------------------ backend lifecycle */

/*
 * A backend as the model layer sees it (model.c, step.c): created from explicit parameters,
 * it hands out its op table, prepares the checkpoint's projections at load (repacking them
 * into its own layout, or uploading them), and says how much scratch a step plan needs. The
 * model layer names no backend's types; dsv4_backend_find picks one by name.
 */
struct dsv4_config; /* model/model.h: the widths a plan is sized by */

struct dsv4_backend_params {
    const char               *level;     /* the backend's code path ("avx2", "ref", ...); NULL = best */
    int                       n_threads; /* 0 = all */
    bool                      tiles;     /* may repack weights into its preferred layout */
    const struct dsv4_logger *lg;
};

/* The projections of a loaded model, for prepare_weights. */
struct dsv4_weight_set {
    struct dsv4_checkpoint *ck;   /* the mapped checkpoint (stored tiles, read-ahead) */
    /* calls fn on every projection, in a fixed order */
    void (*each_linear)(void *ctx, void (*fn)(struct dsv4_linear *l, void *ud), void *ud);
    void  *ctx;
    size_t replaced;              /* out: checkpoint bytes the prepared copies stand in for */
};

struct dsv4_backend_kind {
    const char *name;
    int  (*create)(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err);
    void (*destroy)(void *impl); /* also frees what prepare_weights made */
    const struct dsv4_backend_ops *(*ops)(void *impl);
    /* one line for logs: "avx2, 2 threads" */
    void (*describe)(void *impl, char *buf, size_t cap);
    int  (*prepare_weights)(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                            struct dsv4_err *err);
    /* scratch floats a step context needs beyond the model layer's own buffers, for batches of
     * up to max_rows rows and attention over up to max_attn_rows cached rows */
    size_t (*scratch_floats)(void *impl, const struct dsv4_config *cfg, int max_rows, int max_attn_rows);
};

/* The backend called name (NULL or "" = the default, "cpu"); NULL if this build has none. */
const struct dsv4_backend_kind *dsv4_backend_find(const char *name);

#endif /* DSV4_BACKEND_H */
