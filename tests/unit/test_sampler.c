/*
 * test_sampler.c - the sampler (include/dsv4.h "Sampling") on synthetic logits:
 *   verify_greedy        temperature 0: the draft is accepted iff it is the argmax (ties to
 *                        the lowest id, NaN skipped), and the argmax is returned either way;
 *   verify_distribution  rejection sampling: drafts drawn by dsv4_sampler_sample from q,
 *                        verified against p with the same sampler; the returned tokens must
 *                        follow p (chi-square at significance 1e-4) and the acceptance rate
 *                        its closed form sum_x min(p(x), q(x)) (within 4 standard errors).
 *                        p and q come from a double-precision reference of the filters
 *                        written here, not from the code under test;
 *   verify_edges         drafts q cannot produce (q(d) = 0, ids outside the vocabulary) are
 *                        rejected; NaN logits never come back; no allocation;
 *   verify_determinism   the same seed and calls give the same tokens, verdicts and bits;
 *   sample_unchanged     dsv4_sampler_sample's tokens and probabilities for fixed seeds hash
 *                        to the value recorded before verification was added (the filter
 *                        was refactored under it).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "test_cases.h"

enum { MAXV = 12, DRAWS = 20000 };

/* ------------------------------------------------------------------ reference */

/* x ranks before y in lg: larger logit, ties to the lower id. */
static bool ref_before(const float *lg, int x, int y)
{
    return lg[x] != lg[y] ? lg[x] > lg[y] : x < y;
}

/* The filtered distribution p[v] of logits lg, in double precision: temperature -> top-k
 * -> softmax -> top-p -> min-p, as include/dsv4.h documents them. NaN and -inf have no mass. */
static void ref_dist(const float *lg, int v, const struct dsv4_sampler_params *sp, double *p)
{
    int    ord[MAXV], n = 0;
    double w[MAXV], sum = 0;
    for (int i = 0; i < v; i++) {
        p[i] = 0;
        if (lg[i] > -INFINITY) ord[n++] = i; /* false for NaN too */
    }
    for (int i = 1; i < n; i++) /* insertion sort, best first */
        for (int j = i; j > 0 && ref_before(lg, ord[j], ord[j - 1]); j--) {
            int x = ord[j];
            ord[j] = ord[j - 1], ord[j - 1] = x;
        }
    if (sp->top_k > 0 && sp->top_k < n) n = sp->top_k;
    for (int j = 0; j < n; j++) sum += (w[j] = exp(((double)lg[ord[j]] - lg[ord[0]]) / sp->temperature));
    for (int j = 0; j < n; j++) w[j] /= sum;
    int    keep = 0;
    double cum  = 0;
    while (keep < n && cum < (double)sp->top_p) cum += w[keep++];
    sum = 0;
    for (int j = 0; j < keep; j++)
        if (w[j] >= (double)sp->min_p * w[0]) sum += w[j];
    for (int j = 0; j < keep; j++)
        if (w[j] >= (double)sp->min_p * w[0]) p[ord[j]] = w[j] / sum;
}

/* Upper 1e-4 quantiles of chi-square with df = 1..20 degrees of freedom. */
static const double chi2_crit[21] = {
    0,      15.137, 18.421, 21.108, 23.513, 25.745, 27.856, 29.878, 31.828, 33.720, 35.564,
    37.367, 39.134, 40.871, 42.579, 44.263, 45.925, 47.566, 49.189, 50.795, 52.386,
};

/* Pearson's statistic of count[v] against n * p[v] over the cells with p > 0, the cells
 * expected under 5 pooled (with the next smallest while the pool is still under 5);
 * *df = cells - 1. */
