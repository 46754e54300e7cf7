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
 *
 * Logit bias and the repetition, frequency and presence penalties adjust the logits first
 * (into a buffer of the sampler's own; the order is in include/dsv4.h); the penalties read
 * the prompt (dsv4_sampler_prime) and the tokens the caller committed (dsv4_sampler_accept).
 *
 * Speculative verification (dsv4_sampler_verify) is rejection sampling over the same
 * filtered distributions: accept the draft d with probability min(1, p(d)/q(d)), otherwise
 * draw from max(0, p - q) renormalised, so the token returned is distributed as a sample of
 * the target would be. Greedy accepts exactly the argmax. The draft's distribution is kept
 * dense in s->q (allocated here, like the rest, so verification allocates nothing either).
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
    double                    *q;    /* [vocab]: the draft's distribution, dense (verify) */
    bool                       adjusts; /* a bias or a penalty is on */
    float                     *adj;     /* [vocab]: the adjusted logits */
    uint32_t                  *count;   /* [vocab]: times generated */
    uint8_t                   *seen;    /* [vocab]: in the prompt or generated */
};

void dsv4_sampler_params_default(struct dsv4_sampler_params *p)
{
    memset(p, 0, sizeof(*p));
    p->top_p              = 1.0f;
    p->repetition_penalty = 1.0f;
}

