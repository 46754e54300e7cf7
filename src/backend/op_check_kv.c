/*
 * op_check_kv.c - the op checker's cases for the ops on stored rows: attention and the
 * indexer's scores and top-k (the compressor, row stores and step_begin: op_check_store.c).
 * Attention and the top-k run whole steps (op_check_step.h): one sequence, and several of
 * different lengths and positions in one call. Rows sit in paged sets (struct
 * dsv4_kv_rows) of several pages with a shuffled, non-identity page table, a byte offset into
 * each page and garbage around the rows, as KV pages hold them. Attention runs every layer
 * kind of the presets (window only, CSA with the indexer's selection, HCA over every
 * compressed row) in both row formats, for decode (one query) and chunks that straddle the
 * window ring and the chunk's own rows.
 */
#include <math.h>
#include <string.h>

#include "backend/op_check_step.h"

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

/* A step of sequences (p0, rows each) over one layer kind. */
struct attn_case {
    int model, ratio_kind; /* ratio_kind 0: window only, 1: CSA (csa_ratio, selected rows), 2: HCA */
    enum dsv4_row_fmt fmt;
    int n_seqs;
    int pn[CHK_STEP_MAX_SEQS][2];
    bool block; /* a draft block (window only): struct dsv4_attn_src .block */
};

/* The rows step row r (sequence s, its t-th) reads, in the contract's order (struct
 * dsv4_attn_src); returns the count. */
static int rows_of(const struct chk_step *f, const struct dsv4_attn_src *src, int s, int t, const uint8_t **rows)
{
    const struct dsv4_step_seq *q = &f->seq[s];
    int p = q->p0 + t, r = q->row0 + t, n = 0;
    if (src->block) { /* the ring's last `window` positions before the chunk, then every chunk row */
        for (int j = q->p0 - src->window > 0 ? q->p0 - src->window : 0; j < q->p0; j++)
            rows[n++] = q->slot + src->ring_off + (size_t)(j % src->ring_rows) * (size_t)src->row_bytes;
        for (int j = 0; j < q->n; j++) rows[n++] = src->chunk + (size_t)(q->row0 + j) * (size_t)src->row_bytes;
        return n;
    }
    for (int j = p - src->window + 1 > 0 ? p - src->window + 1 : 0; j <= p; j++)
        rows[n++] = j < q->p0 ? q->slot + src->ring_off + (size_t)(j % src->ring_rows) * (size_t)src->row_bytes
                              : src->chunk + (size_t)(q->row0 + j - q->p0) * (size_t)src->row_bytes;
    if (!src->ratio) return n;
    struct dsv4_kv_rows comp = dsv4_step_page_rows(&f->desc, s, src->comp_off, src->ratio, src->row_bytes);
    if (src->sel)
        for (int i = 0; i < src->n_sel[r]; i++) rows[n++] = dsv4_kv_row_at(&comp, src->sel[r * src->sel_stride + i]);
    else
        for (int j = 0; j < (p + 1) / src->ratio; j++) rows[n++] = dsv4_kv_row_at(&comp, j);
    return n;
}

/* The magnitude of one query's head: sum_i p_i |V_i| / den in double over its rows kv[n]. */
static void head_mag(const float *qh, const float *kv, int n, int D, float sink, float scale, double *e, float *mh)
{
    double m = sink;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int c = 0; c < D; c++) s += (double)qh[c] * kv[(size_t)i * D + c];
        e[i] = s * scale;
        m    = fmax(m, e[i]);
    }
    double den = exp(sink - m);
    for (int i = 0; i < n; i++) den += (e[i] = exp(e[i] - m));
    for (int c = 0; c < D; c++) {
        double a = 0;
        for (int i = 0; i < n; i++) a += e[i] * fabs(kv[(size_t)i * D + c]);
        mh[c] = (float)(a / den);
    }
}

