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

#include "backend/op_list.h"
#include "core/core.h"
#include "io/io.h"

/* Bounds the ops rely on (stack arrays per row); the config is checked against them. */
enum { DSV4_MAX_LAYERS = 256, DSV4_MAX_HC = 8, DSV4_MAX_EXPERTS = 4096 };

/* ------------------------------------------------------------------ weights the ops read */

/* Storage format of a projection's weight, decided by the config and checked at bind. */
enum dsv4_wfmt {
    DSV4_WFMT_BF16, /* [n_out, n_in] bf16 */
    DSV4_WFMT_F32,  /* [n_out, n_in] f32 */
    DSV4_WFMT_FP8,  /* [n_out, n_in] e4m3 + scale [ceil(n_out/B), ceil(n_in/B)], B = block */
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
    int             block;     /* FP8: the edge B of the BxB weight scale blocks; FP8 and FP4: the
                                * group of DSV4_ACT_FP8 (B inputs per activation scale). 128 (V4)
                                * or 32 (V4.1): the config's fp8_block, set at bind */
    const struct dsv4_tensor *wt, *st;
    /* What the backend's prepare_weights made for this weight (its own layout or copy: the
     * CPU's interleaved tiles, a device's upload), owned and read by that backend alone, or
     * NULL. A view (row_off) shares it. */
    const void *prep;
};

/* Blocks of w->block inputs in a row of w (the last may be short). */
static inline int dsv4_linear_n_kb(const struct dsv4_linear *w)
{
    return (w->n_in + w->block - 1) / w->block;
}

/* Index in an FP8 weight's scale tensor of weight (o, k), o counted from the tensor's first row. */
static inline size_t dsv4_fp8_scale_index(const struct dsv4_linear *w, int o, int k)
{
    return (size_t)(o / w->block) * (size_t)dsv4_linear_n_kb(w) + (size_t)(k / w->block);
}

struct dsv4_expert_w {
    struct dsv4_linear w1; /* gate [d_ff_exp, d_model] */
    struct dsv4_linear w3; /* up   [d_ff_exp, d_model] */
    struct dsv4_linear w2; /* down [d_model, d_ff_exp] */
};

/* How a projection treats its input. */
enum dsv4_act {
    DSV4_ACT_NONE, /* use x as it is */
    DSV4_ACT_FP8,  /* quantise x per w->block along K to e4m3 with power-of-two (ue8m0) scales */
};

/* How a projection rounds its output. */
enum dsv4_out {
    DSV4_OUT_F32,  /* keep f32 */
    DSV4_OUT_BF16, /* round to bf16 */
};

/* Storage of one cached row (window ring, compressed row, indexer key). */
enum dsv4_row_fmt {
    DSV4_ROW_FP8,     /* d_nope e4m3 codes, d_nope/64 e8m0 scales, d_rope bf16 (lossless after FP8 sim) */
    DSV4_ROW_BF16,    /* d_head bf16 (initial revision: the nope part is not FP8-rounded) */
    DSV4_ROW_IDX_FP4, /* indexer key: d e2m1 codes (two per byte, low nibble first), d/32 e8m0 scales */
};

/*
 * Stored rows as the ops address them: a pool (backend memory), a page table and the place
 * of these rows in a page. Row j lives at
 *     base + page[j / page_rows] * page_bytes + off + (j % page_rows) * row_bytes.
 * KV pages (kv.h) are one such set per layer and kind; a window ring or a chunk's staging
 * rows are a set of one page (page table {0}).
 */
struct dsv4_kv_rows {
    uint8_t       *base;
    const int32_t *page;       /* page ids, one per page_rows rows */
    size_t         page_bytes;
    size_t         off;        /* byte offset of row 0 of a page */
    int            page_rows;
    int            row_bytes;
};

static inline uint8_t *dsv4_kv_row_at(const struct dsv4_kv_rows *r, int j)
{
    return r->base + (size_t)r->page[j / r->page_rows] * r->page_bytes + r->off +
           (size_t)(j % r->page_rows) * (size_t)r->row_bytes;
}

