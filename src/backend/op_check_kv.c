/*
 * op_check_kv.c - the op checker's cases for the ops on stored rows: attention, the
 * indexer's scores and top-k, the compressor and row stores. Rows sit in paged sets (struct
 * dsv4_kv_rows) of several pages with a shuffled, non-identity page table, a byte offset into
 * each page and garbage around the rows, as KV pages hold them. Attention runs every layer
 * kind of the presets (window only, CSA with the indexer's selection, HCA over every
 * compressed row) in both row formats, for decode (one query) and chunks that straddle the
 * window ring and the chunk's own rows.
 */
#include <math.h>
#include <string.h>

#include "backend/op_check_int.h"

/* n_rows rows of row_bytes in pages of page_rows: two spare pages in the pool, the page
 * table a random permutation, rows at byte 64 of a page. */
static struct dsv4_kv_rows make_rows(struct chk *h, int n_rows, int row_bytes, int page_rows, size_t *pool_bytes)
{
    int      n_pages = (n_rows + page_rows - 1) / page_rows, pool = n_pages + 2;
    int32_t *perm    = chk_alloc(h, sizeof(int32_t) * (size_t)pool);
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j   = (int)(chk_u64(h) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    if (n_pages > 1 && perm[0] == 0 && perm[1] == 1) perm[0] = 1, perm[1] = 0; /* never the identity */
    struct dsv4_kv_rows r = { .page = perm, .off = 64, .page_rows = page_rows, .row_bytes = row_bytes };
    r.page_bytes          = 64 + (size_t)page_rows * (size_t)row_bytes + 32;
    *pool_bytes           = (size_t)pool * r.page_bytes;
    r.base                = chk_alloc(h, *pool_bytes);
    memset(r.base, 0xa5, *pool_bytes);
    return r;
}

/* r with its pool where the op of this run reads it (chk_in); the page table stays host
 * metadata. */
static struct dsv4_kv_rows rows_in(struct chk *h, struct dsv4_kv_rows r)
{
    r.base = chk_in(h, r.base);
    return r;
}

/* A row's values as the model stores them: bf16, the nope part FP8-simulated for FP8 rows
 * (dsv4_row_encode is lossless then), through the reference's fp8_sim. */
static void write_row(struct dsv4_backend *ref, enum dsv4_row_fmt fmt, int d, int d_rope, float *v, uint8_t *row)
{
    if (fmt == DSV4_ROW_FP8) ref->ops->fp8_sim(ref, 1, d - d_rope, d, v, 64);
    dsv4_row_encode(fmt, d, d_rope, v, row);
}

/* ------------------------------------------------------------------ attention */

struct attn_case {
    int model, ratio_kind; /* ratio_kind 0: window only, 1: CSA (ratio 4, selected rows), 2: HCA */
    int p0, n_q;
    enum dsv4_row_fmt fmt;
};

/* The rows query t reads, in the contract's order (struct dsv4_attn_src); returns the count. */
static int rows_of(const struct dsv4_attn_src *src, int t, const uint8_t **rows)
{
    int p = src->p0 + t, n = 0;
    for (int q = p - src->window + 1 > 0 ? p - src->window + 1 : 0; q <= p; q++)
        rows[n++] = q < src->p0 ? dsv4_kv_row_at(&src->ring, q % src->window) : dsv4_kv_row_at(&src->chunk, q - src->p0);
    if (src->sel)
        for (int i = 0; i < src->n_sel[t]; i++) rows[n++] = dsv4_kv_row_at(&src->comp, src->sel[t * src->sel_stride + i]);
    else if (src->ratio)
        for (int j = 0; j < (p + 1) / src->ratio; j++) rows[n++] = dsv4_kv_row_at(&src->comp, j);
    return n;
}

/*
 * The tolerance's magnitude per output: sum_i p_i |V_i| / den in double. The probabilities
 * are rounded to bf16 in the numerator; a score a few f32 ulps off flips a rounding now and
 * then, which moves the output by up to 2^-7 p_i |V_i| / den: where the values cancel, far
 * more than 2^-7 of the output. mag * 2^-7 bounds every flip of a query's head together.
 */
static void attention_mag(struct chk *h, const struct dsv4_attn_src *src, int nq, int H, int D, int R,
                          enum dsv4_row_fmt fmt, const float *q, const float *sink, float scale, int max_rows, float *mag)
{
    const uint8_t **rows = chk_alloc(h, sizeof(void *) * (size_t)max_rows);
    float          *kv   = chk_floats(h, (size_t)max_rows * D);
    double         *e    = chk_alloc(h, sizeof(double) * (size_t)max_rows);
    for (int t = 0; t < nq; t++) {
        int n = rows_of(src, t, rows);
        for (int i = 0; i < n; i++) dsv4_row_decode(fmt, D, R, rows[i], kv + (size_t)i * D);
        for (int hh = 0; hh < H; hh++) {
            const float *qh = q + ((size_t)t * H + hh) * D;
            double       m  = sink[hh];
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int c = 0; c < D; c++) s += (double)qh[c] * kv[(size_t)i * D + c];
                e[i] = s * scale;
                m    = fmax(m, e[i]);
            }
            double den = exp(sink[hh] - m);
            for (int i = 0; i < n; i++) den += (e[i] = exp(e[i] - m));
            float *mh = mag + ((size_t)t * H + hh) * D;
            for (int c = 0; c < D; c++) {
                double a = 0;
                for (int i = 0; i < n; i++) a += e[i] * fabs(kv[(size_t)i * D + c]);
                mh[c] = (float)(a / den);
            }
        }
    }
}

