/*
 * soak.h - latency samples and the soak verdict of `dsv4 loadtest --soak` as a pure function
 * over what a run measured, so the test runner can judge synthetic runs (tests/unit/
 * test_loadtest.c) with the same code the load generator uses (tools/loadtest_soak.c prints
 * the verdict; loadtest_shared.h for the rest of the load generator).
 *
 * The run (--duration) is cut into LT_N_QUARTER quarters by time; the first is the warm-up.
 * The rules (see soak.c for the margins and why):
 *   rss   the largest RSS sampled in the last quarter must not exceed the largest in the
 *         first by more than the margin, and the server process must not disappear;
 *   lost  no accepted request lost;
 *   itl   P99 inter-token latency of the last quarter at most the drift above the first's;
 *   done  at least one request completed.
 */
#ifndef DSV4_SOAK_H
#define DSV4_SOAK_H

#include <stdbool.h>
#include <stddef.h>

enum { LT_N_QUARTER = 4 };

struct lt_samples {
    double *v; /* [n] seconds */
    size_t  n, cap;
};
void   lt_samples_add(struct lt_samples *s, double x);
/* Nearest-rank percentile in milliseconds (sorts the samples); NAN without samples. */
double lt_samples_pct_ms(struct lt_samples *s, double p);

/* The quarter of a run that a time falls in, from its share of the duration (clamped). */
int  soak_quarter(double frac);
/* Keeps the largest RSS sample of each quarter (max_kib[q] -1: none yet). */
void soak_rss_sample(long max_kib[LT_N_QUARTER], int q, long kib);

/* What a soak run measured. */
struct soak_input {
    bool               rss_checked;              /* a server PID was watched */
    bool               rss_gone;                 /* the server process disappeared */
    long               rss_max_kib[LT_N_QUARTER]; /* largest RSS per quarter, -1: no sample */
    struct lt_samples *itl_first, *itl_last;     /* inter-token latencies of the first and last quarter */
    long               no_done, bad_body;        /* accepted requests lost (loadtest_shared.h) */
    long               done;                     /* requests completed */
};

enum soak_rss {
    SOAK_RSS_UNCHECKED, /* no server PID: not judged */
    SOAK_RSS_GONE,
    SOAK_RSS_UNMEASURED, /* no sample in the first or the last quarter */
    SOAK_RSS_OK,
    SOAK_RSS_GREW,
};

/* The verdict, with the figures each rule compared. */
struct soak_result {
    enum soak_rss rss;
    double        rss_first_mib, rss_last_mib, rss_limit_mib;
    double        rss_share, rss_mib;   /* the RSS margin: a share of the first quarter's, plus MiB */
    long          lost;                 /* no_done + bad_body */
    bool          itl_measured, itl_ok;
    double        itl_first_ms, itl_last_ms, itl_limit_ms;
    double        itl_drift;            /* the ITL margin: a share of the first quarter's P99 */
    bool          done_ok;
    bool          pass;
    char          reasons[256];         /* the failed rules, comma-separated; "" on a pass */
};

/* Judges a run (sorts the ITL samples; reads nothing else but in, writes only r). */
void soak_judge(const struct soak_input *in, struct soak_result *r);

#endif
