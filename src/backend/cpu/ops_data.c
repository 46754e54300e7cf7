/*
 * ops_data.c - the CPU's data-movement and bookkeeping ops (see ops_data.h): what the model
 * layer once did in host loops between ops, now behind the op table so that a device
 * backend can run it where its buffers live.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops_data.h"

static size_t round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Floats that hold n pointers, rounded to 64 bytes so what follows stays aligned. */
static size_t ptr_floats(size_t n)
{
    return round16((n * sizeof(void *) + sizeof(float) - 1) / sizeof(float));
}

/* The context minus the first `used` floats of its scratch. */
static struct dsv4_backend after(const struct dsv4_backend *be, size_t used)
{
    DSV4_ASSERT(used <= be->scratch_len);
    struct dsv4_backend sub = *be;
    sub.scratch += used;
    sub.scratch_len -= used;
    return sub;
}

/* ------------------------------------------------------------------ element-wise */

void dsv4_cpu_embed(struct dsv4_backend *be, int n, const int *tok, const uint16_t *table, int d, int copies,
                    float *X)
{
    (void)be;
    size_t D = (size_t)d;
    for (int r = 0; r < n; r++) {
        float          *x = X + (size_t)r * (size_t)copies * D;
        const uint16_t *e = table + (size_t)tok[r] * D;
        for (size_t i = 0; i < D; i++) x[i] = dsv4_f32_from_bf16(e[i]);
        for (int c = 1; c < copies; c++) memcpy(x + (size_t)c * D, x, sizeof(float) * D);
    }
}

void dsv4_cpu_scale(struct dsv4_backend *be, size_t n, float *x, double s)
{
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] = dsv4_round_bf16((float)(x[i] * s));
}

void dsv4_cpu_add_streams(struct dsv4_backend *be, int n, int hc, int d, const float *e, float *X)
{
    (void)be;
    size_t D = (size_t)d;
    for (int r = 0; r < n; r++)
        for (int c = 0; c < hc; c++) {
            float       *x  = X + ((size_t)r * (size_t)hc + (size_t)c) * D;
            const float *er = e + (size_t)r * D;
            for (size_t i = 0; i < D; i++) x[i] = dsv4_round_bf16((float)((double)x[i] + er[i]));
        }
}

/* ------------------------------------------------------------------ MoE dispatch / combine */

void dsv4_cpu_moe_dispatch(struct dsv4_backend *be, int n, int k, int n_exp, const int *ids, const float *w,
                           const float *x, int d, float *xe, float *row_w, int *pair_of, int *grp)
{
    (void)be;
    DSV4_ASSERT(n_exp >= 1 && n_exp <= DSV4_MAX_EXPERTS);
    int *grp_ids = grp + 1, *grp_off = grp + 1 + n_exp; /* the group table (backend.h) */
    int  next[DSV4_MAX_EXPERTS];                       /* counts, then each expert's next free pair */
    memset(next, 0, sizeof(int) * (size_t)n_exp);
    for (int i = 0; i < n * k; i++) {
        DSV4_ASSERT(ids[i] >= 0 && ids[i] < n_exp);
        next[ids[i]]++;
    }
    /* a counting sort: experts ascending, (row, slot) in order within each */
    int n_groups = 0, np = 0;
    for (int e = 0; e < n_exp; e++) {
        int c = next[e];
        next[e] = np;
        if (!c) continue;
        grp_ids[n_groups] = e;
        grp_off[n_groups] = np;
        n_groups++;
        np += c;
    }
    grp[0] = n_groups;
    for (int g = n_groups; g < n_exp; g++) grp_ids[g] = -1; /* the fixed capacity's empty groups */
    for (int g = n_groups; g <= n_exp; g++) grp_off[g] = np;
    for (int r = 0; r < n; r++)
        for (int s = 0; s < k; s++) {
            int i = next[ids[r * k + s]]++;
            pair_of[r * k + s] = i;
            row_w[i]           = w[r * k + s];
            memcpy(xe + (size_t)i * (size_t)d, x + (size_t)r * (size_t)d, sizeof(float) * (size_t)d);
        }
}

void dsv4_cpu_moe_pairs(int k, const int *pair_of, int *p)
{
    for (int s = 0; s < k; s++) { /* insertion sort: k is small */
        int v = pair_of[s], j = s;
        for (; j > 0 && p[j - 1] > v; j--) p[j] = p[j - 1];
        p[j] = v;
    }
}

