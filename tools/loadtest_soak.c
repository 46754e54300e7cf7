/*
 * loadtest_soak.c - what the main thread of `dsv4 loadtest` does while the clients run:
 * it samples the server's resident memory (--server-pid: VmRSS of /proc/PID/status), and
 * every --report seconds prints one line with the elapsed time, the RSS, the KV pool's
 * occupancy and fragmentation (scraped from the server's /metrics), P50/P99 TTFT and ITL
 * of the window since the previous line, and the requests finished since the start by
 * outcome; a final line when the clients are done. With --soak it then judges the run.
 *
 * A report line is key=value pairs, so scripts and tests can read it:
 *   report t_s=180.0 rss_mib=50.5 kv_used=38 kv_free=90 kv_cached=32 kv_frag=0.088
 *   ttft_p50_ms=2274.3 ttft_p99_ms=14262.8 itl_p50_ms=57.2 itl_p99_ms=129.2 requests=263
 *   errors=0 lost=0 done=198 client_cut=29 ... (every outcome of loadtest_shared.h)
 * A value that could not be measured (no server PID, no /metrics, no samples) reads "-".
 *
 * The soak verdict (--soak, which needs --duration: the run is cut into quarters by time):
 *   rss   the largest RSS sampled in the last quarter must not exceed the largest in the
 *         first quarter by more than RSS_GROWTH_SHARE + RSS_GROWTH_MIB (see there), and
 *         the server process must not disappear;
 *   lost  no accepted request lost (loadtest_shared.h: a 200 stream without [DONE] and
 *         without an error event, or a 200 body cut short or not JSON; the client's own
 *         cuts excluded);
 *   itl   P99 inter-token latency of the last quarter at most ITL_DRIFT above the first
 *         quarter's;
 *   and at least one request completed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "loadtest_shared.h"

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

int lt_quarter(const struct lt_shared *sh, double t)
{
    const struct lt_opts *o = sh->o;
    if (o->requests > 0) return -1;
    double f = (t - sh->t_start) / o->duration_s;
    int    q = (int)(f * LT_N_QUARTER);
    return q < 0 ? 0 : q >= LT_N_QUARTER ? LT_N_QUARTER - 1 : q;
}

/* ------------------------------------------------------------------ measurements */