/*
 * The tolerance's magnitude per output: sum_i p_i |V_i| / den in double. The probabilities
 * are rounded to bf16 in the numerator; a score a few f32 ulps off flips a rounding now and
 * then, which moves the output by up to 2^-7 p_i |V_i| / den: where the values cancel, far
 * more than 2^-7 of the output. mag * 2^-7 bounds every flip of a query's head together.
 */
static void attention_mag(struct chk *h, const struct chk_step *f, const struct dsv4_attn_src *src, int H, int D,
                          int R, enum dsv4_row_fmt fmt, const float *q, const float *sink, float scale, int max_rows,
                          float *mag)
{
    const uint8_t **rows = chk_alloc(h, sizeof(void *) * (size_t)max_rows);
    float          *kv   = chk_floats(h, (size_t)max_rows * D);
    double         *e    = chk_alloc(h, sizeof(double) * (size_t)max_rows);
    for (int s = 0; s < f->desc.n_seqs; s++)
        for (int t = 0; t < f->seq[s].n; t++) {
            size_t r = (size_t)(f->seq[s].row0 + t);
            int    n = rows_of(f, src, s, t, rows);
            for (int i = 0; i < n; i++) dsv4_row_decode(fmt, D, R, rows[i], kv + (size_t)i * D);
            for (int hh = 0; hh < H; hh++)
                head_mag(q + (r * H + hh) * D, kv, n, D, sink[hh], scale, e, mag + (r * H + hh) * D);
        }
}

/* The stored rows every query may read, FP8-simulated through the reference: each
 * sequence's ring and compressed rows, the step's staging rows. */
static void attention_rows(struct chk *h, struct dsv4_backend *ref, const struct chk_step *f,
                           const struct dsv4_attn_src *src, enum dsv4_row_fmt fmt, int D, int R)
{
    float *v = chk_floats(h, (size_t)D);
    for (int s = 0; s < f->desc.n_seqs; s++) {
        const struct dsv4_step_seq *q = &f->seq[s];
        struct dsv4_kv_rows comp = src->ratio ? dsv4_step_page_rows(&f->desc, s, src->comp_off, src->ratio, src->row_bytes)
                                              : (struct dsv4_kv_rows){ 0 };
        int n_comp = src->ratio ? (q->p0 + q->n) / src->ratio : 0;
        for (int j = 0; j < src->ring_rows + n_comp; j++) {
            chk_fill_bf16(h, v, (size_t)D, 2.0f);
            write_row(ref, fmt, D, R, v,
                      j < src->ring_rows ? q->slot + src->ring_off + (size_t)j * (size_t)src->row_bytes
                                         : dsv4_kv_row_at(&comp, j - src->ring_rows));
        }
    }
    for (int r = 0; r < f->desc.n_rows; r++) {
        chk_fill_bf16(h, v, (size_t)D, 2.0f);
        write_row(ref, fmt, D, R, v, (uint8_t *)(uintptr_t)(src->chunk + (size_t)r * (size_t)src->row_bytes));
    }
}

/* The indexer's choice for each row: n_sel ascending ids among its completed rows. */
static void attention_sel(struct chk *h, const struct chk_step *f, int topk, struct dsv4_attn_src *src)
{
    int nr = f->desc.n_rows, *sel = chk_alloc(h, sizeof(int) * (size_t)nr * topk);
    int *n_sel = chk_alloc(h, sizeof(int) * (size_t)nr);
    for (int r = 0; r < nr; r++) {
        int done = (f->pos[r] + 1) / src->ratio, k = done < topk ? done : topk, m = 0;
        for (int j = 0; j < done && m < k; j++) /* pick k of done, in order (selection sampling) */
            if (chk_u64(h) % (uint64_t)(done - j) < (uint64_t)(k - m)) sel[r * topk + m++] = j;
        n_sel[r] = m;
    }
    src->sel = sel, src->n_sel = n_sel, src->sel_stride = topk;
}