void dsv4_cpu_moe_combine(struct dsv4_backend *be, int n, int k, int d, const int *pair_of, const float *ye,
                          const float *shared, float *f)
{
    (void)be;
    DSV4_ASSERT(k >= 1 && k <= 64);
    for (int r = 0; r < n; r++) {
        int p[64];
        dsv4_cpu_moe_pairs(k, pair_of + (size_t)r * (size_t)k, p);
        const float *sh = shared + (size_t)r * (size_t)d;
        float       *fr = f + (size_t)r * (size_t)d;
        for (int i = 0; i < d; i++) {
            double acc = 0; /* bf16 terms: exact for the usual spread of magnitudes */
            for (int s = 0; s < k; s++) acc += ye[(size_t)p[s] * (size_t)d + (size_t)i];
            fr[i] = dsv4_round_bf16((float)(acc + sh[i]));
        }
    }
}

/* ------------------------------------------------------------------ compressor */

/* Per-channel softmax pooling of the frontier into out[d]: f32(sum softmax(g) * a), in
 * double as the reference. */
static void pool(const float *skv, const float *ssc, int ratio, bool overlap, int d, float *out)
{
    int  width   = overlap ? 2 * d : d;
    int  n       = overlap ? 2 * ratio : ratio;
    DSV4_ASSERT(n <= 256);
    for (int ch = 0; ch < d; ch++) {
        double g[256], m = -INFINITY;
        for (int i = 0; i < n; i++) {
            int col = (overlap && i >= ratio) ? d + ch : ch;
            g[i]    = ssc[(size_t)i * (size_t)width + (size_t)col];
            m       = fmax(m, g[i]);
        }
        double sum = 0;
        for (int i = 0; i < n; i++) sum += (g[i] = exp(g[i] - m));
        double acc = 0;
        for (int i = 0; i < n; i++) {
            int col = (overlap && i >= ratio) ? d + ch : ch;
            acc += (g[i] / sum) * skv[(size_t)i * (size_t)width + (size_t)col];
        }
        out[ch] = (float)acc;
    }
}

/* One sequence's token loop; returns the rows written. */
static int compress_seq(int ratio, bool overlap, int d, int n, int p0, const float *a, const float *g, const float *ape,
                        float *kv, float *sc, float *out)
{
    int    done    = 0;
    int    width   = (overlap ? 2 : 1) * d;
    size_t W       = (size_t)width;
    for (int t = 0; t < n; t++) {
        int p = p0 + t, slot = p % ratio, dst = overlap ? ratio + slot : slot;
        const float *at = a + (size_t)t * W, *gt = g + (size_t)t * W, *ap = ape + (size_t)slot * W;
        float       *kd = kv + (size_t)dst * W, *sd = sc + (size_t)dst * W;
        for (size_t i = 0; i < W; i++) {
            kd[i] = at[i];
            sd[i] = gt[i] + ap[i];
        }
        if ((p + 1) % ratio != 0) continue;
        pool(kv, sc, ratio, overlap, d, out);
        for (int i = 0; i < d; i++) out[i] = dsv4_round_bf16(out[i]);
        out += d;
        done++;
        if (overlap) {
            memcpy(kv, kv + (size_t)ratio * W, sizeof(float) * (size_t)ratio * W);
            memcpy(sc, sc + (size_t)ratio * W, sizeof(float) * (size_t)ratio * W);
        }
    }
    return done;
}

void dsv4_cpu_compress(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, bool overlap, int d,
                       const float *a, const float *g, const float *ape, size_t kv_off, size_t sc_off, float *out)
{
    (void)be;
    size_t W = (size_t)((overlap ? 2 : 1) * d);
    for (int s = 0; s < desc->n_seqs; s++) {
        const struct dsv4_step_seq *q = &desc->seq[s];
        if (!q->n) continue;
        size_t r0 = (size_t)q->row0 * W;
        float *kv = (float *)(void *)(q->slot + kv_off), *sc = (float *)(void *)(q->slot + sc_off);
        out += (size_t)compress_seq(ratio, overlap, d, q->n, q->p0, a + r0, g + r0, ape, kv, sc, out) * (size_t)d;
    }
}

/* ------------------------------------------------------------------ stored rows */