bool dsv4_sampler_has_history(const struct dsv4_sampler_params *p)
{
    return p->constraint || p->presence_penalty != 0 || p->frequency_penalty != 0 ||
           (p->repetition_penalty != 1 && p->repetition_penalty != 0);
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
    if (!(fabsf(p->presence_penalty) <= 100) || !(fabsf(p->frequency_penalty) <= 100) ||
        !(p->repetition_penalty >= 0 && p->repetition_penalty <= 100))
        return dsv4_err_set(err, DSV4_EINVAL, "penalties outside their ranges (presence and frequency |x| <= 100, "
                            "repetition in [0, 100], 0 = off)");
    if (p->n_bias < 0 || p->n_bias > DSV4_MAX_LOGIT_BIAS)
        return dsv4_err_set(err, DSV4_EINVAL, "%d logit_bias entries (at most %d)", p->n_bias, DSV4_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_id[i] < 0 || p->bias_id[i] >= vocab || !isfinite(p->bias[i]))
            return dsv4_err_set(err, DSV4_EINVAL, "logit_bias entry %d: token %d, bias %g", i, (int)p->bias_id[i],
                                (double)p->bias[i]);
    dsv4_sampler *s = calloc(1, sizeof(*s));
    if (!s) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    s->p     = *p;
    s->vocab = vocab;
    s->rng   = p->seed ^ 0x5851f42d4c957f2dull;
    s->c     = malloc(sizeof(*s->c) * (size_t)vocab);
    s->prob  = malloc(sizeof(*s->prob) * (size_t)vocab);
    s->q     = malloc(sizeof(*s->q) * (size_t)vocab);
    s->adjusts = p->n_bias > 0 || dsv4_sampler_has_history(p);
    if (s->adjusts) {
        s->adj   = malloc(sizeof(*s->adj) * (size_t)vocab);
        s->count = calloc((size_t)vocab, sizeof(*s->count));
        s->seen  = calloc((size_t)vocab, 1);
    }
    if (!s->c || !s->prob || !s->q || (s->adjusts && (!s->adj || !s->count || !s->seen))) {
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
    free(s->q);
    free(s->adj);
    free(s->count);
    free(s->seen);
    free(s);
}

void dsv4_sampler_prime(dsv4_sampler *s, const int32_t *prompt, int n)
{
    if (!s->adjusts) return;
    for (int i = 0; i < n; i++)
        if (prompt[i] >= 0 && prompt[i] < s->vocab) s->seen[prompt[i]] = 1;
}

void dsv4_sampler_accept(dsv4_sampler *s, int32_t token)
{
    if (s->p.constraint) dsv4_constraint_accept(s->p.constraint, token);
    if (!s->adjusts || token < 0 || token >= s->vocab) return;
    s->seen[token] = 1;
    s->count[token]++;
}

/* The logits with the bias and the penalties applied (docs in include/dsv4.h), or logits
 * itself when none is on. */
static const float *adjust(dsv4_sampler *s, const float *logits)
{
    if (!s->adjusts) return logits;
    memcpy(s->adj, logits, sizeof(float) * (size_t)s->vocab);
    for (int i = 0; i < s->p.n_bias; i++) s->adj[s->p.bias_id[i]] += s->p.bias[i];
    if (s->p.constraint) dsv4_constraint_mask(s->p.constraint, s->adj);
    if (s->p.presence_penalty != 0 || s->p.frequency_penalty != 0 ||
        (s->p.repetition_penalty != 1 && s->p.repetition_penalty != 0))
        for (int32_t i = 0; i < s->vocab; i++) {
            if (!s->seen[i]) continue;
            float l = s->adj[i], r = s->p.repetition_penalty;
            if (r != 1 && r != 0) l = l > 0 ? l / r : l * r;
            if (s->count[i]) l -= s->p.frequency_penalty * (float)s->count[i] + s->p.presence_penalty;
            s->adj[i] = l;
        }
    return s->adj;
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

/* Argmax, ties to the lowest id; NaN never wins over a number. */
static int32_t argmax(const float *logits, int vocab)
{
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    return best;
}

/* The filtered distribution of logits (temperature > 0): candidates s->c[0, n) best first,
 * with weights s->prob[0, n) summing to *tot, so token c[i].id has probability prob[i] / tot.
 * Returns n >= 1. The weights are not renormalised after top-p and min-p: the draw scales
 * its uniform by tot instead, as sampling always has, so a seed keeps its tokens. NaN
 * logits fail the margin test and drop out; a row with nothing inside the margin (all NaN,
 * or a +inf) is its argmax alone. */
static size_t filter(dsv4_sampler *s, const float *logits, double *tot)
{
    int32_t best = argmax(logits, s->vocab);
    float   t    = s->p.temperature, mx = logits[best];
    size_t  n    = 0;
    for (int32_t i = 0; i < s->vocab; i++)
        if ((logits[i] - mx) / t > -40.0f) s->c[n++] = (struct cand){ logits[i], i };
    if (n == 0) {
        s->c[0]    = (struct cand){ mx, best };
        s->prob[0] = *tot = 1;
        return 1;
    }
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
    *tot = 0;
    for (size_t i = 0; i < n; i++) *tot += s->prob[i];
    return n;
}

static double uniform(uint64_t *rng)
{
    return (double)(next_u64(rng) >> 11) * 0x1.0p-53;
}

/* An index drawn from weights w[0, n) that sum to tot. */
static size_t draw(uint64_t *rng, const double *w, size_t n, double tot)
{
    double u = uniform(rng) * tot, acc = 0;
    for (size_t i = 0; i < n; i++)
        if (u < (acc += w[i])) return i;
    return n - 1;
}

int32_t dsv4_sampler_sample(dsv4_sampler *s, const float *logits, float *prob)
{
    logits = adjust(s, logits);
    if (s->p.temperature <= 0) {
        if (prob) *prob = 1.0f;
        return argmax(logits, s->vocab);
    }
    double tot;
    size_t n    = filter(s, logits, &tot);
    size_t pick = draw(&s->rng, s->prob, n, tot);
    if (prob) *prob = (float)(s->prob[pick] / tot);
    return s->c[pick].id;
}

/* Fills s->q with the filtered distribution of draft_logits (zero outside it); returns
 * q(draft), 0 for an id outside the vocabulary. Cleared whole each time: the candidates
 * that would say which entries to clear are overwritten by the target's, and the clear
 * costs about what the filter's own pass over the vocabulary does. */
static double fill_q(dsv4_sampler *s, const float *draft_logits, int32_t draft)
{
    memset(s->q, 0, sizeof(*s->q) * (size_t)s->vocab);
    double tot;
    size_t n = filter(s, draft_logits, &tot);
    for (size_t i = 0; i < n; i++) s->q[s->c[i].id] = s->prob[i] / tot;
    return draft >= 0 && draft < s->vocab ? s->q[draft] : 0;
}

/* After a rejection: an index drawn from max(0, p - q) over the target's candidates
 * (s->c, s->prob, tot from filter), or from p where that is all zero; *p_pick receives p of
 * the drawn token. The residual replaces p in s->prob so that draw() serves both cases, and
 * p moves into s->q, whose q is not needed any more. */
static size_t draw_residual(dsv4_sampler *s, size_t n, double tot, double *p_pick)
{
    double rest = 0;
    for (size_t i = 0; i < n; i++) rest += fmax(0, s->prob[i] / tot - s->q[s->c[i].id]);
    if (!(rest > 0)) {
        size_t pick = draw(&s->rng, s->prob, n, tot);
        *p_pick     = s->prob[pick] / tot;
        return pick;
    }
    for (size_t i = 0; i < n; i++) {
        double p = s->prob[i] / tot, *q = &s->q[s->c[i].id];
        s->prob[i] = fmax(0, p - *q);
        *q         = p;
    }
    size_t pick = draw(&s->rng, s->prob, n, rest);
    *p_pick     = s->q[s->c[pick].id];
    return pick;
}

int32_t dsv4_sampler_verify(dsv4_sampler *s, const float *target, const float *draft_logits, int32_t draft,
                            bool *accepted, float *prob)
{
    /* The bias does not depend on the history, so a draft sampled with it verifies exactly;
     * with a penalty on, the scheduler makes no drafts. adjust() reuses one buffer: the
     * draft's distribution is taken (fill_q) before the target is adjusted. */
    if (s->p.temperature <= 0) {
        int32_t best = argmax(adjust(s, target), s->vocab);
        *accepted    = draft == best;
        if (prob) *prob = 1.0f;
        return best;
    }
    double qd = fill_q(s, adjust(s, draft_logits), draft), tot, pd = 0;
    size_t n  = filter(s, adjust(s, target), &tot), at = n;
    for (size_t i = 0; i < n && at == n; i++)
        if (s->c[i].id == draft) at = i, pd = s->prob[i] / tot;
    /* Accept with probability min(1, p/q); q(d) = 0 means d did not come from this q. */
    *accepted = qd > 0 && pd > 0 && (pd >= qd || uniform(&s->rng) * qd < pd);
    if (!*accepted) at = draw_residual(s, n, tot, &pd);
    if (prob) *prob = (float)pd;
    return s->c[at].id;
}