static void attention_case(struct chk *h, const struct attn_case *c)
{
    const struct chk_model *M = &chk_models[c->model];
    int H = M->n_head, D = M->d_head, R = M->d_rope, W = M->window, last = 0;
    int ratio = c->ratio_kind == 0 ? 0 : c->ratio_kind == 1 ? M->csa_ratio : M->hca_ratio;
    int topk  = c->ratio_kind == 1 ? M->topk : 0;
    int rb = dsv4_row_bytes(c->fmt, D, R);
    for (int s = 0; s < c->n_seqs; s++) last = last > c->pn[s][0] + c->pn[s][1] - 1 ? last : c->pn[s][0] + c->pn[s][1] - 1;
    int n_comp = ratio ? (last + 1) / ratio : 0, max_rows = W + (topk ? (n_comp < topk ? n_comp : topk) : n_comp);
    for (int s = 0; c->block && s < c->n_seqs; s++) max_rows = max_rows > W + c->pn[s][1] ? max_rows : W + c->pn[s][1];
    /* a ring longer than the window at byte 64 of a slot; compressed rows in pages of 5 rows */
    struct dsv4_attn_src src = { .window = W, .ratio = ratio, .ring_rows = W + 3, .row_bytes = rb, .ring_off = 64,
                                 .comp_off = 64, .block = c->block };
    struct chk_step f;
    chk_step_make(h, &f, c->n_seqs, (const int (*)[2])c->pn, 64 + (size_t)(W + 3) * rb + 32, 5 * (ratio ? ratio : 1),
                  64 + (size_t)5 * rb + 32);
    uint8_t *arena = f.arena; /* the case's: each run reads its own copy (chk_in) */
    int nq = f.desc.n_rows;
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = nq, dims.max_ctx = last + 1, dims.max_attn_rows = max_rows;
    dims.n_head = H, dims.d_head = D, dims.d_rope = R, dims.idx_topk = topk > 0 ? topk : 1;
    static const char *const kinds[] = { "window", "CSA", "HCA" };
    chk_case(h, &dims, "%s %s%s %s rows, %d sequence%s, positions %d.. (%d rows)%s", M->name, kinds[c->ratio_kind],
             c->block ? " draft block" : "",
             c->fmt == DSV4_ROW_FP8 ? "fp8" : "bf16", c->n_seqs, c->n_seqs > 1 ? "s" : "", c->pn[0][0],
             c->pn[0][1], c->n_seqs > 1 ? ", ..." : "");
    src.chunk = chk_alloc(h, (size_t)nq * rb);
    float *q = chk_floats(h, (size_t)nq * H * D), *sink = chk_floats(h, (size_t)H);
    chk_fill_bf16(h, q, (size_t)nq * H * D, 3.0f);
    for (int i = 0; i < H; i++) sink[i] = (float)chk_uniform(h) * 2.0f;
    if (topk) attention_sel(h, &f, topk, &src);
    float scale = 1.0f / sqrtf((float)D);
    /* one bf16 rounding of the output plus f32 sums over the rows in another order (values
     * are below 2 in magnitude, so rows x 2^-22 bounds the absolute error of a sum), plus the
     * flipped probability roundings of attention_mag */
    struct chk_tol tol = { 0.0079, 1e-6 + (double)max_rows * 0x1p-22, 0x1p-7, 0 };
    float         *mag = chk_floats(h, (size_t)nq * H * D);
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        if (chk_is_reference(h)) { /* the rows, FP8-simulated through the reference, once */
            attention_rows(h, be, &f, &src, c->fmt, D, R);
            attention_mag(h, &f, &src, H, D, R, c->fmt, q, sink, scale, max_rows, mag);
        }
        float *o = chk_out_f32(h, 0, (size_t)nq * H * D, tol, NULL, mag);
        /* the slots and pages, the staging rows and the indexer's selection: backend memory */
        struct dsv4_attn_src in = src;
        in.chunk = chk_in(h, src.chunk), in.sel = chk_in(h, src.sel), in.n_sel = chk_in(h, src.n_sel);
        chk_step_rebase(&f, chk_in(h, arena));
        be->ops->step_begin(be, &f.desc);
        be->ops->attention(be, &f.desc, H, D, R, chk_in(h, q), &in, c->fmt, chk_in(h, sink), scale, o);
    }
}