static void attention_case(struct chk *h, const struct attn_case *c)
{
    const struct chk_model *M = &chk_models[c->model];
    int H = M->n_head, D = M->d_head, R = M->d_rope, W = M->window, p0 = c->p0, nq = c->n_q;
    int ratio = c->ratio_kind == 0 ? 0 : c->ratio_kind == 1 ? 4 : M->hca_ratio;
    int last = p0 + nq - 1, n_comp = ratio ? (last + 1) / ratio : 0, topk = c->ratio_kind == 1 ? M->topk : 0;
    int rb = dsv4_row_bytes(c->fmt, D, R);
    int max_rows = W + (topk ? (n_comp < topk ? n_comp : topk) : n_comp);
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = nq, dims.max_ctx = last + 1, dims.max_attn_rows = max_rows;
    dims.n_head = H, dims.d_head = D, dims.d_rope = R, dims.idx_topk = topk > 0 ? topk : 1;
    static const char *const kinds[] = { "window", "CSA", "HCA" };
    chk_case(h, &dims, "%s %s %s rows, positions %d..%d", M->name, kinds[c->ratio_kind],
             c->fmt == DSV4_ROW_FP8 ? "fp8" : "bf16", p0, last);
    size_t pb;
    struct dsv4_attn_src src = { .p0 = p0, .window = W, .ratio = ratio };
    src.ring  = make_rows(h, W + 3, rb, W + 3, &pb); /* a ring is one page, longer than the window */
    src.chunk = make_rows(h, nq, rb, nq, &pb);
    src.comp  = make_rows(h, n_comp > 0 ? n_comp : 1, rb, 5, &pb); /* pages of 5 rows: awkward */
    float *q = chk_floats(h, (size_t)nq * H * D), *sink = chk_floats(h, (size_t)H), *v = chk_floats(h, (size_t)D);
    chk_fill_bf16(h, q, (size_t)nq * H * D, 3.0f);
    for (int i = 0; i < H; i++) sink[i] = (float)chk_uniform(h) * 2.0f;
    if (topk) {
        /* the indexer's choice for each query: n_sel ascending ids among its completed rows */
        int *sel = chk_alloc(h, sizeof(int) * (size_t)nq * topk), *n_sel = chk_alloc(h, sizeof(int) * (size_t)nq);
        for (int t = 0; t < nq; t++) {
            int done = (p0 + t + 1) / 4, k = done < topk ? done : topk, m = 0;
            for (int j = 0; j < done && m < k; j++) /* pick k of done, in order (selection sampling) */
                if (chk_u64(h) % (uint64_t)(done - j) < (uint64_t)(k - m)) sel[t * topk + m++] = j;
            n_sel[t] = m;
        }
        src.sel = sel, src.n_sel = n_sel, src.sel_stride = topk;
    }
    float scale = 1.0f / sqrtf((float)D);
    /* one bf16 rounding of the output plus f32 sums over the rows in another order (values
     * are below 2 in magnitude, so rows x 2^-22 bounds the absolute error of a sum), plus the
     * flipped probability roundings of attention_mag */
    struct chk_tol tol = { 0.0079, 1e-6 + (double)max_rows * 0x1p-22, 0x1p-7, 0 };
    float         *mag = chk_floats(h, (size_t)nq * H * D);
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        if (chk_is_reference(h)) { /* the rows, FP8-simulated through the reference, once */
            const struct dsv4_kv_rows *sets[] = { &src.ring, &src.chunk, &src.comp };
            int                        ns[]   = { W, nq, n_comp };
            for (int s = 0; s < 3; s++)
                for (int j = 0; j < ns[s]; j++) {
                    chk_fill_bf16(h, v, (size_t)D, 2.0f);
                    write_row(be, c->fmt, D, R, v, dsv4_kv_row_at(sets[s], j));
                }
            attention_mag(h, &src, nq, H, D, R, c->fmt, q, sink, scale, max_rows, mag);
        }
        float *o = chk_out_f32(h, 0, (size_t)nq * H * D, tol, NULL, mag);
        struct dsv4_attn_src in = src; /* the rows and the indexer's selection: backend memory */
        in.ring = rows_in(h, src.ring), in.chunk = rows_in(h, src.chunk), in.comp = rows_in(h, src.comp);
        in.sel = chk_in(h, src.sel), in.n_sel = chk_in(h, src.n_sel);
        be->ops->attention(be, nq, H, D, R, chk_in(h, q), &in, c->fmt, chk_in(h, sink), scale, o);
    }
}

