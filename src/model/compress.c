/*
 * compress.c - the KV compressor (gated softmax pooling, docs/MODEL.md §R3.6) and the lightning
 * indexer's top-k selection (§3.7).
 *
 * The compressor walks a chunk token by token against the sequence's frontier state, so the
 * result does not depend on how a prompt is chunked: prefill and decode are the same code.
 * A compressed row is emitted when the last token of its block arrives, into the page that
 * holds the block (kv.h). With overlap (ratio 4) each row pools 8 candidates per channel: the
 * previous block through the first half of the channels and the current block through the
 * second half.
 *
 * The indexer's top-k allocates nothing (a bounded heap instead of qsort, whose glibc
 * version mallocs a merge buffer for arrays over 1 KiB): it runs inside the token loop.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/runtime.h"

/* Per-channel softmax pooling of the frontier into out[d]: f32(sum softmax(g) * a), in
 * double as the reference. */
static void pool(const float *skv, const float *ssc, int ratio, int d, float *out)
{
    bool overlap = ratio == 4;
    int  width   = overlap ? 2 * d : d;
    int  n       = overlap ? 2 * ratio : ratio;
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

void dsv4_compress_chunk(const struct dsv4_model *m, struct dsv4_step *S, const struct dsv4_compressor_w *cw,
                         bool is_indexer, const struct dsv4_seq_state *st, const struct dsv4_layer_state *ls,
                         const float *a, const float *g, int n, int p0, int il, int seq)
{
    const struct dsv4_config *c = &m->cfg;
    struct dsv4_backend      *be = &S->be;
    int r = cw->ratio, d = cw->d_out, width = cw->coff * d;
    bool overlap = r == 4;
    float *skv = is_indexer ? ls->ikv : ls->ckv, *ssc = is_indexer ? ls->isc : ls->csc;
    for (int t = 0; t < n; t++) {
        int p = p0 + t, slot = p % r, dst = overlap ? r + slot : slot;
        const float *at = a + (size_t)t * (size_t)width, *gt = g + (size_t)t * (size_t)width;
        const float *ape = cw->ape + (size_t)slot * (size_t)width;
        float *kv_dst = skv + (size_t)dst * (size_t)width, *sc_dst = ssc + (size_t)dst * (size_t)width;
        for (int i = 0; i < width; i++) {
            kv_dst[i] = at[i];
            sc_dst[i] = gt[i] + ape[i];
        }
        if ((p + 1) % r != 0) continue;
        int    j   = p / r;
        float *row = S->crow;
        pool(skv, ssc, r, d, row);
        for (int i = 0; i < d; i++) row[i] = dsv4_round_bf16(row[i]);
        be->ops->rmsnorm(be, 1, d, row, d, cw->norm, c->norm_eps, row, d);
        int jpos = j * r;
        be->ops->rope(be, 1, 1, d, row, &jpos, dsv4_layer_rope(m, r), false);
        uint8_t *out = is_indexer ? dsv4_kv_idx_row(st, ls, j) : dsv4_kv_comp_row(st, ls, j);
        if (is_indexer) {
            be->ops->hadamard(be, 1, d, row);
            be->ops->fp4_sim(be, 1, d, d, row, 32);
            dsv4_idx_key_encode(d, row, out);
            dsv4_dump(S, "idx_keys", il, seq, j, 1, d, row);
        } else {
            if (m->row_fmt == DSV4_ROW_FP8) be->ops->fp8_sim(be, 1, c->d_nope, d, row, 64);
            dsv4_row_encode(m->row_fmt, d, c->d_rope, row, out);
            dsv4_dump(S, "comp", il, seq, j, 1, d, row);
        }
        if (overlap) {
            memcpy(skv, skv + (size_t)r * (size_t)width, sizeof(float) * (size_t)r * (size_t)width);
            memcpy(ssc, ssc + (size_t)r * (size_t)width, sizeof(float) * (size_t)r * (size_t)width);
        }
    }
}

/* Block a ranks before block b: higher score, ties to the lower id. */
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

/*
 * Selects the top-k compressed rows for one query among its n_done completed blocks.
 * Writes the chosen ids (ascending) to sel and returns k = min(topk, n_done).
 */
int dsv4_indexer_select(const struct dsv4_model *m, struct dsv4_step *S, const float *q, const float *w,
                        const struct dsv4_seq_state *st, const struct dsv4_layer_state *ls, int n_done, int *sel)
{
    const struct dsv4_config *c = &m->cfg;
    if (n_done <= 0) return 0;
    int bk = st->page_tokens / 4, nb = (n_done + bk - 1) / bk;
    for (int b = 0; b < nb; b++) S->kblk[b] = st->pages[b] + ls->idx_off;
    S->be.ops->indexer_scores(&S->be, c->n_idx_head, c->d_idx_head, q, w, S->kblk, bk, n_done, S->iscore);
    int k = c->idx_topk < n_done ? c->idx_topk : n_done;
    if (k == n_done) {
        for (int j = 0; j < n_done; j++) sel[j] = j;
        return k;
    }
    /* the k best in a heap rooted at the worst of them, then the ids in ascending order */
    const float *sc = S->iscore;
    for (int j = 0; j < k; j++) sel[j] = j;
    for (int i = k / 2 - 1; i >= 0; i--) sift_worst(sel, k, i, sc);
    for (int j = k; j < n_done; j++)
        if (ranks_before(sc, j, sel[0])) {
            sel[0] = j;
            sift_worst(sel, k, 0, sc);
        }
    for (int i = k / 2 - 1; i >= 0; i--) sift_int(sel, k, i);
    for (int n = k - 1; n > 0; n--) {
        int t = sel[0];
        sel[0] = sel[n], sel[n] = t;
        sift_int(sel, n, 0);
    }
    return k;
}
