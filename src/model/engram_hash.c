/*
 * engram_hash.c - Engram row indices (engram_hash.h, docs/ENGRAM.md).
 *
 * Three pieces, each named after the function of the official inference/engram.py it matches:
 *   multipliers  compute_hash_multipliers: per Engram layer, np.random.default_rng(10007 *
 *                layer_id).integers(0, bound, max_ngram) with bound = (INT64_MAX //
 *                compressed_vocab) // 2, each value v made odd as 2v + 1 (np_random.c draws
 *                exactly what numpy draws). Kept as integers: they reach about 2^46 for
 *                V4.1-Flash, but id * multiplier approaches 2^63, past a double's exact range.
 *   primes       EngramLayout.from_args: for each (layer, order) the search restarts above
 *                vocab_size - 1 and takes the next n_heads primes that no earlier (layer,
 *                order, head) took; a column's rows start after the previous column's primes.
 *   indices      NgramHashState.forward: the window of a position is its own id and the
 *                max_ngram - 1 before it; from the first look-back that is DEAD or before the
 *                sequence start, it and every older one read as the pad id. Each id is
 *                multiplied by its look-back's multiplier, the products are XORed one look-back
 *                at a time, and after look-back k the running value (the (k + 1)-gram hash)
 *                modulo each head's prime, plus the column's offset, is a row index.
 */
#include "model/engram_hash.h"

#include <string.h>

#include "core/core.h"
#include "core/np_random.h"

enum {
    LAYER_SEED_MULT = 10007, /* compute_hash_multipliers: default_rng(10007 * layer_id) */
};

/* Exact primality by trial division over 6k +- 1; n stays below 2^33 (init's limits), so
 * at most ~30k divisions, for the few hundred candidates init tests. */
static int is_prime(uint64_t n)
{
    if (n < 4) return n >= 2;
    if (n % 2 == 0 || n % 3 == 0) return 0;
    for (uint64_t d = 5; d * d <= n; d += 6)
        if (n % d == 0 || n % (d + 2) == 0) return 0;
    return 1;
}

static int taken(const int64_t *seen, int n_seen, int64_t v)
{
    for (int i = 0; i < n_seen; i++)
        if (seen[i] == v) return 1;
    return 0;
}

static void build_primes(struct dsv4_engram_hash *h)
{
    const struct dsv4_engram_params *p = &h->p;
    int64_t seen[DSV4_ENGRAM_MAX_LAYERS * DSV4_ENGRAM_MAX_COLS];
    int     n_seen = 0;
    for (int l = 0; l < p->n_layers; l++) {
        int64_t next_row = 0;
        for (int o = 0; o + 1 < p->max_ngram; o++) {
            int64_t cur = p->vocab_size - 1;
            for (int hd = 0; hd < p->n_heads; hd++) {
                do cur++;
                while (!is_prime((uint64_t)cur) || taken(seen, n_seen, cur));
                seen[n_seen++]   = cur;
                int c            = o * p->n_heads + hd;
                h->prime[l][c]   = cur;
                h->offset[l][c]  = next_row;
                next_row        += cur;
            }
        }
    }
}

static int build_multipliers(struct dsv4_engram_hash *h, struct dsv4_err *err)
{
    const struct dsv4_engram_params *p = &h->p;
    int64_t bound = INT64_MAX / p->compressed_vocab / 2;
    if (bound < 1) bound = 1;
    for (int l = 0; l < p->n_layers; l++) {
        struct dsv4_pcg64 g;
        int64_t           v[DSV4_ENGRAM_MAX_NGRAM];
        dsv4_pcg64_seed(&g, (uint64_t)LAYER_SEED_MULT * (uint64_t)p->layer_ids[l]);
        int rc = dsv4_pcg64_integers(&g, 0, bound, v, p->max_ngram);
        if (rc) {
            return dsv4_err_set(err, rc, "engram: compressed vocab %lld gives a multiplier bound "
                                "at most 2^32 (numpy's 32-bit draw is not reproduced)",
                                (long long)p->compressed_vocab);
        }
        for (int k = 0; k < p->max_ngram; k++) h->mult[l][k] = v[k] * 2 + 1;
    }
    return 0;
}

static int check_shape(const struct dsv4_engram_params *p, struct dsv4_err *err)
{
    if (p->n_layers < 1 || p->n_layers > DSV4_ENGRAM_MAX_LAYERS)
        return dsv4_err_set(err, p->n_layers < 1 ? DSV4_EINVAL : DSV4_EUNSUPPORTED,
                            "engram: %d layers (1 to %d supported)", p->n_layers,
                            DSV4_ENGRAM_MAX_LAYERS);
    if (p->max_ngram < 2 || p->max_ngram > DSV4_ENGRAM_MAX_NGRAM)
        return dsv4_err_set(err, p->max_ngram < 2 ? DSV4_EINVAL : DSV4_EUNSUPPORTED,
                            "engram: max_ngram_size %d (2 to %d supported)", p->max_ngram,
                            DSV4_ENGRAM_MAX_NGRAM);
    if (p->n_heads < 1 || p->n_heads > DSV4_ENGRAM_MAX_HEADS)
        return dsv4_err_set(err, p->n_heads < 1 ? DSV4_EINVAL : DSV4_EUNSUPPORTED,
                            "engram: n_heads %d (1 to %d supported)", p->n_heads,
                            DSV4_ENGRAM_MAX_HEADS);
    for (int l = 0; l < p->n_layers; l++)
        if (p->layer_ids[l] < 0 || p->layer_ids[l] > (1 << 24))
            return dsv4_err_set(err, DSV4_EINVAL, "engram: layer id %d out of range",
                                p->layer_ids[l]);
    return 0;
}