/*
 * The step descriptor: the sequences of one forward step as the whole-step ops (attention,
 * indexer_topk, compress, store_rows) see them. The host builds it once per step, where it
 * lays out the step's rows (model/forward.c), and hands it to step_begin; every per-layer
 * call of those ops then passes the same descriptor plus the layer's scalars (offsets inside
 * a slot and a page, ratio, formats, widths). Everything per sequence is per step, not per
 * layer: a slot base, a page table and a page base. So a device backend uploads it once per
 * step (in step_begin) and launches one grid per op and layer over all the sequences.
 *
 * Sequence s owns the step's rows seq[s].row0 .. row0 + n - 1 (positions p0 ..); a sequence
 * may have n = 0 (it then takes part in nothing). Every sequence of a step shares one state
 * layout (kv.h: one model, one page size), which is why per-layer offsets are the same for
 * all. The descriptor and its arrays are host memory, as the other host metadata.
 */
struct dsv4_step_seq {
    int            row0, n, p0;  /* its first row in the step, its rows, their first position */
    uint8_t       *slot;         /* its slot (kv.h): window rings and compressor frontiers */
    uint8_t       *page_base;    /* its pool: page id i at page_base + i * page_bytes */
    const int32_t *page;         /* its page table: the page of positions k * page_tokens .. */
};

struct dsv4_step_desc {
    int                         n_seqs;
    int                         n_rows;      /* rows of the step (pos, tok) */
    const struct dsv4_step_seq *seq;         /* [n_seqs] */
    const int                  *pos, *tok;   /* [n_rows] position and token id of each row */
    int                         page_tokens; /* positions per page, every sequence */
    size_t                      page_bytes;
};

/* The compressed rows (or indexer keys) of sequence s of a layer as a paged set: rows_off is
 * their offset in a page, `ratio` positions per row. */
static inline struct dsv4_kv_rows dsv4_step_page_rows(const struct dsv4_step_desc *d, int s, size_t rows_off,
                                                      int ratio, int row_bytes)
{
    return (struct dsv4_kv_rows){ .base = d->seq[s].page_base, .page = d->seq[s].page, .page_bytes = d->page_bytes,
                                  .off = rows_off, .page_rows = d->page_tokens / ratio, .row_bytes = row_bytes };
}

/* Blocks of `ratio` positions that sequence s completes in this step (compress's rows). */
static inline int dsv4_step_blocks(const struct dsv4_step_desc *d, int s, int ratio)
{
    return (d->seq[s].p0 + d->seq[s].n) / ratio - d->seq[s].p0 / ratio;
}

/* The first of sequence s's compressed rows in compress's output: the blocks of the
 * sequences before it, packed in sequence order. */
static inline int dsv4_step_block0(const struct dsv4_step_desc *d, int s, int ratio)
{
    int r = 0;
    for (int i = 0; i < s; i++) r += dsv4_step_blocks(d, i, ratio);
    return r;
}

/*
 * What one layer's attention reads, besides the descriptor. Query row r (of sequence s, at
 * position p) reads, in this order:
 *   the window: positions max(0, p - window + 1) .. p, those before the sequence's p0 from
 *   its ring (slot + ring_off, row pos % ring_rows), the others from `chunk` (the step's
 *   staging rows: step row r' at chunk + r' * row_bytes);
 *   compressed rows (its pages, rows at comp_off, page_tokens / ratio a page): with sel, the
 *   n_sel[r] rows sel[r * sel_stride ..]; without, every completed row 0 .. (p + 1) / ratio
 *   - 1 (none when ratio is 0).
 * sel and n_sel are indexed by step row: each sequence's slice of one step buffer.
 */
/* DeepSeek-V4.1's candidate pre-filter (docs/MODEL.md §6, the official
 * select_candidate_blocks), an optional part of indexer_topk. The keys are grouped in blocks
 * of `block`; a block scores its best completed key. The candidate source (pick) keeps, per
 * step row, the n_keep best blocks (ties to the lower id), the block holding the row's newest
 * key always among them, and writes their ids ascending to blocks[r * n_keep ..], -1 past
 * min(n_keep, its blocks); a later index source (!pick) reads them and chooses its top-k among
 * the keys of those blocks only: n_sel = min(topk, those keys). blocks is backend memory. */