/* Rows t of x to rows first + t (mod wrap, when not 0) of dst: one sequence's store. */
static void store_seq(enum dsv4_row_fmt fmt, int d, int d_rope, int n, const float *x, int ldx,
                      const struct dsv4_kv_rows *dst, int first, int wrap)
{
    DSV4_ASSERT(dst->row_bytes == dsv4_row_bytes(fmt, d, d_rope));
    for (int t = 0; t < n; t++) {
        int j = wrap ? (first + t) % wrap : first + t;
        dsv4_row_encode(fmt, d, d_rope, x + (size_t)t * (size_t)ldx, dsv4_kv_row_at(dst, j));
    }
}

void dsv4_cpu_store_rows(struct dsv4_backend *be, const struct dsv4_step_desc *desc, enum dsv4_row_fmt fmt, int d,
                         int d_rope, const float *x, int ldx, const struct dsv4_store_dst *dst)
{
    (void)be;
    static const int32_t page0[1] = { 0 };
    if (dst->to == DSV4_STORE_STEP) {
        struct dsv4_kv_rows rows = { .base = dst->rows, .page = page0, .page_rows = desc->n_rows > 0 ? desc->n_rows : 1,
                                     .row_bytes = dst->row_bytes };
        store_seq(fmt, d, d_rope, desc->n_rows, x, ldx, &rows, 0, 0);
        return;
    }
    const float *bx = x; /* BLOCKS: the packed rows of compress */
    for (int s = 0; s < desc->n_seqs; s++) {
        const struct dsv4_step_seq *q = &desc->seq[s];
        if (!q->n) continue;
        if (dst->to == DSV4_STORE_RING) { /* after every query of the chunk read the ring */
            struct dsv4_kv_rows ring = { .base = q->slot + dst->off, .page = page0, .page_rows = dst->ring_rows,
                                         .row_bytes = dst->row_bytes };
            int from = q->n > dst->window ? q->n - dst->window : 0;
            store_seq(fmt, d, d_rope, q->n - from, x + (size_t)(q->row0 + from) * (size_t)ldx, ldx, &ring, q->p0 + from,
                      dst->ring_rows);
        } else {
            struct dsv4_kv_rows pages = dsv4_step_page_rows(desc, s, dst->off, dst->ratio, dst->row_bytes);
            int                 rows  = dsv4_step_blocks(desc, s, dst->ratio);
            store_seq(fmt, d, d_rope, rows, bx, ldx, &pages, q->p0 / dst->ratio, 0);
            bx += (size_t)rows * (size_t)ldx;
        }
    }
}

/* The position whose window query t reads and that window's width: a draft block's queries
 * all read the window of its last row, n rows wider (struct dsv4_attn_src .block). */
static int attn_window(const struct dsv4_cpu_attn_seq *src, int t, int *window)
{
    *window = src->window + src->block_n;
    return src->p0 + (src->block_n ? src->block_n - 1 : t);
}

/* How many rows query t reads (dsv4_cpu_attn_rows writes them). */
static int attn_count(const struct dsv4_cpu_attn_seq *src, int t)
{
    int w, p = attn_window(src, t, &w), win = p + 1 < w ? p + 1 : w;
    return win + (src->sel ? src->n_sel[t] : src->ratio ? (p + 1) / src->ratio : 0);
}

int dsv4_cpu_attn_rows(const struct dsv4_cpu_attn_seq *src, int t, const uint8_t **rows)
{
    int w, p = attn_window(src, t, &w), nr = 0;
    int first = p - w + 1 > 0 ? p - w + 1 : 0;
    for (int q = first; q <= p; q++)
        rows[nr++] = q < src->p0 ? dsv4_kv_row_at(&src->ring, q % src->ring.page_rows) : dsv4_kv_row_at(&src->chunk, q - src->p0);
    if (src->sel) {
        const int *sel = src->sel + (size_t)t * (size_t)src->sel_stride;
        for (int i = 0; i < src->n_sel[t]; i++) rows[nr++] = dsv4_kv_row_at(&src->comp, sel[i]);
    } else if (src->ratio) {
        for (int j = 0; j < (p + 1) / src->ratio; j++) rows[nr++] = dsv4_kv_row_at(&src->comp, j);
    }
    return nr;
}