static double chi_square(const int *count, const double *p, int v, int n, int *df)
{
    double e[MAXV], o[MAXV];
    int    m = 0;
    for (int i = 0; i < v; i++)
        if (p[i] > 0) e[m] = n * p[i], o[m++] = count[i];
    for (int i = 1; i < m; i++) /* ascending expected count */
        for (int j = i; j > 0 && e[j] < e[j - 1]; j--) {
            double x = e[j], y = o[j];
            e[j] = e[j - 1], o[j] = o[j - 1], e[j - 1] = x, o[j - 1] = y;
        }
    double pe = 0, po = 0, x2 = 0;
    int    i = 0, cells = 0;
    while (i < m && (e[i] < 5 || (pe > 0 && pe < 5))) pe += e[i], po += o[i++];
    if (pe > 0) x2 += (po - pe) * (po - pe) / pe, cells++;
    for (; i < m; i++) x2 += (o[i] - e[i]) * (o[i] - e[i]) / e[i], cells++;
    *df = cells - 1;
    return x2;
}

/* ------------------------------------------------------------------ verify */

static dsv4_sampler *make(struct test_ctx *t, int v, const struct dsv4_sampler_params *sp)
{
    dsv4_sampler   *s = NULL;
    struct dsv4_err err;
    int             rc = dsv4_sampler_create(&s, v, sp, &err);
    CHECKF(rc == DSV4_OK, "dsv4_sampler_create: %s", err.msg);
    return rc == DSV4_OK ? s : NULL;
}

static void test_verify_greedy(struct test_ctx *t)
{
    struct dsv4_sampler_params sp;
    dsv4_sampler_params_default(&sp);
    static const float rows[][8] = {
        { 0.5f, 2.0f, -1, 2.0f, 1.5f, NAN, 0, 2.0f }, /* three-way tie at 2: id 1 */
        { NAN, 1, 3, 3, -INFINITY, 0, 2, 3 },         /* NaN first, tie at 3: id 2 */
        { -1, -1, -1, -1, -1, -1, -1, -1 },           /* all tied: id 0 */
        { 0, 0, 0, 0, 0, 0, 0, INFINITY },            /* id 7 */
    };
    static const int32_t best[] = { 1, 2, 0, 7 };
    static const float   other[8] = { 5, 4, 3, 2, 1, 0, -1, -2 }; /* unused when greedy */
    dsv4_sampler        *s        = make(t, 8, &sp);
    if (!s) return;
    for (int r = 0; r < 4; r++)
        for (int32_t d = -1; d <= 8; d++) {
            bool    acc = !(d == best[r]);
            float   pr  = 0;
            int32_t tok = dsv4_sampler_verify(s, rows[r], other, d, &acc, &pr);
            CHECKF(tok == best[r] && acc == (d == best[r]) && pr == 1.0f,
                   "row %d draft %d: token %d accepted %d prob %g, want %d %d 1", r, d, tok, acc, (double)pr,
                   best[r], d == best[r]);
            CHECK(dsv4_sampler_verify(s, rows[r], other, d, &acc, NULL) == best[r]);
        }
    dsv4_sampler_free(s);
}

struct pq_case {
    const char                *name;
    struct dsv4_sampler_params sp;
    int                        v;
    float                      target[MAXV], draft[MAXV];
};