struct dsv4_idx_cand {
    int  block, n_keep;
    bool pick;
    int *blocks;
};

struct dsv4_attn_src {
    int            window, ratio, ring_rows, row_bytes;
    size_t         ring_off, comp_off;
    const uint8_t *chunk;
    const int     *sel, *n_sel;
    int            sel_stride;
    /* A draft block (DeepSeek-V4.1's DSpark stages, docs/SPECULATIVE.md): not causal. Every
     * query of a sequence's chunk (p0, n rows) reads the ring rows of positions
     * max(0, p0 - window) .. p0 - 1, then all n chunk rows; ratio is 0. Read as the window
     * of a query at p0 + n - 1 that is n rows wider. */
    bool           block;
};

/* Where store_rows puts rows (every sequence of the step at once). */
enum dsv4_store_to {
    DSV4_STORE_STEP,   /* row r of x (every row of the step) to rows + r * row_bytes (staging) */
    DSV4_STORE_RING,   /* each sequence's last min(n, window) rows to its ring: position p to row
                          p % ring_rows of slot + off */
    DSV4_STORE_BLOCKS, /* the rows of the blocks each sequence completes, packed as compress
                          writes them (dsv4_step_block0), to its pages: block j to row j of the
                          set at off in a page, page_tokens / ratio rows a page */
};

struct dsv4_store_dst {
    enum dsv4_store_to to;
    uint8_t           *rows;              /* STEP */
    size_t             off;               /* RING: in a slot; BLOCKS: in a page */
    int                window, ring_rows; /* RING */
    int                ratio;             /* BLOCKS */
    int                row_bytes;
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
     * DSV4_ACT_FP8 each w->block-group of a row of x is quantised to e4m3 (scale
     * 2^ceil(log2(max(amax,1e-4)/448))); partial sums per block are scaled by the activation
     * and weight scales, as the demo's fp8_gemm/fp4_gemm. FP8/FP4 weights have n_in a
     * multiple of w->block (the config checks it: model/config.c), and DSV4_ACT_FP8 goes with
     * FP8 or FP4 weights only. */
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
     * e4m3 with qmax 448 and amax floor 1e-4, or e2m1 with qmax 6 and floor 6*2^-126;
     * d is a multiple of block. Scales are powers of two; fp4_sim with e4m3_scale
     * (DeepSeek-V4.1's compressed KV, groups of 16: official fp4_act_quant with an e4m3
     * scale) takes s = e4m3(max(amax, 6*2^-9) / 6) (round to nearest even, saturating) and
     * x = bf16(e2m1(clamp(x / s, -6, 6)) * s), the division in f32. */
    void (*fp8_sim)(struct dsv4_backend *be, int n, int d, int ld, float *x, int block);
    void (*fp4_sim)(struct dsv4_backend *be, int n, int d, int ld, float *x, int block, bool e4m3_scale);

    /* In place: x[n, d] = bf16(H_d x / sqrt(d)), Sylvester Walsh-Hadamard, d a power of two. */
    void (*hadamard)(struct dsv4_backend *be, int n, int d, float *x);

    /* Hyper-connection pre: X[n, hc, d] -> u[n, d] (bf16), post[n, hc], comb[n, hc, hc]
     * (docs/MODEL.md §R3.2, Sinkhorn with `iters` iterations); u = bf16(sum_j pre_j X_j).
     * lag NULL (V4): pre is the row's own. lag[n, hc] given (DeepSeek-V4.1's lagged
     * hyper-connections, docs/MODEL.md §6): u collapses with the pre mix lag holds (the
     * previous sublayer's), then lag takes this one's pre. fn NULL (V4.1's final collapse,
     * lag given): u = bf16(sum_j lag_j X_j) only; scale, base, post, comb unused. */
    void (*hc_pre)(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                   const float *scale, const float *base, int iters, double norm_eps, double hc_eps, float *lag,
                   float *u, float *post, float *comb);
    /* Hyper-connection post: Xout[n,hc,d] = bf16(post[k] f + sum_j comb[j][k] Xres[j]). */
    void (*hc_post)(struct dsv4_backend *be, int n, int hc, int d, const float *f, const float *Xres,
                    const float *post, const float *comb, float *Xout);
    /* Final collapse: y[n, d] = bf16(sum_j (sigmoid(mix_j scale + base_j) + eps) X[j]). */
    void (*hc_head)(struct dsv4_backend *be, int n, int hc, int d, const float *X, const float *fn,
                    const float *scale, const float *base, double norm_eps, double hc_eps, float *y);