/* Sequence s's view of a layer's attention sources. */
static struct dsv4_cpu_attn_seq attn_seq(const struct dsv4_step_desc *desc, int s, const struct dsv4_attn_src *src)
{
    static const int32_t        page0[1] = { 0 };
    const struct dsv4_step_seq *q        = &desc->seq[s];
    struct dsv4_cpu_attn_seq    v        = {
        .p0 = q->p0, .window = src->window, .ratio = src->ratio, .block_n = src->block ? q->n : 0,
        .ring  = { .base = q->slot + src->ring_off, .page = page0, .page_rows = src->ring_rows, .row_bytes = src->row_bytes },
        .chunk = { .base = (uint8_t *)(uintptr_t)(src->chunk + (size_t)q->row0 * (size_t)src->row_bytes), .page = page0,
                   .page_rows = q->n, .row_bytes = src->row_bytes },
    };
    if (src->ratio) v.comp = dsv4_step_page_rows(desc, s, src->comp_off, src->ratio, src->row_bytes);
    if (src->sel) {
        v.sel        = src->sel + (size_t)q->row0 * (size_t)src->sel_stride;
        v.n_sel      = src->n_sel + q->row0;
        v.sel_stride = src->sel_stride;
    }
    return v;
}

void dsv4_cpu_attention_with(dsv4_cpu_attend_fn fn, struct dsv4_backend *be, const struct dsv4_step_desc *desc,
                             int n_head, int d_head, int d_rope, const float *q, const struct dsv4_attn_src *src,
                             enum dsv4_row_fmt fmt, const float *sink, float scale, float *o)
{
    size_t          HD   = (size_t)n_head * (size_t)d_head;
    const uint8_t **rows = (const uint8_t **)(void *)be->scratch;
    for (int s = 0; s < desc->n_seqs; s++) {
        if (!desc->seq[s].n) continue;
        struct dsv4_cpu_attn_seq v = attn_seq(desc, s, src);
        size_t                   r0 = (size_t)desc->seq[s].row0;
        for (int t = 0; t < desc->seq[s].n; t++) {
            struct dsv4_backend sub = after(be, ptr_floats((size_t)attn_count(&v, t)));
            int                 nr  = dsv4_cpu_attn_rows(&v, t, rows);
            fn(&sub, n_head, d_head, d_rope, q + (r0 + (size_t)t) * HD, rows, nr, fmt, sink, scale,
               o + (r0 + (size_t)t) * HD);
        }
    }
}

void dsv4_cpu_indexer_scores_with(dsv4_cpu_scores_fn fn, struct dsv4_backend *be, int n_head, int d, const float *q,
                                  const float *w, const struct dsv4_kv_rows *keys, int n_keys, float *score)
{
    DSV4_ASSERT(keys->row_bytes == dsv4_idx_key_bytes(d));
    int             nb     = (n_keys + keys->page_rows - 1) / keys->page_rows;
    size_t          used   = ptr_floats((size_t)nb);
    const uint8_t **blocks = (const uint8_t **)(void *)be->scratch;
    DSV4_ASSERT(used <= be->scratch_len);
    for (int b = 0; b < nb; b++) blocks[b] = dsv4_kv_row_at(keys, b * keys->page_rows);
    struct dsv4_backend sub = after(be, used);
    fn(&sub, n_head, d, q, w, blocks, keys->page_rows, n_keys, score);
}

/* ------------------------------------------------------------------ indexer top-k */

/* Key a ranks before key b: higher score, ties to the lower id. */
static bool ranks_before(const float *sc, int a, int b)
{
    return sc[a] != sc[b] ? sc[a] > sc[b] : a < b;
}

/* Sift-down in a heap whose root is the element that ranks last (min-heap by rank). */
static void sift_worst(int *h, int n, int i, const float *sc)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(sc, h[w], h[l])) w = l;
        if (r < n && ranks_before(sc, h[w], h[r])) w = r;
        if (w == i) return;
        int t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* Sift-down in a max-heap of ints (heapsort ascending). */
