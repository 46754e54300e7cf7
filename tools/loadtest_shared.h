/*
 * loadtest_shared.h - what the files of `dsv4 loadtest` share: the options, the counters
 * and latency samples every client thread adds to, and the entry points of
 * loadtest_mix.c (the client threads and the request kinds they send) and
 * loadtest_soak.c (the periodic reports, server RSS and KV metrics, the soak verdict's
 * lines), and what both read, in loadtest_common.c (names, counts, quarters); neither of
 * the two calls the other. The latency samples and the verdict's rules are in
 * tools/support/soak.h, where the test runner reaches them too. cmd_loadtest.c parses the
 * options, starts the threads and prints the summary.
 *
 * Every request ends in exactly one outcome (enum lt_outcome), counted by request kind,
 * so the counts of a report always add up to the requests finished. Outcomes are of three
 * sorts: done (the request completed), expected (the request was meant not to complete:
 * a client that hung up on purpose, a slow sender the server cut, a bad request refused
 * with 4xx) and errors; of the errors, "lost" ones are requests the server accepted
 * (200) that ended without [DONE] and without an error event, or whose whole body does
 * not parse.
 */
#ifndef DSV4_LOADTEST_SHARED_H
#define DSV4_LOADTEST_SHARED_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "support/http_client.h"
#include "support/soak.h"

enum { LT_N_CLASS = 3 };
extern const char *const lt_class_name[LT_N_CLASS];

/* What a request does. Slow senders run on threads of their own (--slow-clients); the
 * other kinds are drawn per request by the --kinds weights. */
enum lt_kind {
    LT_KIND_STREAM,     /* streamed, read to [DONE] */
    LT_KIND_PLAIN,      /* not streamed: one JSON body */
    LT_KIND_DISCONNECT, /* streamed, the socket closed after a random number of events */
    LT_KIND_BAD,        /* malformed or invalid, expecting 4xx */
    LT_KIND_SLOW,       /* streamed, the request sent a few bytes at a time */
    LT_N_KIND,
};
extern const char *const lt_kind_name[LT_N_KIND];

enum lt_outcome {
    LT_OUT_DONE,        /* completed: [DONE], or a whole 200 body that parses */
    LT_OUT_CLIENT_CUT,  /* expected: a disconnect client closed the stream as planned */
    LT_OUT_SERVER_CUT,  /* expected: a slow sender cut by the server (closed, or 408) */
    LT_OUT_BAD_4XX,     /* expected: a bad request refused with 4xx */
    LT_OUT_CONNECT,     /* error: could not connect, or the request could not be sent */
    LT_OUT_NO_RESPONSE, /* error: the request went out, no status line came back */
    LT_OUT_HTTP_4XX,    /* error: a valid request answered 4xx (429 included) */
    LT_OUT_HTTP_5XX,    /* error: 5xx */
    LT_OUT_HTTP_OTHER,  /* error: any other status but 200 (and any 2xx to a bad request) */
    LT_OUT_ERROR_EVENT, /* error: the stream carried an error event */
    LT_OUT_NO_DONE,     /* lost: a 200 stream that ended without [DONE] or an error event */
    LT_OUT_BAD_BODY,    /* lost: a 200 body (or SSE event) that is cut short or not JSON */
    LT_N_OUT,
};
extern const char *const lt_outcome_name[LT_N_OUT];

static inline bool lt_outcome_is_expected(enum lt_outcome o)
{
    return o == LT_OUT_CLIENT_CUT || o == LT_OUT_SERVER_CUT || o == LT_OUT_BAD_4XX;
}
static inline bool lt_outcome_is_error(enum lt_outcome o)
{
    return o >= LT_OUT_CONNECT;
}
static inline bool lt_outcome_is_lost(enum lt_outcome o)
{
    return o == LT_OUT_NO_DONE || o == LT_OUT_BAD_BODY;
}

struct lt_opts {
    struct http_url url;
    int             concurrency;
    double          duration_s;
    long            requests;              /* > 0: stop after this many */
    double          weight[LT_N_CLASS];
    int             length[LT_N_CLASS];    /* prompt words / tokens per class */
    int             max_tokens;
    double          kind_weight[LT_N_KIND]; /* LT_KIND_SLOW unused (own threads) */
    double          completions_share;     /* share of requests sent to /v1/completions */
    bool            token_prompts;         /* prompts as token ids */
    int             vocab;                 /* token ids drawn below this */
    bool            ignore_eos;
    double          temperature;
    const char     *model;
    const char     *api_key;
    double          timeout_s;
    int             slow_clients;          /* threads sending slowly, besides concurrency */
    double          slow_pause_s;          /* between the pieces of a slow request */
    long long       max_body;              /* the server's body limit, for the oversized bad request */
    double          report_s;              /* > 0: a report line this often */
    int             server_pid;            /* > 0: its RSS in the reports */
    bool            soak;                  /* apply the soak verdict (loadtest_soak.c) */
    double          slo_ttft_ms, slo_itl_ms, max_error_rate; /* < 0: no gate */
    bool            json;
};

/* splitmix64: each client thread draws its prompts, kinds and cut points from its own. */
static inline unsigned long long lt_rand(unsigned long long *s)
{
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z                    = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z                    = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double lt_rand_unit(unsigned long long *s)
{
    return (double)(lt_rand(s) >> 11) * 0x1.0p-53;
}

struct lt_shared {
    const struct lt_opts *o;
    char                  model[256];
    double                t_start, t_end;
    pthread_mutex_t       mu;
    /* Protected by mu. */
    long                  started;   /* requests begun */
    int                   running;   /* client threads not finished */
    long                  count[LT_N_KIND][LT_N_OUT];
    long                  refused;   /* 429s */
    long                  out_tokens, prompt_tokens;
    long                  by_class[LT_N_CLASS]; /* completed requests by prompt class */
    struct lt_samples     ttft, itl, e2e;        /* the whole run */
    struct lt_samples     win_ttft, win_itl;     /* since the last report */
    struct lt_samples     q_itl[LT_N_QUARTER];   /* by quarter of --duration (soak) */
    char                  first_error[256];
};

/* A client thread: loadtest_mix.c. */
struct lt_thread {
    struct lt_shared  *sh;
    unsigned long long rng;
    bool               slow; /* a slow sender */
    pthread_t          th;
};
void *lt_client_main(void *arg);

/* loadtest_common.c: the quarter of --duration time t falls in (after the end: the last),
 * -1 with --requests. */
int  lt_quarter(const struct lt_shared *sh, double t);
/* Sums over kinds and outcomes (call with mu held or after the threads ended). */
long lt_count_outcome(const struct lt_shared *sh, enum lt_outcome o);
long lt_count_kind(const struct lt_shared *sh, enum lt_kind k);

/*
 * loadtest_soak.c: the main thread's watch while the clients run: samples the server's
 * RSS, prints a report line every --report seconds and a final one when the clients are
 * done. With --soak it prints the verdict after the final report and returns false when
 * the soak failed.
 */
struct lt_watch {
    double next_report, next_sample, sample_every;
    long   rss_kib;                    /* last sample, -1 none */
    long   rss_max_kib[LT_N_QUARTER];  /* -1: no sample in that quarter */
    bool   rss_gone;                   /* the server process disappeared */
};
void lt_watch_run(struct lt_shared *sh, struct lt_watch *w);
void lt_watch_final(struct lt_shared *sh, struct lt_watch *w);
bool lt_soak_verdict(struct lt_shared *sh, const struct lt_watch *w);

#endif