static void run_attention(struct chk *h)
{
    for (int m = 0; m < 3; m++) {
        int W = chk_models[m].window;
        for (int kind = 0; kind < 3; kind++) {
            /* decode past the window, a chunk straddling ring and chunk rows, a first chunk */
            struct attn_case cs[] = { { m, kind, m == 2 ? 2100 : 300, 1, DSV4_ROW_FP8 },
                                      { m, kind, W + 5, m == 2 ? 2 : 17, DSV4_ROW_FP8 },
                                      { m, kind, 0, 3, DSV4_ROW_BF16 },
                                      { m, kind, 2 * W + 3, 3, DSV4_ROW_BF16 } };
            for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
                if (m == 2 && cs[i].fmt == DSV4_ROW_BF16 && i == 3) continue; /* flash: enough rows already */
                attention_case(h, &cs[i]);
            }
        }
    }
}

/* ------------------------------------------------------------------ indexer */

/* n_keys keys (FP4-simulated values through the reference, encoded) into a paged set. */
static void write_keys(struct chk *h, struct dsv4_backend *ref, const struct dsv4_kv_rows *keys, int n, int d)
{
    float *k = chk_floats(h, (size_t)d);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < d; i++) k[i] = (float)chk_uniform(h);
        ref->ops->fp4_sim(ref, 1, d, d, k, 32);
        dsv4_idx_key_encode(d, k, dsv4_kv_row_at(keys, j));
    }
}