static void sift_int(int *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && h[l] > h[w]) w = l;
        if (r < n && h[r] > h[w]) w = r;
        if (w == i) return;
        int t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* The k best of n scores, ids ascending, into sel: a bounded heap rooted at the worst kept,
 * then a heapsort of the ids; allocates nothing (glibc's qsort mallocs over 1 KiB). */
void dsv4_cpu_top_k(const float *sc, int n, int k, int *sel)
{
    for (int j = 0; j < k; j++) sel[j] = j;
    for (int i = k / 2 - 1; i >= 0; i--) sift_worst(sel, k, i, sc);
    for (int j = k; j < n; j++)
        if (ranks_before(sc, j, sel[0])) {
            sel[0] = j;
            sift_worst(sel, k, 0, sc);
        }
    for (int i = k / 2 - 1; i >= 0; i--) sift_int(sel, k, i);
    for (int m = k - 1; m > 0; m--) {
        int t = sel[0];
        sel[0] = sel[m], sel[m] = t;
        sift_int(sel, m, 0);
    }
}

/* One sequence's rows (the per-sequence op of before the step descriptor); cand's blocks
 * already at the sequence's first row. */
static void topk_seq(struct dsv4_backend *be, int n_q, int p0, int ratio, int n_head, int d, const float *q,
                     const float *w, const struct dsv4_kv_rows *keys, int topk, int *sel, int *n_sel,
                     const struct dsv4_idx_cand *cand)
{
    for (int t = 0; t < n_q; t++) {
        int  n_done = (p0 + t + 1) / ratio, k = topk < n_done ? topk : n_done;
        int *st     = sel + (size_t)t * (size_t)topk;
        int *cb     = cand ? cand->blocks + (size_t)t * (size_t)cand->n_keep : NULL;
        n_sel[t]    = k;
        if (k == n_done && !cand) { /* every completed key is kept: no scores needed */
            for (int j = 0; j < k; j++) st[j] = j;
            continue;
        }
        float              *score = be->scratch;
        struct dsv4_backend sub   = after(be, round16((size_t)n_done));
        if (n_done > 0)
            be->ops->indexer_scores(&sub, n_head, d, q + (size_t)t * (size_t)n_head * (size_t)d,
                                    w + (size_t)t * (size_t)n_head, keys, n_done, score);
        if (!cand) dsv4_cpu_top_k(score, n_done, k, st);
        else if (cand->pick) {
            dsv4_cpu_cand_pick(&sub, score, n_done, cand->block, cand->n_keep, cb);
            dsv4_cpu_top_k(score, n_done, k, st);
        } else {
            n_sel[t] = dsv4_cpu_cand_top_k(&sub, score, n_done, cand->block, cand->n_keep, cb, topk, st);
        }
    }
}

void dsv4_cpu_indexer_topk(struct dsv4_backend *be, const struct dsv4_step_desc *desc, int ratio, int n_head, int d,
                           const float *q, const float *w, size_t keys_off, int key_bytes, int topk, int *sel,
                           int *n_sel, const struct dsv4_idx_cand *cand)
{
    for (int s = 0; s < desc->n_seqs; s++) {
        const struct dsv4_step_seq *p = &desc->seq[s];
        if (!p->n) continue;
        struct dsv4_kv_rows  keys = dsv4_step_page_rows(desc, s, keys_off, ratio, key_bytes);
        size_t               r0   = (size_t)p->row0;
        struct dsv4_idx_cand c    = cand ? *cand : (struct dsv4_idx_cand){ 0 };
        if (cand) c.blocks += r0 * (size_t)cand->n_keep;
        topk_seq(be, p->n, p->p0, ratio, n_head, d, q + r0 * (size_t)n_head * (size_t)d, w + r0 * (size_t)n_head,
                 &keys, topk, sel + r0 * (size_t)topk, n_sel + r0, cand ? &c : NULL);
    }
}

void dsv4_cpu_step_begin(struct dsv4_backend *be, const struct dsv4_step_desc *desc)
{
    (void)be, (void)desc; /* the ops read the descriptor's host arrays in place */
}

size_t dsv4_cpu_data_scratch_floats(const struct dsv4_plan_dims *dims)
{
    size_t keys = dims->idx_ratio > 0 ? (size_t)(dims->max_ctx / dims->idx_ratio) + 1 : 1;
    size_t attn = ptr_floats((size_t)dims->max_attn_rows);
    /* the scores, then the key block lists (indexer_scores) or V4.1's candidate work
     * (ops_cand.c: block scores and the compacted candidate keys, ids and scores) */
    size_t topk = round16(keys) + (ptr_floats(keys) > 3 * round16(keys) ? ptr_floats(keys) : 3 * round16(keys));
    return attn > topk ? attn : topk;
}