static int check_sizes(const struct dsv4_engram_params *p, struct dsv4_err *err)
{
    if (p->vocab_size < 1 || p->vocab_size > ((int64_t)1 << 32))
        return dsv4_err_set(err, DSV4_EINVAL, "engram: vocab_size %lld (1 to 2^32)",
                            (long long)p->vocab_size);
    if (p->compressed_vocab < 1 || p->compressed_vocab > ((int64_t)1 << 31))
        return dsv4_err_set(err, DSV4_EINVAL, "engram: compressed vocab size %lld (1 to 2^31)",
                            (long long)p->compressed_vocab);
    if (p->pad_compressed < 0 || p->pad_compressed >= p->compressed_vocab)
        return dsv4_err_set(err, DSV4_EINVAL, "engram: pad id %d is not a compressed id "
                            "(0 to %lld)", p->pad_compressed, (long long)p->compressed_vocab - 1);
    return 0;
}

/* Each layer's table must hold every column's bucket range (the released config's row counts
 * are exactly these sums). */
static int check_rows(const struct dsv4_engram_hash *h, struct dsv4_err *err)
{
    for (int l = 0; l < h->p.n_layers; l++) {
        int64_t need = h->offset[l][h->n_cols - 1] + h->prime[l][h->n_cols - 1];
        if (h->p.num_embeddings[l] < need)
            return dsv4_err_set(err, DSV4_EINVAL, "engram: layer %d's table has %lld rows, its "
                                "primes need %lld", h->p.layer_ids[l],
                                (long long)h->p.num_embeddings[l], (long long)need);
    }
    return 0;
}

int dsv4_engram_hash_init(struct dsv4_engram_hash *h, const struct dsv4_engram_params *p,
                          struct dsv4_err *err)
{
    int rc = check_shape(p, err);
    if (!rc) rc = check_sizes(p, err);
    if (rc) return rc;
    memset(h, 0, sizeof(*h));
    h->p      = *p;
    h->n_cols = (p->max_ngram - 1) * p->n_heads;
    rc        = build_multipliers(h, err);
    if (rc) return rc;
    build_primes(h);
    return check_rows(h, err);
}

void dsv4_engram_seq_reset(struct dsv4_engram_seq *s)
{
    for (int i = 0; i < DSV4_ENGRAM_MAX_NGRAM - 1; i++) s->hist[i] = DSV4_ENGRAM_DEAD;
}

/* One position's rows: id is the position's own compressed id (or DEAD), s the history. */
static void hash_position(const struct dsv4_engram_hash *h, const struct dsv4_engram_seq *s,
                          int32_t id, int64_t *out)
{
    const struct dsv4_engram_params *p = &h->p;
    uint64_t tok[DSV4_ENGRAM_MAX_NGRAM];
    int      blocked = 0;
    for (int k = 0; k < p->max_ngram; k++) {
        int32_t v = k == 0 ? id : s->hist[k - 1];
        blocked   = blocked || v == DSV4_ENGRAM_DEAD;
        tok[k]    = (uint64_t)(blocked ? p->pad_compressed : v);
    }
    for (int l = 0; l < p->n_layers; l++) {
        /* id < compressed_vocab and mult < 2^63 / compressed_vocab: no product wraps */
        uint64_t rolling = tok[0] * (uint64_t)h->mult[l][0];
        int64_t *row     = out + (size_t)l * (size_t)h->n_cols;
        for (int k = 1; k < p->max_ngram; k++) {
            rolling ^= tok[k] * (uint64_t)h->mult[l][k];
            for (int hd = 0; hd < p->n_heads; hd++) {
                int c  = (k - 1) * p->n_heads + hd;
                row[c] = (int64_t)(rolling % (uint64_t)h->prime[l][c]) + h->offset[l][c];
            }
        }
    }
}

int dsv4_engram_chunk(const struct dsv4_engram_hash *h, struct dsv4_engram_seq *s,
                      const int32_t *ids, int n, int64_t *out, struct dsv4_err *err)
{
    for (int i = 0; i < n; i++)
        if (ids[i] != DSV4_ENGRAM_DEAD && (ids[i] < 0 || ids[i] >= h->p.compressed_vocab))
            return dsv4_err_set(err, DSV4_ERANGE, "engram: compressed id %d at %d is not in "
                                "[0, %lld) nor DEAD", ids[i], i, (long long)h->p.compressed_vocab);
    const size_t stride = (size_t)h->p.n_layers * (size_t)h->n_cols;
    for (int i = 0; i < n; i++) {
        hash_position(h, s, ids[i], out + (size_t)i * stride);
        memmove(s->hist + 1, s->hist, (DSV4_ENGRAM_MAX_NGRAM - 2) * sizeof(s->hist[0]));
        s->hist[0] = ids[i];
    }
    return 0;
}

int dsv4_engram_sequence(const struct dsv4_engram_hash *h, const int32_t *ids, int n,
                         int64_t *out, struct dsv4_err *err)
{
    struct dsv4_engram_seq s;
    dsv4_engram_seq_reset(&s);
    return dsv4_engram_chunk(h, &s, ids, n, out, err);
}