static void run_attention(struct chk *h)
{
    for (int m = 0; m < 3; m++) {
        int W = chk_models[m].window, P = 5 * chk_models[m].csa_ratio; /* CSA's page: 5 rows */
        for (int kind = 0; kind < 3; kind++) {
            /* decode past the window, a chunk straddling ring and chunk rows, a first chunk;
             * then a step of them: a decode row, a chunk across a block and a page boundary
             * and the window's edge, a first chunk */
            struct attn_case cs[] = {
                { m, kind, DSV4_ROW_FP8, 1, { { m == 2 ? 2100 : 300, 1 } }, false },
                { m, kind, DSV4_ROW_FP8, 1, { { W + 5, m == 2 ? 2 : 17 } }, false },
                { m, kind, DSV4_ROW_BF16, 1, { { 0, 3 } }, false },
                { m, kind, DSV4_ROW_BF16, 1, { { 2 * W + 3, 3 } }, false },
                { m, kind, DSV4_ROW_FP8, 3, { { m == 2 ? 2100 : 300, 1 }, { 3 * P - 2, m == 2 ? 3 : 9 }, { 0, 2 } }, false },
            };
            for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
                if (m == 2 && cs[i].fmt == DSV4_ROW_BF16 && i == 3) continue; /* flash: enough rows already */
                attention_case(h, &cs[i]);
            }
        }
        /* draft blocks (not causal): a first block, one past the window, a step of three */
        struct attn_case bl[] = {
            { m, 0, DSV4_ROW_BF16, 1, { { 0, 3 } }, true },
            { m, 0, DSV4_ROW_FP8, 1, { { W + 5, 5 } }, true },
            { m, 0, DSV4_ROW_BF16, 3, { { 2, 3 }, { 2 * W + 1, 7 }, { W - 1, 5 } }, true },
        };
        for (size_t i = 0; i < sizeof(bl) / sizeof(bl[0]); i++) attention_case(h, &bl[i]);
    }
}

/* ------------------------------------------------------------------ indexer */

/* n_keys keys (FP4-simulated values through the reference, encoded) into a paged set. */
static void write_keys(struct chk *h, struct dsv4_backend *ref, const struct dsv4_kv_rows *keys, int n, int d)
{
    float *k = chk_floats(h, (size_t)d);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < d; i++) k[i] = (float)chk_uniform(h);
        ref->ops->fp4_sim(ref, 1, d, d, k, 32, false);
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
    int          n_q, topk, ratio; /* ratio: positions per key */
    const int   *pos;        /* [n_q] each row's position */
    float       *ref_scores; /* [n_q][max_done] from the reference run */
    int          max_done;
    int          cmode;      /* V4.1's candidate blocks: 0 none, 1 picked (output 2), 2 obeyed */
    struct dsv4_idx_cand cand; /* blocks: the obeyed ones (host copy) */
};

/* Row t's choice g[n] against the reference's scores sc. */
static void topk_row(struct chk *h, int t, int done, const int *g, int n, const float *sc)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (g[i] < 0 || g[i] >= done || (i && g[i] <= g[i - 1])) {
            chk_fail(h, "query %d: sel[%d] = %d is not an ascending id below %d", t, i, g[i], done);
            return;
        }
        if (sc[g[i]] == -INFINITY) { /* masked: outside the row's candidate blocks */
            chk_fail(h, "query %d: sel[%d] = %d is outside the candidate blocks", t, i, g[i]);
            return;
        }
        lo = fmin(lo, sc[g[i]] + 0.016 * fabs(sc[g[i]]) + 1e-6);
    }
    for (int u = 0, j = 0; u < done; u++) {
        if (j < n && g[j] == u) {
            j++;
            continue;
        }
        hi = fmax(hi, sc[u] - 0.016 * fabs(sc[u]) - 1e-6);
    }
    if (hi > lo) chk_fail(h, "query %d: a key left out scores %.6g over a kept one's %.6g", t, hi, lo);
}