    /* Takes the step descriptor before the step's first whole-step op (below); every op
     * given a descriptor gets this one, unchanged, until the next step_begin. The CPU has
     * nothing to do (its ops read the host arrays in place); a device backend uploads it
     * here, once per step, and keeps the per-sequence arrays on the device. */
    void (*step_begin)(struct dsv4_backend *be, const struct dsv4_step_desc *desc);

    /* Sink attention of every row of the step (desc): q[n_rows, n_head, d_head] against the
     * rows src names for each (struct dsv4_attn_src; shared K = V, stored in `fmt`),
     * o[r] = bf16(sum_i p_i V_i / (sum_i p_i + exp(sink_h - m))) with p_i = exp(s_i - m),
     * s_i = q.K_i * scale (probabilities rounded to bf16 in the numerator, as the demo's
     * kernel). A query reads at most the step plan's max_attn_rows rows. */
    void (*attention)(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int n_head, int d_head, int d_rope,
                      const float *q, const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, const float *sink,
                      float scale, float *o);

    /* Indexer scores of one query over key rows 0 .. n_keys-1 of `keys` (DSV4_ROW_IDX_FP4;
     * docs/MODEL.md §R3.7, bf16 at the four points of §11.2):
     * score[j] = bf16(sum_h bf16(w_h * relu(bf16(q_h . k_j)))). */
    void (*indexer_scores)(struct dsv4_backend *be, int n_head, int d, const float *q, const float *w,
                           const struct dsv4_kv_rows *keys, int n_keys, float *score);

    /* The indexer's selection for every row of a layer with an indexer over the step (desc),
     * its keys one per `ratio` positions: row r (position p of sequence s) scores its
     * n_done = (p + 1) / ratio completed keys (s's pages, keys at keys_off, page_tokens /
     * ratio a page, key_bytes each) as indexer_scores with q[r * n_head * d ..] and
     * w[r * n_head ..], keeps the topk best (higher score first, ties to the lower id) and
     * writes their ids in ascending order to sel[r * topk ..] and min(topk, n_done) to
     * n_sel[r]. cand (NULL without): V4.1's candidate blocks, picked or obeyed (above). */
    void (*indexer_topk)(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                         const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                         int *n_sel, const struct dsv4_idx_cand *cand);

    /* The KV compressor's token loop over every sequence of the step (docs/MODEL.md §R3.6):
     * row r (position p of sequence s, slot p % ratio) stores its values a[r] and gate
     * logits g[r] + ape[slot] (rows of `width` = coff * d, coff 2 with overlap, else 1; the
     * layer's kind says which, model/layer_kind.h) into s's frontier kv/sc [coff * ratio,
     * width] (f32 at slot + kv_off and slot + sc_off; with overlap, rows ratio.. are the
     * current block); a row that completes
     * a block pools the frontier per channel (softmax of the gates over the block's
     * candidates, in double; with overlap the previous block through the first d channels)
     * into the next row of out[., d], rounded to bf16, and with overlap the current block
     * becomes the previous one. Rows written: each sequence's completed blocks in order, the
     * sequences one after the other (dsv4_step_block0). */
    void (*compress)(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                     const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out);

    /* Encodes rows of x (stride ldx) in `fmt` (d wide) into the step's sequences as dst says
     * (struct dsv4_store_dst). DSV4_ROW_FP8 expects the nope part FP8-simulated (lossless
     * then); DSV4_ROW_IDX_FP4 expects FP4-simulated keys. */
    void (*store_rows)(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                       int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst);