#define NEG (-INFINITY)
static const struct pq_case pq_cases[] = {
    { "plain", { .temperature = 1, .top_p = 1, .seed = 11 }, 6,
      { 1.0f, 0.5f, 0.0f, -0.5f, 2.0f, 0.2f }, { 0.3f, 1.5f, -0.2f, 0.4f, 1.0f, 0.0f } },
    { "temperature_top_k", { .temperature = 0.7f, .top_k = 4, .top_p = 1, .seed = 12 }, 8,
      { 0.2f, 1.1f, -0.3f, 0.9f, 1.4f, 0.0f, 0.6f, -1.0f }, { 1.2f, 0.1f, 0.8f, -0.4f, 0.3f, 1.0f, 0.5f, 0.0f } },
    { "top_p", { .temperature = 1.3f, .top_p = 0.8f, .seed = 13 }, 10,
      { 2.0f, 1.0f, 0.5f, 0.0f, -0.5f, 1.5f, -1.0f, 0.2f, -2.0f, 0.8f },
      { 0.0f, 1.8f, 1.2f, 0.3f, 0.9f, -0.6f, 0.4f, 1.0f, -1.0f, 0.1f } },
    { "min_p", { .temperature = 1, .top_p = 1, .min_p = 0.15f, .seed = 14 }, 10,
      { 1.0f, 3.0f, 0.0f, 2.2f, -1.0f, 1.7f, 0.4f, 2.6f, -0.3f, 0.9f },
      { 2.4f, 1.1f, 1.9f, 0.2f, 1.5f, 2.8f, 0.0f, 1.0f, 0.7f, -0.5f } },
    { "all_filters", { .temperature = 0.9f, .top_k = 7, .top_p = 0.9f, .min_p = 0.25f, .seed = 15 }, 12,
      { 0.3f, 1.2f, -0.4f, 2.0f, 0.8f, 1.6f, -1.2f, 0.1f, 1.0f, -0.2f, 2.3f, 0.5f },
      { 1.9f, 0.2f, 1.1f, 1.6f, 2.2f, 1.3f, 0.9f, 1.5f, -0.8f, 0.4f, 0.6f, 0.0f } },
    { "q_mass_outside_p", { .temperature = 1, .top_p = 1, .seed = 16 }, 8,
      { 1.0f, 0.4f, 0.0f, 0.7f, -0.3f, NEG, NEG, NEG }, { 0.0f, 0.2f, -0.5f, 0.1f, 0.3f, 2.0f, 2.5f, 1.8f } },
    { "p_mass_outside_q", { .temperature = 1.1f, .top_k = 6, .top_p = 1, .seed = 17 }, 9,
      { 1.5f, 0.2f, 1.0f, -0.1f, 0.6f, 0.3f, -0.7f, 0.9f, 0.0f }, { NEG, 0.5f, NEG, 0.8f, 0.1f, 1.2f, 0.4f, NEG, 0.6f } },
    { "q_equals_p", { .temperature = 0.8f, .top_k = 6, .top_p = 0.95f, .seed = 18 }, 9,
      { 0.5f, 1.4f, -0.2f, 1.0f, 0.3f, 2.0f, -0.9f, 0.7f, 0.0f }, { 0.5f, 1.4f, -0.2f, 1.0f, 0.3f, 2.0f, -0.9f, 0.7f, 0.0f } },
};

/* Checks counts against the reference distribution; returns the statistic (*df cells - 1). */
static double check_follows(struct test_ctx *t, const char *what, const int *count, const double *p, int v, int *df)
{
    int    bad = 0;
    double x2  = chi_square(count, p, v, DRAWS, df);
    for (int i = 0; i < v; i++) bad += p[i] == 0 ? count[i] : 0;
    CHECKF(bad == 0, "%s: %d tokens of probability 0", what, bad);
    CHECKF(*df >= 1 && *df <= 20 && x2 < chi2_crit[*df], "%s: chi-square %.2f with %d df (1e-4 critical value %.3f)",
           what, x2, *df, *df >= 1 && *df <= 20 ? chi2_crit[*df] : 0.0);
    return x2;
}