/* Row t's picked blocks g[n_keep] (cmode 1): min(n_keep, its blocks) ascending ids, -1
 * after, its newest block among them, and a best choice of blocks scored by their best key
 * (the reference's scores, within their tolerance). */
static void blocks_row(struct chk *h, int t, int done, const struct dsv4_idx_cand *c, const int *g, const float *sc)
{
    int    nb = (done + c->block - 1) / c->block, kb = c->n_keep < nb ? c->n_keep : nb;
    double lo = INFINITY, hi = -INFINITY;
    bool   newest = nb == 0;
    for (int i = 0; i < c->n_keep; i++) {
        if (i >= kb ? g[i] != -1 : (g[i] < 0 || g[i] >= nb || (i && g[i] <= g[i - 1]))) {
            chk_fail(h, "query %d: block[%d] = %d: not %s", t, i, g[i], i >= kb ? "-1" : "an ascending block id");
            return;
        }
    }
    for (int b = 0, i = 0; b < nb; b++) {
        double m = -INFINITY;
        for (int j = b * c->block; j < done && j < (b + 1) * c->block; j++) m = fmax(m, sc[j]);
        bool kept = i < kb && g[i] == b;
        i += kept;
        if (b == nb - 1) newest = kept;
        else if (kept) lo = fmin(lo, m + 0.016 * fabs(m) + 1e-6);
        else hi = fmax(hi, m - 0.016 * fabs(m) - 1e-6);
    }
    if (!newest) chk_fail(h, "query %d: the newest block %d is not kept", t, nb - 1);
    if (hi > lo) chk_fail(h, "query %d: a block left out scores %.6g over a kept one's %.6g", t, hi, lo);
}

/* Row t's reference scores with the keys outside its obeyed blocks at -inf (cmode 2). */
static void mask_row(const struct dsv4_idx_cand *c, int t, int done, float *sc)
{
    const int *b = c->blocks + (size_t)t * c->n_keep;
    for (int j = 0; j < done; j++) {
        bool in = false;
        for (int i = 0; i < c->n_keep && b[i] >= 0; i++) in |= b[i] == j / c->block;
        if (!in) sc[j] = -INFINITY;
    }
}

static void topk_compare(struct chk *h, void *ud)
{
    const struct topk_check *c = ud;
    const int *rs = chk_ref(h, 0), *gs = chk_got(h, 0), *rn = chk_ref(h, 1), *gn = chk_got(h, 1);
    size_t     differ = 0;
    for (int t = 0; t < c->n_q; t++) {
        if (gn[t] != rn[t]) {
            chk_fail(h, "query %d: n_sel %d, reference %d", t, gn[t], rn[t]);
            continue;
        }
        const int *g = gs + (size_t)t * c->topk, *r = rs + (size_t)t * c->topk;
        int        done = (c->pos[t] + 1) / c->ratio;
        float     *sc   = c->ref_scores + (size_t)t * c->max_done;
        differ += memcmp(g, r, sizeof(int) * (size_t)gn[t]) != 0;
        if (c->cmode == 1) blocks_row(h, t, done, &c->cand, (const int *)chk_got(h, 2) + (size_t)t * c->cand.n_keep, sc);
        if (c->cmode == 2) mask_row(&c->cand, t, done, sc); /* idempotent: the next level's compare sees the same */
        topk_row(h, t, done, g, gn[t], sc);
    }
    chk_note(h, (size_t)c->n_q, differ, 0, 0);
}