    /* Embedding gather: X[r, c, :] = f32(table[tok[r], :]) for each of `copies` streams. */
    void (*embed)(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies,
                  float *X);

    /* x[n] = bf16(f32(x * s)), the product in double (an f32 constant times a bf16 value). */
    void (*scale)(struct dsv4_backend *be, size_t n, float *x, double s);

    /* X[r, c, :] = bf16(f32(X[r, c, :] + e[r, :])) for every stream c < hc (the MTP combine). */
    void (*add_streams)(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X);

    /* DeepSeek-V4.1 Engram rows (docs/ENGRAM.md "The ops"): for each of n positions and each of
     * its n_cols table rows ids[r * ld_ids + j] (an index into a table of n_rows rows of d e4m3
     * bytes at `table`, with d / 32 e8m0 scales a row at `scale`), out[r, j * d + i] =
     * bf16(f32(e4m3 * 2^(e - 127))); a row outside [0, n_rows) reads zeros (the official
     * lookup's mask). The table is the mapped checkpoint: only the rows named are touched. */
    void (*engram_rows)(struct dsv4_backend *be, int n, int n_cols, const int64_t *ids, int ld_ids,
                        const uint8_t *table, const uint8_t *scale, int64_t n_rows, int d, float *out);

    /* DeepSeek-V4.1 Engram gate (official Engram.forward): kv[n, (hc + 1) d] holds hc keys then
     * one value (bf16 values), w[hc, d] = q_weight * k_weight (f32). Per row r and stream c,
     * with h = X[r, c], k = key c: rstd = rsqrt(mean h^2 + eps) rsqrt(mean k^2 + eps),
     * dot = (sum h w_c k) rstd f32(d^-0.5), g = sigmoid(sign(dot) sqrt(max(|dot|, 1e-6))) and
     * X[r, c] = bf16(h + g value): sums in double, each step rounded to f32 where the official
     * f32 tensors round it (the mean, mean + eps, each rsqrt, their product, the dot's sum, each
     * product, the clamp at f32(1e-6), the square root), the sigmoid in double. */
    void (*engram_gate)(struct dsv4_backend *be, int n, int hc, int d, const float *kv, const float *w, double eps,
                        float *X);

    /* Router: scores[n, n_exp] = sqrt(softplus(x . G^T)) in f32; selects n_used experts per
     * row (tid2eid rows when given, else top-k of scores + bias, ties to the lower index);
     * weights = selected scores / their sum * route_scale. scratch: [(n + 1) * n_exp].
     * gate_temp (DeepSeek-V4.1's `gate_temp`; 1 for V4): the logits are divided by it (in
     * f32) before the softplus. */
    void (*router)(struct dsv4_backend *be, int n, const float *x, const struct dsv4_linear *gate,
                   const float *bias, const int64_t *tid2eid, const int *tokens, int n_exp, int n_used,
                   double route_scale, double gate_temp, int *ids, float *weights, float *scratch);

    /* One SwiGLU expert over n rows of x[n, d_model] (FP8/FP4 activations as the demo):
     * h = silu(min(g, limit)) * clamp(v, +-limit) (no clamp when limit <= 0), times
     * row_w[r] when row_w is given, then y[n, d_model] = bf16(W2 . bf16(h)). */
    void (*expert)(struct dsv4_backend *be, const struct dsv4_expert_w *e, int n, const float *x, int ldx,
                   const float *row_w, double limit, float *y, float *scratch);

    /* The routed experts of one MoE layer over a whole step, as `expert` for each group of
     * the group table grp[2 * n_exp + 2] that `moe_dispatch` wrote (layout there): group g
     * runs experts[ids[g]] on rows x[off[g] .. off[g+1]) of the gathered rows
     * x[n_pairs, d_model] with weights row_w[off[g] ..], writing y[off[g] ..]. The backend
     * reads the group count from grp itself (the host never learns it during a step); a
     * device launches a grid for n_exp groups and skips the empty ones. Lets the backend
     * read each expert once and spread all experts over its threads in one go. n_pairs is
     * the rows of x (n * k of the dispatch). scratch: [2 * n_pairs * d_ff_exp] floats. */
    void (*experts)(struct dsv4_backend *be, const struct dsv4_expert_w *experts, int n_exp, int n_pairs,
                    const int *grp, const float *x, const float *row_w, double limit, float *y, float *scratch);