static void run_pq_case(struct test_ctx *t, const struct pq_case *c)
{
    double p[MAXV], q[MAXV], alpha = 0;
    ref_dist(c->target, c->v, &c->sp, p);
    ref_dist(c->draft, c->v, &c->sp, q);
    for (int i = 0; i < c->v; i++) alpha += fmin(p[i], q[i]);
    dsv4_sampler *s = make(t, c->v, &c->sp);
    if (!s) return;
    int count[MAXV] = { 0 }, drafts[MAXV] = { 0 }, n_acc = 0, bad_prob = 0;
    for (int k = 0; k < DRAWS; k++) {
        int32_t d = dsv4_sampler_sample(s, c->draft, NULL);
        bool    acc;
        float   pr;
        int32_t tok = dsv4_sampler_verify(s, c->target, c->draft, d, &acc, &pr);
        if (d < 0 || d >= c->v || tok < 0 || tok >= c->v) {
            CHECKF(0, "%s: draft %d token %d outside the vocabulary", c->name, d, tok);
            break;
        }
        drafts[d]++, count[tok]++, n_acc += acc;
        bad_prob += fabs(pr - p[tok]) > 1e-6 * p[tok] + 1e-7 || (acc && tok != d);
    }
    dsv4_sampler_free(s);
    CHECKF(bad_prob == 0, "%s: %d verdicts with a wrong probability or an accepted token not the draft", c->name, bad_prob);
    char what[64];
    int  df_q, df_p;
    snprintf(what, sizeof(what), "%s drafts", c->name);
    double x2_q = check_follows(t, what, drafts, q, c->v, &df_q);
    snprintf(what, sizeof(what), "%s tokens", c->name);
    double x2_p = check_follows(t, what, count, p, c->v, &df_p);
    double rate = (double)n_acc / DRAWS, se = sqrt(alpha * (1 - alpha) / DRAWS);
    CHECKF(fabs(rate - alpha) <= 4 * se, "%s: acceptance %.4f, expected %.4f (4 standard errors %.4f)", c->name, rate,
           alpha, 4 * se);
    if (alpha >= 1 - 1e-12) CHECKF(n_acc == DRAWS, "%s: q = p rejected %d drafts", c->name, DRAWS - n_acc);
    printf("    %-18s tokens chi2 %6.2f (df %2d, crit %.2f)  drafts chi2 %6.2f (df %2d)  acceptance %.4f (expected %.4f)\n",
           c->name, x2_p, df_p, df_p >= 1 && df_p <= 20 ? chi2_crit[df_p] : 0.0, x2_q, df_q, rate, alpha);
}

static void test_verify_distribution(struct test_ctx *t)
{
    for (size_t i = 0; i < sizeof(pq_cases) / sizeof(pq_cases[0]); i++) run_pq_case(t, &pq_cases[i]);
}

static void test_verify_edges(struct test_ctx *t)
{
    struct dsv4_sampler_params sp = { .temperature = 1, .top_k = 4, .top_p = 1, .seed = 5 };
    static const float target[6] = { 1.0f, NAN, 0.5f, 2.0f, -0.5f, 0.0f };
    static const float draft[6]  = { 0.0f, 1.0f, NEG, 0.5f, NAN, 0.2f };
    double             p[6];
    ref_dist(target, 6, &sp, p);
    dsv4_sampler *s = make(t, 6, &sp);
    if (!s) return;
    /* d = 2 has q = 0 (-inf), 4 a NaN draft logit, -1 and 6 are not tokens: never accepted. */
    static const int32_t never[] = { 2, 4, -1, 6 };
    int                  wrong = 0;
    for (int k = 0; k < 4000; k++) {
        bool    acc = true;
        float   pr;
        int32_t tok = dsv4_sampler_verify(s, target, draft, never[k % 4], &acc, &pr);
        wrong += acc || tok < 0 || tok >= 6 || !(p[tok] > 0) || fabs(pr - p[tok]) > 1e-6;
    }
    CHECKF(wrong == 0, "%d of 4000 impossible drafts accepted or answered with a token p excludes", wrong);
    /* A row with no finite logit is its argmax, for both calls. */
    float nan_row[6];
    for (int i = 0; i < 6; i++) nan_row[i] = NAN;
    bool  acc;
    float pr;
    CHECK(dsv4_sampler_sample(s, nan_row, &pr) == 0 && pr == 1.0f);
    CHECK(dsv4_sampler_verify(s, nan_row, nan_row, 0, &acc, &pr) == 0 && acc && pr == 1.0f);
    dsv4_sampler_free(s);

    /* Verification runs inside the scheduler's no-allocation region. */
    enum { V = 5000 };
    static float big_t[V], big_d[V];
    unsigned long long r = 3;
    struct dsv4_sampler_params bp = { .temperature = 1.5f, .top_p = 0.99f, .seed = 9 };
    s                             = make(t, V, &bp);
    if (!s) return;
    unsigned long before = dsv4_alloc_guard_count();
    dsv4_alloc_guard_enter();
    for (int k = 0; k < 20; k++) {
        for (int i = 0; i < V; i++) big_t[i] = 4 * test_rand_f32(&r), big_d[i] = 4 * test_rand_f32(&r);
        dsv4_sampler_verify(s, big_t, big_d, dsv4_sampler_sample(s, big_d, NULL), &acc, NULL);
    }
    dsv4_alloc_guard_leave();
    CHECKF(dsv4_alloc_guard_count() == before, "%lu allocations in verification", dsv4_alloc_guard_count() - before);
    dsv4_sampler_free(s);
}