/* Obeyed blocks for every row: an ascending random subset of its blocks (some rows none). */
static void obeyed_blocks(struct chk *h, const struct topk_check *tc, int *blocks)
{
    const struct dsv4_idx_cand *c = &tc->cand;
    for (int t = 0; t < tc->n_q; t++) {
        int  done = (tc->pos[t] + 1) / tc->ratio, nb = (done + c->block - 1) / c->block, n = 0;
        int *b    = blocks + (size_t)t * c->n_keep;
        for (int k = 0; k < nb && n < c->n_keep; k++)
            if (chk_u64(h) % 3 != 0 || k == nb - 1) b[n++] = k;
        for (int i = n; i < c->n_keep; i++) b[i] = -1;
    }
}

/* Keys of every sequence (FP4-simulated through the reference) and the reference's scores
 * the choice is judged by. */
static void topk_inputs(struct chk *h, struct dsv4_backend *ref, const struct chk_step *f, int kb, int H, int d,
                        const float *q, const float *w, struct topk_check *tc)
{
    for (int s = 0; s < f->desc.n_seqs; s++) {
        struct dsv4_kv_rows keys = dsv4_step_page_rows(&f->desc, s, 64, tc->ratio, kb);
        int                 done = (f->seq[s].p0 + f->seq[s].n) / tc->ratio;
        write_keys(h, ref, &keys, done, d);
        for (int t = 0; t < f->seq[s].n; t++) {
            size_t r = (size_t)(f->seq[s].row0 + t);
            int    n = (f->pos[r] + 1) / tc->ratio;
            if (n > 0)
                ref->ops->indexer_scores(ref, H, d, q + r * H * d, w + r * H, &keys, n,
                                         tc->ref_scores + r * (size_t)tc->max_done);
        }
    }
}

static void topk_case(struct chk *h, int model, int n_seqs, const int (*pn)[2], int pr, int cmode)
{
    const struct chk_model *M = &chk_models[model];
    int H = M->n_idx_head, d = M->d_idx, K = M->topk, kb = dsv4_idx_key_bytes(d), last = 0, ratio = M->csa_ratio;
    for (int s = 0; s < n_seqs; s++) last = last > pn[s][0] + pn[s][1] ? last : pn[s][0] + pn[s][1];
    int n_keys = last / ratio > 0 ? last / ratio : 1;
    struct chk_step f; /* keys at byte 64 of a page of pr keys */
    chk_step_make(h, &f, n_seqs, pn, 64, ratio * pr, 64 + (size_t)pr * kb + 32);
    uint8_t *arena = f.arena; /* the case's: each run reads its own copy (chk_in) */
    int nq = f.desc.n_rows;
    struct dsv4_plan_dims dims = chk_dims();
    dims.max_rows = nq, dims.max_ctx = last, dims.n_idx_head = H, dims.d_idx_head = d, dims.idx_topk = K;
    dims.idx_ratio = ratio;
    chk_case(h, &dims, "%s top-%d, %d sequence%s, positions %d..%d%s, pages of %d%s", M->name, K, n_seqs,
             n_seqs > 1 ? "s" : "", pn[0][0], pn[0][0] + pn[0][1] - 1, n_seqs > 1 ? ", ..." : "", pr,
             cmode == 1 ? ", picking candidate blocks" : cmode == 2 ? ", within candidate blocks" : "");
    float *q = chk_floats(h, (size_t)nq * H * d), *w = chk_floats(h, (size_t)nq * H);
    chk_fill_bf16(h, q, (size_t)nq * H * d, 1.0f);
    for (int i = 0; i < nq * H; i++) w[i] = dsv4_round_bf16((float)fabs(chk_uniform(h)) + 0.01f);
    struct topk_check tc = { nq, K, ratio, f.pos, chk_floats(h, (size_t)nq * n_keys), n_keys, cmode,
                             { model == 2 ? 8 : 2, K / (model == 2 ? 8 : 2) + 2, cmode == 1, NULL } };
    if (cmode == 2) obeyed_blocks(h, &tc, tc.cand.blocks = chk_alloc(h, sizeof(int) * (size_t)nq * tc.cand.n_keep));
    chk_custom(h, topk_compare, &tc);
    for (struct dsv4_backend *be; (be = chk_next(h));) {
        if (chk_is_reference(h)) topk_inputs(h, be, &f, kb, H, d, q, w, &tc);
        int *sel   = chk_out_int(h, 0, (size_t)nq * K, NULL);
        int *n_sel = chk_out_int(h, 1, (size_t)nq, NULL);
        struct dsv4_idx_cand cand = tc.cand;
        if (cmode == 1) cand.blocks = chk_out_int(h, 2, (size_t)nq * cand.n_keep, NULL);
        if (cmode == 2) cand.blocks = chk_in(h, tc.cand.blocks);
        chk_step_rebase(&f, chk_in(h, arena)); /* the keys' pages: backend memory */
        be->ops->step_begin(be, &f.desc);
        be->ops->indexer_topk(be, &f.desc, ratio, H, d, chk_in(h, q), chk_in(h, w), 64, kb, K, sel, n_sel,
                              cmode ? &cand : NULL);
    }
}