    /* MoE dispatch: groups the (row, slot) pairs of ids[n, k] by expert, ascending expert
     * id, rows then slots in order within an expert: pair i gets xe[i] = x[row] (rows of d),
     * row_w[i] = w[row * k + slot], and pair_of[row * k + slot] = i. The group table
     * grp[2 * n_exp + 2], backend memory of fixed capacity (at most n_exp groups), gets
     * grp[0] = n_groups, ids = grp + 1 ([n_exp]: the g-th used expert, -1 past n_groups)
     * and off = grp + 1 + n_exp ([n_exp + 1]: the g-th group's first pair, n * k from
     * n_groups on), as `experts` takes it. Nothing is returned: no read-back in a step. */
    void (*moe_dispatch)(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                         const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp);

    /* MoE combine: f[r] = bf16(f32(sum of ye[i] over row r's pairs in ascending pair order,
     * in double, + shared[r])); ye[n * k, d] from `experts`, shared[n, d]. */
    void (*moe_combine)(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                        const float *shared, float *f);
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
/* The calls of each op recorded so far (events kept: the buffer's first max_events). */
void              dsv4_prof_calls(const struct dsv4_prof *p, uint64_t counts[DSV4_OP_COUNT]);

/* The CPU backend with the scalar reference ops. */
extern const struct dsv4_backend_ops dsv4_cpu_ref_ops;

/* ------------------------------------------------------------------ row codecs (shared) */

/* Bytes per cached row for a format. */
static inline int dsv4_row_bytes(enum dsv4_row_fmt fmt, int d_head, int d_rope)
{
    int d_nope = d_head - d_rope;
    if (fmt == DSV4_ROW_IDX_FP4) return d_head / 2 + d_head / 32;
    return fmt == DSV4_ROW_FP8 ? d_nope + d_nope / 64 + 2 * d_rope : 2 * d_head;
}

/* Encodes a row whose nope part is already FP8-simulated (values code * 2^k per 64):
 * lossless. For DSV4_ROW_BF16 stores the bf16 values; DSV4_ROW_IDX_FP4 is
 * dsv4_idx_key_encode (d_rope unused). */
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
struct dsv4_backend_params {
    /* The backend's own options (dsv4_engine_params.backend_opts; backend_opts.c): "key=value"
     * entries, parsed by create, which refuses a key it does not know. Two keys have a meaning
     * for every backend, so that the op checker can drive any of them: `level=NAME` (one of
     * the kind's level list; a backend without levels refuses it) and `tiles=0|1` (0: what
     * prepare_weights makes keeps the checkpoint's layout, as far as the backend can; a
     * backend with no layout of its own accepts and ignores it). NULL = its defaults. The
     * CPU's: level, gemm_min, tiles. */
    const char               *opts;
    int                       n_threads; /* 0 = all */
    const struct dsv4_logger *lg;
    /* The run is profiled (--profile): a backend that times its ops on its device collects
     * those times, and device_profile prints them. */
    bool                      profile;
};

/* Calls fn(key, value, ud) on each entry of an options string, in order, and returns its
 * first nonzero status; an entry without a key and '=' is DSV4_EINVAL, the error naming the
 * backend. A piece without '=' continues the value before it ("gemm_min=3,7,9"). */
int  dsv4_backend_opts_each(const char *opts, const char *backend, struct dsv4_err *err,
                            int (*fn)(const char *key, const char *val, void *ud), void *ud);
/* The last value of key in opts into buf (cut at cap); false when opts has none (or does not
 * parse). */
bool dsv4_backend_opt_get(const char *opts, const char *key, char *buf, size_t cap);

/* The projections of a loaded model, for prepare_weights. */
struct dsv4_weight_set {
    struct dsv4_checkpoint *ck;   /* the mapped checkpoint (stored tiles, read-ahead) */
    /* calls fn on every projection, in a fixed order */
    void (*each_linear)(void *ctx, void (*fn)(struct dsv4_linear *l, void *ud), void *ud);
    /* calls fn on every other table the ops read (embedding, norms, hc mixers, sinks, APE,
     * routing tables, and the RoPE frequencies the model computes) with its size; a backend
     * may point *t at its own copy */
    void (*each_tensor)(void *ctx, void (*fn)(const void **t, size_t bytes, void *ud), void *ud);
    /* whether this process holds checkpoint tensor t (expert parallelism holds a part,
     * src/dist/ep.h): a tensor it does not hold is never read ahead nor touched */
    bool (*holds)(void *ctx, const struct dsv4_tensor *t);
    void  *ctx;
};

/* The widths and bounds of a step plan: what a backend sizes its scratch by (filled by the
 * model layer from its config; a backend needs no model header). */
struct dsv4_plan_dims {
    int max_rows;      /* token rows of a step */
    int max_ctx;       /* positions of a sequence */
    int max_attn_rows; /* cached rows one query attends to */
    int d_model, hc, n_head, d_head, d_rope, q_lora_rank, o_groups, o_lora_rank;
    int n_exp, n_exp_used, d_ff_exp, n_idx_head, d_idx_head, idx_topk;
    int idx_ratio;     /* the smallest ratio of the layers with an indexer (0: none): a query
                          scores at most max_ctx / idx_ratio keys */
    int wide_in;       /* the widest projection input past those the widths above give (DeepSeek-
                          V4.1: Engram's wkv, DSpark's main_proj and confidence), 0 when none */
};

/* What a buffer holds, for the backend's pools and memory accounting. */
enum dsv4_mem_kind { DSV4_MEM_WEIGHTS, DSV4_MEM_KV, DSV4_MEM_ACT };

/* What a created backend runs with (struct dsv4_engine_settings reports it). */
struct dsv4_backend_settings {
    const char *level;       /* its code path, "" when it has no levels */
    int         n_threads;
    int         gemm_min[3]; /* the CPU's GEMM crossovers (option gemm_min), 0 when it has none */
    bool        tiles;       /* it repacks weights into a layout of its own (option tiles) */
};

struct dsv4_backend_kind {
    const char *name;
    int  (*create)(void **impl, const struct dsv4_backend_params *p, struct dsv4_err *err);
    void (*destroy)(void *impl); /* also frees what prepare_weights made */
    const struct dsv4_backend_ops *(*ops)(void *impl);
    /* one line for logs: "avx2, 2 threads" */
    void (*describe)(void *impl, char *buf, size_t cap);
    void (*settings)(void *impl, struct dsv4_backend_settings *s);
    int  (*prepare_weights)(void *impl, struct dsv4_weight_set *ws, const struct dsv4_backend_params *p,
                            struct dsv4_err *err);
    /* floats of scratch (struct dsv4_backend.scratch) one execution context needs for a plan */
    size_t (*scratch_floats)(void *impl, const struct dsv4_plan_dims *dims);