/* One run of drafts and verdicts on pseudo-random rows; the record of every output. */
static void record_run(dsv4_sampler *s, int v, int steps, unsigned long long rs, uint32_t *rec)
{
    float t[64], d[64];
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < v; i++) t[i] = 3 * test_rand_f32(&rs), d[i] = 3 * test_rand_f32(&rs);
        bool    acc;
        float   pr;
        int32_t dr  = dsv4_sampler_sample(s, d, NULL);
        int32_t tok = dsv4_sampler_verify(s, t, d, dr, &acc, &pr);
        memcpy(&rec[3 * k + 2], &pr, sizeof(pr));
        rec[3 * k] = (uint32_t)dr, rec[3 * k + 1] = ((uint32_t)tok << 1) | acc;
    }
}

static void test_verify_determinism(struct test_ctx *t)
{
    enum { V = 64, STEPS = 2000 };
    static uint32_t a[3 * STEPS], b[3 * STEPS], c[3 * STEPS];
    struct dsv4_sampler_params sp = { .temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .min_p = 0.01f, .seed = 77 };
    dsv4_sampler *s1 = make(t, V, &sp), *s2 = make(t, V, &sp);
    sp.seed++;
    dsv4_sampler *s3 = make(t, V, &sp);
    if (s1 && s2 && s3) {
        record_run(s1, V, STEPS, 1, a);
        record_run(s2, V, STEPS, 1, b);
        record_run(s3, V, STEPS, 1, c);
        CHECKF(memcmp(a, b, sizeof(a)) == 0, "the same seed and calls gave different results");
        CHECKF(memcmp(a, c, sizeof(a)) != 0, "another seed gave the same %d drafts and verdicts", STEPS);
    }
    dsv4_sampler_free(s1);
    dsv4_sampler_free(s2);
    dsv4_sampler_free(s3);
}

/* ------------------------------------------------------------------ sample */