static void run_indexer_scores(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* heads, d, keys, rows per page */
    const int shapes[][4] = { { 1, 32, 1, 1 },      { 3, 64, 17, 5 },     { 17, 128, 31, 8 },
                              { M[0].n_idx_head, M[0].d_idx, 3, 64 },     { M[0].n_idx_head, M[0].d_idx, 300, 16 },
                              { M[2].n_idx_head, M[2].d_idx, 525, 64 } };
    for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
        int H = shapes[s][0], d = shapes[s][1], nk = shapes[s][2], pr = shapes[s][3];
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_ctx = 4 * nk + 3, dims.n_idx_head = H, dims.d_idx_head = d;
        chk_case(h, &dims, "heads %d d %d keys %d in pages of %d", H, d, nk, pr);
        size_t pb;
        struct dsv4_kv_rows keys = make_rows(h, nk, dsv4_idx_key_bytes(d), pr, &pb);
        float *q = chk_floats(h, (size_t)H * d), *w = chk_floats(h, (size_t)H);
        chk_fill_bf16(h, q, (size_t)H * d, 1.0f);
        /* positive head weights: the relative tolerance then bounds every term */
        for (int i = 0; i < H; i++) w[i] = dsv4_round_bf16((float)fabs(chk_uniform(h)) + 0.01f);
        struct chk_tol tol = { 0.016, 1e-6, 0, 0 }; /* bf16 roundings of terms summed in another order */
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            if (chk_is_reference(h)) write_keys(h, be, &keys, nk, d);
            float *score = chk_out_f32(h, 0, (size_t)nk, tol, NULL, NULL);
            struct dsv4_kv_rows k = rows_in(h, keys);
            be->ops->indexer_scores(be, H, d, chk_in(h, q), chk_in(h, w), &k, nk, score);
        }
    }
}

/* The top-k check: the counts exactly; the ids ascending, distinct, among the completed
 * keys, and a best-k choice under the reference's scores within the scores' tolerance (a
 * backend's own scores may order near-ties the other way). */
struct topk_check {
    int          n_q, p0, topk;
    float       *ref_scores; /* [n_q][max_done] from the reference run */
    int          max_done;
};

static void topk_compare(struct chk *h, void *ud)
{
    const struct topk_check *c = ud;
    const int *rs = chk_ref(h, 0), *gs = chk_got(h, 0), *rn = chk_ref(h, 1), *gn = chk_got(h, 1);
    size_t     differ = 0;
    for (int t = 0; t < c->n_q; t++) {
        int done = (c->p0 + t + 1) / 4;
        if (gn[t] != rn[t]) {
            chk_fail(h, "query %d: n_sel %d, reference %d", t, gn[t], rn[t]);
            continue;
        }
        const int   *g  = gs + (size_t)t * c->topk, *r = rs + (size_t)t * c->topk;
        const float *sc = c->ref_scores + (size_t)t * c->max_done;
        differ += memcmp(g, r, sizeof(int) * (size_t)gn[t]) != 0;
        double lo = INFINITY, hi = -INFINITY;
        int    j  = 0;
        for (int i = 0; i < gn[t]; i++) {
            if (g[i] < 0 || g[i] >= done || (i && g[i] <= g[i - 1])) {
                chk_fail(h, "query %d: sel[%d] = %d is not an ascending id below %d", t, i, g[i], done);
                return;
            }
            lo = fmin(lo, sc[g[i]] + 0.016 * fabs(sc[g[i]]) + 1e-6);
        }
        for (int u = 0; u < done; u++) {
            if (j < gn[t] && g[j] == u) {
                j++;
                continue;
            }
            hi = fmax(hi, sc[u] - 0.016 * fabs(sc[u]) - 1e-6);
        }
        if (hi > lo) chk_fail(h, "query %d: a key left out scores %.6g over a kept one's %.6g", t, hi, lo);
    }
    chk_note(h, (size_t)c->n_q, differ, 0, 0);
}