static void run_indexer_topk(struct chk *h)
{
    /* model, p0, n_q, rows per page: decode, a chunk whose first queries have no key yet or
     * keep every key (n_done <= topk), the flash top-512 over 525 keys */
    const int cases[][4] = { { 0, 40, 3, 5 }, { 0, 0, 17, 4 }, { 1, 100, 5, 16 }, { 1, 60, 3, 7 }, { 2, 2097, 2, 64 } };
    for (size_t s = 0; s < sizeof(cases) / sizeof(cases[0]); s++) {
        const int pn[1][2] = { { cases[s][1], cases[s][2] } };
        topk_case(h, cases[s][0], 1, pn, cases[s][3], 0);
    }
    /* a step: a decode row, a chunk across a block and a page boundary, a first chunk */
    const int step_a[3][2] = { { 200, 1 }, { 4 * 7 - 2, 9 }, { 0, 5 } };
    const int step_f[3][2] = { { 2101, 1 }, { 4 * 64 - 3, 4 }, { 0, 3 } };
    /* V4.1's candidate blocks, picked and obeyed: the same steps, and a long decode row */
    const int step_c[2][2] = { { 3001, 1 }, { 4 * 64 - 3, 6 } };
    for (int cmode = 0; cmode < 3; cmode++) {
        topk_case(h, 0, 3, step_a, 7, cmode);
        topk_case(h, 1, 3, step_a, 7, cmode);
        topk_case(h, 2, 3, step_f, 64, cmode);
    }
    topk_case(h, 2, 2, step_c, 64, 1);
    topk_case(h, 2, 2, step_c, 64, 2);
}

const struct chk_op chk_ops_kv[] = {
    { DSV4_OP_STEP_BEGIN, "the descriptor unchanged; the rows of a store_rows after it bit-exact", chk_run_step_begin },
    { DSV4_OP_ATTENTION, "2^-7 rel + 2^-7 sum p|V|/den + 1e-6 + rows x 2^-22", run_attention },
    { DSV4_OP_INDEXER_SCORES, "1.6e-2 rel + 1e-6", run_indexer_scores },
    { DSV4_OP_INDEXER_TOPK, "counts exact; a best-k choice under the reference's scores +-(1.6e-2 rel + 1e-6)",
      run_indexer_topk },
    { DSV4_OP_COMPRESS, "bit-exact", chk_run_compress },
    { DSV4_OP_STORE_ROWS, "bit-exact", chk_run_store_rows },
    { DSV4_OP_COUNT, NULL, NULL },
};