static unsigned long long fnv(unsigned long long h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void test_sample_unchanged(struct test_ctx *t)
{
    static const struct dsv4_sampler_params ps[] = {
        { 0, 0, 1, 0, 1 },        { 0.8f, 0, 1, 0, 2 },     { 1, 3, 1, 0, 3 },
        { 0.5f, 0, 0.9f, 0, 4 },  { 1.2f, 0, 1, 0.05f, 5 }, { 1, 40, 0.95f, 0.02f, 6 },
    };
    enum { V = 3000 }; /* over 1 KiB of candidates: the heap sort, and the 40-nat cut at 25 */
    static float       lg[V];
    unsigned long long h = 0xcbf29ce484222325ull, r = 42;
    for (size_t k = 0; k < sizeof(ps) / sizeof(ps[0]); k++) {
        dsv4_sampler *s = make(t, V, &ps[k]);
        if (!s) return;
        for (int step = 0; step < 200; step++) {
            for (int i = 0; i < V; i++) lg[i] = 25 * test_rand_f32(&r);
            lg[step % V] = NAN, lg[(step * 7 + 3) % V] = -INFINITY;
            float   pr;
            int32_t tok = dsv4_sampler_sample(s, lg, &pr);
            h = fnv(h, &tok, sizeof(tok)), h = fnv(h, &pr, sizeof(pr));
        }
        dsv4_sampler_free(s);
    }
    /* Recorded at commit 1dda70a, before dsv4_sampler_verify and the shared filter. */
    CHECKF(h == 0x0fa5fccb89e967b0ull, "sample's tokens and probabilities changed: hash %016llx", h);
}

/* The adjustments against an independent reading of include/dsv4.h's order (bias, then
 * repetition over prompt and generated tokens, then frequency and presence over generated
 * ones): greedy picks the adjusted argmax, and sampled tokens carry the probability the
 * softmax of the adjusted logits gives them, over a random history. */
static void test_penalties_and_bias(struct test_ctx *t)
{
    enum { V = 40 };
    unsigned long long rng = 2024;
    for (int round = 0; round < 30; round++) {
        struct dsv4_sampler_params sp;
        dsv4_sampler_params_default(&sp);
        sp.presence_penalty   = round % 3 == 0 ? 0 : test_rand_f32(&rng) * 2;
        sp.frequency_penalty  = round % 4 == 0 ? 0 : test_rand_f32(&rng) * 2;
        sp.repetition_penalty = round % 5 == 0 ? 1 : 1 + (test_rand_f32(&rng) + 1) * 0.8f;
        sp.n_bias             = round % 2 ? 3 : 0;
        for (int b = 0; b < sp.n_bias; b++) {
            sp.bias_id[b] = (int32_t)(test_rand_u64(&rng) % V);
            sp.bias[b]    = test_rand_f32(&rng) * 5;
        }
        sp.temperature = round % 2 ? 0.8f : 0;
        sp.seed        = (uint64_t)round;
        dsv4_sampler *s = make(t, V, &sp);
        if (!s) return;
        float   logits[V], ref[V];
        int     count[V] = { 0 }, seen[V] = { 0 };
        int32_t prompt[6];
        for (int i = 0; i < 6; i++) seen[prompt[i] = (int32_t)(test_rand_u64(&rng) % V)] = 1;
        dsv4_sampler_prime(s, prompt, 6);
        for (int step = 0; step < 25; step++) {
            for (int i = 0; i < V; i++) logits[i] = test_rand_f32(&rng) * 3;
            for (int i = 0; i < V; i++) ref[i] = logits[i];
            for (int b = 0; b < sp.n_bias; b++) ref[sp.bias_id[b]] += sp.bias[b];
            for (int i = 0; i < V; i++) {
                if (seen[i] && sp.repetition_penalty != 1)
                    ref[i] = ref[i] > 0 ? ref[i] / sp.repetition_penalty : ref[i] * sp.repetition_penalty;
                if (count[i]) ref[i] -= sp.frequency_penalty * (float)count[i] + sp.presence_penalty;
            }
            float   prob = 0;
            int32_t tok  = dsv4_sampler_sample(s, logits, &prob);
            int     best = 0;
            for (int i = 1; i < V; i++)
                if (ref[i] > ref[best]) best = i;
            if (sp.temperature == 0) {
                CHECKF(tok == best, "round %d step %d: greedy %d, reference argmax %d", round, step, (int)tok, best);
            } else {
                double z = 0;
                for (int i = 0; i < V; i++) z += exp(((double)ref[i] - ref[best]) / sp.temperature);
                double want = exp(((double)ref[tok] - ref[best]) / sp.temperature) / z;
                CHECKF(fabs(prob - want) < 1e-4 * (want + 1e-3), "round %d step %d: token %d prob %g, reference %g",
                       round, step, (int)tok, (double)prob, want);
            }
            dsv4_sampler_accept(s, tok);
            count[tok]++;
            seen[tok] = 1;
        }
        dsv4_sampler_free(s);
    }
    /* out of range: refused */
    struct dsv4_sampler_params bad;
    dsv4_sampler_params_default(&bad);
    bad.n_bias     = 1;
    bad.bias_id[0] = V;
    dsv4_sampler   *s = NULL;
    CHECK(dsv4_sampler_create(&s, V, &bad, NULL) == DSV4_EINVAL && !s);
    dsv4_sampler_params_default(&bad);
    bad.repetition_penalty = -1;
    CHECK(dsv4_sampler_create(&s, V, &bad, NULL) == DSV4_EINVAL && !s);
}

const struct test_case test_group_sampler[] = {
    { "penalties_and_bias", test_penalties_and_bias },
    { "verify_greedy", test_verify_greedy },
    { "verify_distribution", test_verify_distribution },
    { "verify_edges", test_verify_edges },
    { "verify_determinism", test_verify_determinism },
    { "sample_unchanged", test_sample_unchanged },
    { NULL, NULL },
};