static void run_indexer_topk(struct chk *h)
{
    /* model, p0, n_q, rows per page: decode, a chunk whose first queries have no key yet or
     * keep every key (n_done <= topk), the flash top-512 over 525 keys */
    const int cases[][4] = { { 0, 40, 3, 5 }, { 0, 0, 17, 4 }, { 1, 100, 5, 16 }, { 1, 60, 3, 7 }, { 2, 2097, 2, 64 } };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        const struct chk_model *M = &chk_models[cases[s][0]];
        int p0 = cases[s][1], nq = cases[s][2], pr = cases[s][3], H = M->n_idx_head, d = M->d_idx, K = M->topk;
        int done = (p0 + nq) / 4, n_keys = done > 0 ? done : 1;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = nq, dims.max_ctx = p0 + nq, dims.n_idx_head = H, dims.d_idx_head = d, dims.idx_topk = K;
        chk_case(h, &dims, "%s top-%d, positions %d..%d, pages of %d", M->name, K, p0, p0 + nq - 1, pr);
        size_t pb;
        struct dsv4_kv_rows keys = make_rows(h, n_keys, dsv4_idx_key_bytes(d), pr, &pb);
        float *q = chk_floats(h, (size_t)nq * H * d), *w = chk_floats(h, (size_t)nq * H);
        chk_fill_bf16(h, q, (size_t)nq * H * d, 1.0f);
        for (int i = 0; i < nq * H; i++) w[i] = dsv4_round_bf16((float)fabs(chk_uniform(h)) + 0.01f);
        struct topk_check tc = { nq, p0, K, chk_floats(h, (size_t)nq * n_keys), n_keys };
        chk_custom(h, topk_compare, &tc);
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            if (chk_is_reference(h)) {
                write_keys(h, be, &keys, n_keys, d);
                for (int t = 0; t < nq; t++) /* the scores the choice is judged by */
                    if ((p0 + t + 1) / 4 > 0)
                        be->ops->indexer_scores(be, H, d, q + (size_t)t * H * d, w + (size_t)t * H, &keys,
                                                (p0 + t + 1) / 4, tc.ref_scores + (size_t)t * n_keys);
            }
            int *sel   = chk_out_int(h, 0, (size_t)nq * K, NULL);
            int *n_sel = chk_out_int(h, 1, (size_t)nq, NULL);
            struct dsv4_kv_rows k = rows_in(h, keys);
            be->ops->indexer_topk(be, nq, p0, H, d, chk_in(h, q), chk_in(h, w), &k, K, sel, n_sel);
        }
    }
}

/* ------------------------------------------------------------------ compressor */

static void run_compress(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* ratio, d, p0, n: each layer kind's compressors (the kv rows' d_head and, at ratio 4,
     * the indexer's keys), awkward widths and ratios; chunks that complete no block, one,
     * several, or start at position 0 */
    const int cases[][4] = { { 4, 17, 0, 11 },  { 3, 31, 5, 7 },    { 4, M[0].d_head, 0, 17 },
                             { 4, M[0].d_idx, 21, 1 }, { 4, M[0].d_head, 23, 1 },
                             { M[0].hca_ratio, M[0].d_head, 0, 40 }, { M[1].hca_ratio, M[1].d_head, 100, 31 },
                             { 4, M[2].d_head, 6, 3 }, { M[2].hca_ratio, M[2].d_head, 125, 5 }, { 4, M[2].d_idx, 3, 9 } };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        int ratio = cases[s][0], d = cases[s][1], p0 = cases[s][2], n = cases[s][3];
        int coff = ratio == 4 ? 2 : 1, width = coff * d, rows = coff * ratio, blocks = 0;
        for (int t = 0; t < n; t++) blocks += (p0 + t + 1) % ratio == 0;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.max_ctx = p0 + n, dims.d_head = d;
        chk_case(h, &dims, "ratio %d d %d, positions %d..%d (%d blocks)", ratio, d, p0, p0 + n - 1, blocks);
        size_t W = (size_t)width;
        float *a = chk_floats(h, (size_t)n * W), *g = chk_floats(h, (size_t)n * W), *ape = chk_floats(h, (size_t)ratio * W);
        float *kv0 = chk_floats(h, (size_t)rows * W), *sc0 = chk_floats(h, (size_t)rows * W);
        chk_fill_bf16(h, a, (size_t)n * W, 2.0f);
        for (size_t i = 0; i < (size_t)n * W; i++) g[i] = (float)chk_uniform(h) * 3.0f;
        for (size_t i = 0; i < (size_t)ratio * W; i++) ape[i] = (float)chk_uniform(h) * 0.5f;
        /* the frontier as earlier tokens left it */
        chk_fill_bf16(h, kv0, (size_t)rows * W, 2.0f);
        for (size_t i = 0; i < (size_t)rows * W; i++) sc0[i] = (float)chk_uniform(h) * 3.0f;
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            float *kv  = chk_out_f32(h, 0, (size_t)rows * W, CHK_EXACT, kv0, NULL);
            float *sc  = chk_out_f32(h, 1, (size_t)rows * W, CHK_EXACT, sc0, NULL);
            float *out = chk_out_f32(h, 2, (size_t)(blocks > 0 ? blocks : 1) * d, CHK_EXACT, NULL, NULL);
            be->ops->compress(be, ratio, d, n, p0, chk_in(h, a), chk_in(h, g), chk_in(h, ape), kv, sc, out);
        }
    }
}