/* VmRSS of the process in KiB; -1 when it is gone (a zombie has no VmRSS line). */
static long read_rss_kib(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static void sample_rss(struct lt_shared *sh, struct lt_watch *w, double now)
{
    if (sh->o->server_pid <= 0) return;
    long kib = read_rss_kib(sh->o->server_pid);
    if (kib < 0) {
        w->rss_gone = true;
        w->rss_kib  = -1;
        return;
    }
    w->rss_kib = kib;
    int q      = lt_quarter(sh, now);
    if (q >= 0 && kib > w->rss_max_kib[q]) w->rss_max_kib[q] = kib;
}

/* The value of an unlabelled sample `name VALUE` in Prometheus text; NAN if absent. */
static double prom_value(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, name, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return NAN;
}

enum { KV_USED, KV_FREE, KV_CACHED, KV_FRAG, N_KV };

static void scrape_kv(const struct lt_shared *sh, double kv[N_KV])
{
    static const char *const names[N_KV] = { "dsv4_kv_pages_used", "dsv4_kv_pages_free", "dsv4_kv_pages_cached",
                                             "dsv4_kv_fragmentation_ratio" };
    const struct lt_opts    *o           = sh->o;
    char                     path[600], err[256], *body = NULL;
    snprintf(path, sizeof(path), "%s/metrics", o->url.path);
    int st = http_request(o->url.host, o->url.port, "GET", path, NULL, NULL, &body, NULL, 10, err, sizeof(err));
    for (int k = 0; k < N_KV; k++) kv[k] = st == 200 && body ? prom_value(body, names[k]) : NAN;
    free(body);
}

/* ------------------------------------------------------------------ reports */

/* v with prec decimals, or "-" when it is not a number. */
static const char *num(char *buf, size_t cap, int prec, double v)
{
    if (isnan(v)) snprintf(buf, cap, "-");
    else snprintf(buf, cap, "%.*f", prec, v);
    return buf;
}

static void report(struct lt_shared *sh, struct lt_watch *w, const char *label, double now)
{
    double kv[N_KV];
    scrape_kv(sh, kv);
    struct lt_samples ttft, itl;
    long              by_out[LT_N_OUT];
    pthread_mutex_lock(&sh->mu);
    ttft = sh->win_ttft;
    itl  = sh->win_itl;
    memset(&sh->win_ttft, 0, sizeof(sh->win_ttft));
    memset(&sh->win_itl, 0, sizeof(sh->win_itl));
    for (int o = 0; o < LT_N_OUT; o++) by_out[o] = lt_count_outcome(sh, (enum lt_outcome)o);
    pthread_mutex_unlock(&sh->mu);

    long total = 0, errors = 0, lost = 0;
    for (int o = 0; o < LT_N_OUT; o++) {
        total += by_out[o];
        if (lt_outcome_is_error((enum lt_outcome)o)) errors += by_out[o];
        if (lt_outcome_is_lost((enum lt_outcome)o)) lost += by_out[o];
    }
    char b[9][32];
    printf("%s t_s=%.1f rss_mib=%s kv_used=%s kv_free=%s kv_cached=%s kv_frag=%s ttft_p50_ms=%s ttft_p99_ms=%s "
           "itl_p50_ms=%s itl_p99_ms=%s requests=%ld errors=%ld lost=%ld",
           label, now - sh->t_start, num(b[0], 32, 1, w->rss_kib < 0 ? NAN : (double)w->rss_kib / 1024),
           num(b[1], 32, 0, kv[KV_USED]), num(b[2], 32, 0, kv[KV_FREE]), num(b[3], 32, 0, kv[KV_CACHED]),
           num(b[4], 32, 3, kv[KV_FRAG]), num(b[5], 32, 1, lt_samples_pct_ms(&ttft, 50)),
           num(b[6], 32, 1, lt_samples_pct_ms(&ttft, 99)), num(b[7], 32, 1, lt_samples_pct_ms(&itl, 50)),
           num(b[8], 32, 1, lt_samples_pct_ms(&itl, 99)), total, errors, lost);
    for (int o = 0; o < LT_N_OUT; o++) printf(" %s=%ld", lt_outcome_name[o], by_out[o]);
    printf("\n");
    fflush(stdout);
    free(ttft.v);
    free(itl.v);
}

void lt_watch_run(struct lt_shared *sh, struct lt_watch *w)
{
    const struct lt_opts *o = sh->o;
    memset(w, 0, sizeof(*w));
    w->rss_kib = -1;
    for (int q = 0; q < LT_N_QUARTER; q++) w->rss_max_kib[q] = -1;
    /* Often enough that each quarter of a short run has samples of its own. */
    w->sample_every = o->requests > 0 || o->duration_s >= 20 ? 1.0 : o->duration_s / 20;
    w->next_sample  = sh->t_start;
    w->next_report  = o->report_s > 0 ? sh->t_start + o->report_s : INFINITY;
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        int running = sh->running;
        pthread_mutex_unlock(&sh->mu);
        if (!running) break;
        double now = cli_now();
        if (now >= w->next_sample) {
            sample_rss(sh, w, now);
            w->next_sample += w->sample_every;
        }
        if (now >= w->next_report) {
            /* After --duration only the final line: the clients just finish what they began. */
            if (o->requests > 0 || now < sh->t_end + 1) report(sh, w, "report", now);
            w->next_report += o->report_s;
        }
        /* Polled rather than signalled: a tenth of a second late is nothing here. */
        double wait = fmin(fmin(w->next_sample, w->next_report) - cli_now(), 0.1);
        if (wait > 0) {
            struct timespec ts = { 0, (long)(wait * 1e9) };
            nanosleep(&ts, NULL);
        }
    }
}

