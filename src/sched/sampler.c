/*
 * sampler.c - token sampling from logits: greedy, or temperature with top-k, top-p and
 * min-p filters, from a seeded generator (splitmix64), so a seed reproduces a run.
 *
 * Greedy is argmax with ties to the lowest id. Otherwise the filters apply in the order
 * temperature -> top-k -> softmax -> top-p -> min-p, then one draw from the renormalised
 * distribution. Tokens more than 40 nats below the best (probability ratio < 4e-18) are
 * dropped before sorting: they cannot change a draw in double precision but would make
 * every step sort the whole vocabulary. Sorting is a heap selection of the top-k followed by
 * a heapsort, in place: sampling runs inside the scheduler's no-allocation region, and
 * glibc's qsort allocates a merge buffer for arrays over 1 KiB.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

struct cand {
    float   logit;
    int32_t id;
};

struct dsv4_sampler {
    struct dsv4_sampler_params p;
    int                        vocab;
    uint64_t                   rng;
    struct cand               *c;    /* [vocab] */
    double                    *prob; /* [vocab] */
};

void dsv4_sampler_params_default(struct dsv4_sampler_params *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p = 1.0f;
}

int dsv4_sampler_create(dsv4_sampler **out, int vocab, const struct dsv4_sampler_params *p, struct dsv4_err *err)
{
    *out = NULL;
    if (vocab < 1) return dsv4_err_set(err, DSV4_EINVAL, "vocabulary size %d", vocab);
    if (!(p->temperature >= 0) || p->temperature > 100)
        return dsv4_err_set(err, DSV4_EINVAL, "temperature %g outside [0, 100]", (double)p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) return dsv4_err_set(err, DSV4_EINVAL, "top_p %g outside (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return dsv4_err_set(err, DSV4_EINVAL, "min_p %g outside [0, 1]", (double)p->min_p);
    if (p->top_k < 0) return dsv4_err_set(err, DSV4_EINVAL, "top_k %d is negative", p->top_k);
    dsv4_sampler *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    s->p     = *p;
    s->vocab = vocab;
    s->rng   = p->seed ^ 0x5851f42d4c957f2dull;
    s->c     = malloc(sizeof(*s->c) * (size_t)vocab);
    s->prob  = malloc(sizeof(*s->prob) * (size_t)vocab);
    if (!s->c || !s->prob) {
        dsv4_sampler_free(s);
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    }
    *out = s;
    return DSV4_OK;
}

void dsv4_sampler_free(dsv4_sampler *s)
{
    if (!s) return;
    free(s->c);
    free(s->prob);
    free(s);
}

static uint64_t next_u64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z          = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z          = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* x ranks before y: larger logit, ties to the lower id. */
static bool ranks_before(const struct cand *x, const struct cand *y)
{
    return x->logit != y->logit ? x->logit > y->logit : x->id < y->id;
}

/* Sift-down in a heap rooted at the candidate that ranks last. */
static void sift(struct cand *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && ranks_before(&h[w], &h[l])) w = l;
        if (r < n && ranks_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        struct cand t = h[i];
        h[i] = h[w], h[w] = t;
        i = w;
    }
}

/* Leaves the k best of c[0, n) at the front, best first (k <= n). */
static void sort_best(struct cand *c, size_t n, size_t k)
{
    for (size_t i = k / 2; i-- > 0;) sift(c, k, i);
    for (size_t j = k; j < n; j++)
        if (ranks_before(&c[j], &c[0])) {
            c[0] = c[j];
            sift(c, k, 0);
        }
    for (size_t m = k; m-- > 1;) {
        struct cand t = c[0];
        c[0] = c[m], c[m] = t;
        sift(c, m, 0);
    }
}

int32_t dsv4_sampler_sample(dsv4_sampler *s, const float *logits, float *prob)
{
    int32_t best = 0;
    for (int32_t i = 1; i < s->vocab; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    if (s->p.temperature <= 0) {
        if (prob) *prob = 1.0f;
        return best;
    }
    float  t   = s->p.temperature, mx = logits[best];
    size_t n   = 0;
    for (int32_t i = 0; i < s->vocab; i++)
        if ((logits[i] - mx) / t > -40.0f) s->c[n++] = (struct cand){ logits[i], i };
    size_t keep = s->p.top_k > 0 && (size_t)s->p.top_k < n ? (size_t)s->p.top_k : n;
    sort_best(s->c, n, keep);
    n = keep;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += (s->prob[i] = exp(((double)s->c[i].logit - mx) / t));
    for (size_t i = 0; i < n; i++) s->prob[i] /= sum;
    if (s->p.top_p < 1) {
        double cum = 0;
        size_t k   = 0;
        while (k < n && cum < s->p.top_p) cum += s->prob[k++];
        n = k ? k : 1;
    }
    if (s->p.min_p > 0) {
        size_t k = 1;
        while (k < n && s->prob[k] >= s->p.min_p * s->prob[0]) k++;
        n = k;
    }
    double tot = 0;
    for (size_t i = 0; i < n; i++) tot += s->prob[i];
    double u   = (double)(next_u64(&s->rng) >> 11) * 0x1.0p-53 * tot, acc = 0;
    size_t pick = n - 1;
    for (size_t i = 0; i < n; i++) {
        acc += s->prob[i];
        if (u < acc) {
            pick = i;
            break;
        }
    }
    if (prob) *prob = (float)(s->prob[pick] / tot);
    return s->c[pick].id;
}