    /* ---- memory: the buffers ops read and write (activations, KV, prepared weights) */
    /* Buffers are host memory: host code may read and write them in place (the CPU). A
     * backend without it gets every host value through upload and returns results through
     * download. */
    bool host_visible;
    /* bytes zero-filled, 64-byte aligned; NULL when out of memory */
    void *(*alloc)(void *impl, size_t bytes, enum dsv4_mem_kind kind);
    void  (*free)(void *impl, void *buf, size_t bytes);
    void  (*upload)(void *impl, void *dst, const void *src, size_t bytes);   /* host -> buffer */
    void  (*download)(void *impl, void *dst, const void *src, size_t bytes); /* buffer -> host */
    void  (*copy)(void *impl, void *dst, const void *src, size_t bytes);     /* buffer -> buffer */
    /* waits until every op issued so far has finished (downloads are complete after it) */
    void  (*sync)(void *impl);
    /* The first error its ops and transfers met since create (they return nothing: an address
     * that is not the backend's, a device lost), as a status with the message in err;
     * DSV4_OK when none. The forward pass asks after each step and fails the step with it, so
     * a device's error is never a silently wrong result. NULL: the backend meets none (the
     * CPU's ops assert instead). */
    int   (*error)(void *impl, struct dsv4_err *err);
    /* The memory alloc draws from: bytes available now and in all; DSV4_OK, or a negative
     * status when it cannot tell (the serving memory plan then sets no limit). NULL: the
     * same as cannot tell. */
    int   (*memory)(void *impl, size_t *avail, size_t *total);
    /* Of the loaded model's weights, the bytes that sit in that memory without having come
     * from alloc (so `avail` does not yet show them), given the bytes of the mapped checkpoint:
     * the serving memory plan leaves them out of what it may use. The CPU: the checkpoint
     * pages its ops read in place, mapped less what its prepared copies replaced. A backend
     * whose weights all live in copies of its own answers 0; NULL: the same. */
    size_t (*weights_resident)(void *impl, size_t mapped);