void lt_watch_final(struct lt_shared *sh, struct lt_watch *w)
{
    double now = cli_now();
    sample_rss(sh, w, now);
    if (sh->o->report_s > 0 || sh->o->soak) report(sh, w, "final", now);
}

/* ------------------------------------------------------------------ verdict */

/* Appends why to the comma-separated list of failed rules. */
static void failed(char *reasons, size_t cap, const char *why)
{
    size_t n = strlen(reasons);
    snprintf(reasons + n, cap - n, "%s%s", n ? ", " : "", why);
}

bool lt_soak_verdict(struct lt_shared *sh, const struct lt_watch *w)
{
    const struct lt_opts *o = sh->o;
    char                  reasons[256] = "";

    long first = w->rss_max_kib[0], last = w->rss_max_kib[LT_N_QUARTER - 1];
    if (o->server_pid <= 0) {
        printf("soak rss: not checked (no --server-pid)\n");
    } else if (w->rss_gone) {
        printf("soak rss: FAIL: the server process %d is gone\n", o->server_pid);
        failed(reasons, sizeof(reasons), "server gone");
    } else if (first < 0 || last < 0) {
        printf("soak rss: FAIL: no RSS sample in the first or the last quarter\n");
        failed(reasons, sizeof(reasons), "rss not measured");
    } else {
        double limit = (double)first / 1024 * (1 + RSS_GROWTH_SHARE) + RSS_GROWTH_MIB;
        bool   ok    = (double)last / 1024 <= limit;
        printf("soak rss: max %.1f MiB in the first quarter, %.1f MiB in the last, limit %.1f MiB (+%.0f%% +%.0f MiB): "
               "%s\n",
               (double)first / 1024, (double)last / 1024, limit, RSS_GROWTH_SHARE * 100, RSS_GROWTH_MIB,
               ok ? "ok" : "FAIL");
        if (!ok) failed(reasons, sizeof(reasons), "rss grew");
    }

    long no_done = lt_count_outcome(sh, LT_OUT_NO_DONE), bad_body = lt_count_outcome(sh, LT_OUT_BAD_BODY);
    printf("soak lost: %ld accepted requests lost (%ld streams without [DONE], %ld bodies cut or not JSON): %s\n",
           no_done + bad_body, no_done, bad_body, no_done + bad_body ? "FAIL" : "ok");
    if (no_done + bad_body) failed(reasons, sizeof(reasons), "lost requests");

    struct lt_samples q0 = sh->q_itl[0], q3 = sh->q_itl[LT_N_QUARTER - 1];
    double            p0 = lt_samples_pct_ms(&q0, 99), p3 = lt_samples_pct_ms(&q3, 99);
    if (isnan(p0) || isnan(p3)) {
        printf("soak itl: FAIL: no inter-token samples in the first or the last quarter\n");
        failed(reasons, sizeof(reasons), "itl not measured");
    } else {
        double limit = p0 * (1 + ITL_DRIFT);
        bool   ok    = p3 <= limit;
        printf("soak itl: p99 %.1f ms in the first quarter, %.1f ms in the last, limit %.1f ms (+%.0f%%): %s\n", p0, p3,
               limit, ITL_DRIFT * 100, ok ? "ok" : "FAIL");
        if (!ok) failed(reasons, sizeof(reasons), "itl p99 drifted");
    }

    if (lt_count_outcome(sh, LT_OUT_DONE) == 0) {
        printf("soak done: FAIL: no request completed\n");
        failed(reasons, sizeof(reasons), "nothing completed");
    }
    if (reasons[0]) printf("soak: FAIL (%s)\n", reasons);
    else printf("soak: PASS\n");
    fflush(stdout);
    return !reasons[0];
}