/* ------------------------------------------------------------------ row stores */

static void run_store_rows(struct chk *h)
{
    const struct chk_model *M = chk_models;
    /* fmt, d, d_rope, n, first, wrap, rows per page: a window ring that wraps, compressed rows
     * and indexer keys into pages, one row */
    struct { enum dsv4_row_fmt fmt; int d, dr, n, first, wrap, pr; } cases[] = {
        { DSV4_ROW_FP8, M[0].d_head, M[0].d_rope, 5, 13, M[0].window, M[0].window },
        { DSV4_ROW_BF16, M[0].d_head, M[0].d_rope, 17, 120, M[1].window, M[1].window },
        { DSV4_ROW_FP8, M[0].d_head, M[0].d_rope, 17, 7, 0, 5 },
        { DSV4_ROW_IDX_FP4, M[0].d_idx, 0, 31, 2, 0, 16 },
        { DSV4_ROW_BF16, 96, 32, 1, 3, 0, 3 },
        { DSV4_ROW_FP8, M[2].d_head, M[2].d_rope, 3, 126, M[2].window, M[2].window },
        { DSV4_ROW_IDX_FP4, M[2].d_idx, 0, 9, 500, 0, 64 },
    };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        int d = cases[s].d, dr = cases[s].dr, n = cases[s].n, ldx = d + 3, first = cases[s].first, wrap = cases[s].wrap;
        int span = wrap ? wrap : first + n;
        struct dsv4_plan_dims dims = chk_dims();
        dims.max_rows = n, dims.d_head = d, dims.d_rope = dr;
        chk_case(h, &dims, "fmt %d d %d, %d rows from %d, wrap %d, pages of %d", (int)cases[s].fmt, d, n, first, wrap,
                 cases[s].pr);
        size_t              pb;
        struct dsv4_kv_rows dst = make_rows(h, span, dsv4_row_bytes(cases[s].fmt, d, dr), cases[s].pr, &pb);
        uint8_t            *pool0 = chk_alloc(h, pb);
        memcpy(pool0, dst.base, pb);
        float *x = chk_floats(h, (size_t)n * ldx);
        chk_fill_bf16(h, x, (size_t)n * ldx, 2.0f);
        uint8_t *base = dst.base;
        for (struct dsv4_backend *be; (be = chk_next(h));) {
            if (chk_is_reference(h)) /* values as the model stores them (the op's contract) */
                for (int t = 0; t < n; t++) {
                    float *xr = x + (size_t)t * ldx;
                    if (cases[s].fmt == DSV4_ROW_FP8) be->ops->fp8_sim(be, 1, d - dr, d, xr, 64);
                    if (cases[s].fmt == DSV4_ROW_IDX_FP4) be->ops->fp4_sim(be, 1, d, d, xr, 32);
                }
            dst.base = chk_out_bytes(h, 0, pb, pool0); /* the whole pool: nothing else may change */
            be->ops->store_rows(be, cases[s].fmt, d, dr, n, chk_in(h, x), ldx, &dst, first, wrap);
            dst.base = base;
        }
    }
}

const struct chk_op chk_ops_kv[] = {
    { DSV4_OP_ATTENTION, "2^-7 rel + 2^-7 sum p|V|/den + 1e-6 + rows x 2^-22", run_attention },
    { DSV4_OP_INDEXER_SCORES, "1.6e-2 rel + 1e-6", run_indexer_scores },
    { DSV4_OP_INDEXER_TOPK, "counts exact; a best-k choice under the reference's scores +-(1.6e-2 rel + 1e-6)",
      run_indexer_topk },
    { DSV4_OP_COMPRESS, "bit-exact", run_compress },
    { DSV4_OP_STORE_ROWS, "bit-exact", run_store_rows },
    { DSV4_OP_COUNT, NULL, NULL },
};