    /* ---- introspection (`dsv4 ops`, `dsv4 test-ops`) */
    /* What runs op in this state (level, prepared weights) into buf, one line; returns 1 when
     * that is plain C (no vector or device code), 0 otherwise. */
    int (*describe_op)(void *impl, enum dsv4_op op, char *buf, size_t cap);
    /* The code paths option `level` names, lowest first: the i-th one, NULL past the last;
     * *here: whether this machine runs it (create caps a level it lacks to one it has). */
    const char *(*level)(int i, bool *here);
    /* The devices it can run on, one line each with the limits that matter, the one in use
     * marked '*' (`dsv4 ops` prints it); NULL for a backend with no device to choose. */
    void (*devices)(void *impl, char *buf, size_t cap);

    /* ---- the device's own timing of the ops, collected when created with profile (the
     * host-side profiler only sees the ops being recorded there); prints a table to f; NULL
     * for a backend whose ops run on the host threads */
    void (*device_profile)(void *impl, FILE *f);

    /* ---- machine figures (`dsv4 bench`); NULL where the backend measures none */
    /* Best of reps timed reads of buf's first bytes (a buffer from alloc) by all its
     * threads, GB/s: the bandwidth a decode step's weight and KV reads are shared of. */
    double (*read_bandwidth)(void *impl, const void *buf, size_t bytes, int reps);
    /* The arithmetic peaks of its kernels on all its threads, GFLOP/s: f32 multiply-adds and
     * bf16 dot products; 0 for a kind it has no peak loop for (the CPU's reference: both). */
    void (*peaks)(void *impl, double *f32, double *bf16);

    /* ---- prepared weights stored in a checkpoint (`dsv4 convert --tiles`); NULL where the
     * backend stores none */
    /* The suffix of the tensors it stores beside a projection's ("TENSOR.i16") and finds
     * again at load in the mapped checkpoint (struct dsv4_weight_set.ck). */
    const char *prepared_suffix;
    /* The prepared form of l it would store, a function of the weight alone (no state): the
     * bytes beside l's weight tensor (parts[0]) and beside its scale tensor (parts[1], 0 for
     * none); returns the bytes buf needs, 0 when l has no stored form; with buf, also writes
     * part 0 at buf and part 1 right after it. */
    size_t (*export_prepared)(const struct dsv4_linear *l, size_t parts[2], void *buf);
};

/* The backend called name (NULL or "" = the default, "cpu"); NULL if this build has none. */
const struct dsv4_backend_kind *dsv4_backend_find(const char *name);
/* The i-th backend this build has, the default first; NULL past the last. */
const struct dsv4_backend_kind *dsv4_backend_at(int i);
/* Their names, in that order, into buf: "cpu, cpu-staged" (cut at cap). */
void dsv4_backend_list(char *buf, size_t cap);
/* The ops table lacks (NULL entries), by name, into buf ("linear, rope", cut at cap);
 * returns how many. Engine open refuses a backend that lacks any: no op falls back. */
int  dsv4_backend_ops_missing(const struct dsv4_backend_ops *ops, char *buf, size_t cap);

#endif /* DSV4_BACKEND_H */
