/*
 * soak.c - latency samples and the soak verdict (see soak.h): the rules as one function of
 * the measurements, printed by tools/loadtest_soak.c and tested on synthetic runs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/soak.h"

/*
 * The RSS rule's margin. The first quarter is the warm-up: the weights are mapped and the
 * KV pool is allocated and touched at start-up, but weight pages become resident as they
 * are first read, and glibc gives threads that allocate arenas of their own which grow to
 * their working size. After that a server without leaks keeps a flat RSS; what still
 * moves is allocator noise: fragmentation, which scales with the heap (the 5%), and a few
 * arenas or thread stacks touched late, whatever the heap's size (the 8 MiB). Over a
 * 15-minute run at the demo model's rate that still catches a leak of a few KiB per
 * request or ~100 bytes per generated token.
 */
static const double RSS_GROWTH_SHARE = 0.05;
static const double RSS_GROWTH_MIB   = 8;
/* The ITL rule: P99 of the last quarter may be up to 20% above the first quarter's. */
static const double ITL_DRIFT = 0.20;

void lt_samples_add(struct lt_samples *s, double x)
{
    if (s->n == s->cap) {
        size_t  cap = s->cap ? s->cap * 2 : 1024;
        double *p   = realloc(s->v, cap * sizeof(double));
        if (!p) return;
        s->v   = p;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lt_samples_pct_ms(struct lt_samples *s, double p)
{
    if (!s->n) return NAN;
    qsort(s->v, s->n, sizeof(double), cmp_double);
    size_t k = (size_t)ceil(p / 100.0 * (double)s->n);
    if (k < 1) k = 1;
    return s->v[k - 1] * 1e3;
}

int soak_quarter(double frac)
{
    int q = (int)(frac * LT_N_QUARTER);
    return q < 0 ? 0 : q >= LT_N_QUARTER ? LT_N_QUARTER - 1 : q;
}

void soak_rss_sample(long max_kib[LT_N_QUARTER], int q, long kib)
{
    if (q >= 0 && q < LT_N_QUARTER && kib > max_kib[q]) max_kib[q] = kib;
}

/* Appends why to the comma-separated list of failed rules. */
static void failed(struct soak_result *r, const char *why)
{
    size_t n = strlen(r->reasons);
    snprintf(r->reasons + n, sizeof(r->reasons) - n, "%s%s", n ? ", " : "", why);
}

static void judge_rss(const struct soak_input *in, struct soak_result *r)
{
    long first = in->rss_max_kib[0], last = in->rss_max_kib[LT_N_QUARTER - 1];
    if (!in->rss_checked) {
        r->rss = SOAK_RSS_UNCHECKED;
    } else if (in->rss_gone) {
        r->rss = SOAK_RSS_GONE;
        failed(r, "server gone");
    } else if (first < 0 || last < 0) {
        r->rss = SOAK_RSS_UNMEASURED;
        failed(r, "rss not measured");
    } else {
        r->rss_first_mib = (double)first / 1024;
        r->rss_last_mib  = (double)last / 1024;
        r->rss_limit_mib = r->rss_first_mib * (1 + RSS_GROWTH_SHARE) + RSS_GROWTH_MIB;
        r->rss           = r->rss_last_mib <= r->rss_limit_mib ? SOAK_RSS_OK : SOAK_RSS_GREW;
        if (r->rss == SOAK_RSS_GREW) failed(r, "rss grew");
    }
}

static void judge_itl(const struct soak_input *in, struct soak_result *r)
{
    r->itl_first_ms = lt_samples_pct_ms(in->itl_first, 99);
    r->itl_last_ms  = lt_samples_pct_ms(in->itl_last, 99);
    r->itl_measured = !isnan(r->itl_first_ms) && !isnan(r->itl_last_ms);
    if (!r->itl_measured) {
        failed(r, "itl not measured");
        return;
    }
    r->itl_limit_ms = r->itl_first_ms * (1 + ITL_DRIFT);
    r->itl_ok       = r->itl_last_ms <= r->itl_limit_ms;
    if (!r->itl_ok) failed(r, "itl p99 drifted");
}

void soak_judge(const struct soak_input *in, struct soak_result *r)
{
    memset(r, 0, sizeof(*r));
    r->rss_share = RSS_GROWTH_SHARE;
    r->rss_mib   = RSS_GROWTH_MIB;
    r->itl_drift = ITL_DRIFT;
    judge_rss(in, r);
    r->lost = in->no_done + in->bad_body;
    if (r->lost) failed(r, "lost requests");
    judge_itl(in, r);
    r->done_ok = in->done > 0;
    if (!r->done_ok) failed(r, "nothing completed");
    r->pass = !r->reasons[0];
}
