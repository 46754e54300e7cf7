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
 * The soak verdict (--soak, which needs --duration: the run is cut into quarters by time)
 * is tools/support/soak.c's soak_judge over the RSS maxima and ITL samples per quarter and
 * the outcome counts; this file gathers them and prints one line per rule and the verdict.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "loadtest_shared.h"

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
    soak_rss_sample(w->rss_max_kib, lt_quarter(sh, now), kib);
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

bool lt_soak_verdict(struct lt_shared *sh, const struct lt_watch *w)
{
    const struct lt_opts *o  = sh->o;
    struct soak_input     in = {
            .rss_checked = o->server_pid > 0,
            .rss_gone    = w->rss_gone,
            .itl_first   = &sh->q_itl[0],
            .itl_last    = &sh->q_itl[LT_N_QUARTER - 1],
            .no_done     = lt_count_outcome(sh, LT_OUT_NO_DONE),
            .bad_body    = lt_count_outcome(sh, LT_OUT_BAD_BODY),
            .done        = lt_count_outcome(sh, LT_OUT_DONE),
    };
    memcpy(in.rss_max_kib, w->rss_max_kib, sizeof(in.rss_max_kib));
    struct soak_result r;
    soak_judge(&in, &r);

    switch (r.rss) {
    case SOAK_RSS_UNCHECKED: printf("soak rss: not checked (no --server-pid)\n"); break;
    case SOAK_RSS_GONE: printf("soak rss: FAIL: the server process %d is gone\n", o->server_pid); break;
    case SOAK_RSS_UNMEASURED: printf("soak rss: FAIL: no RSS sample in the first or the last quarter\n"); break;
    case SOAK_RSS_OK:
    case SOAK_RSS_GREW:
        printf("soak rss: max %.1f MiB in the first quarter, %.1f MiB in the last, limit %.1f MiB (+%.0f%% +%.0f MiB): "
               "%s\n",
               r.rss_first_mib, r.rss_last_mib, r.rss_limit_mib, r.rss_share * 100, r.rss_mib,
               r.rss == SOAK_RSS_OK ? "ok" : "FAIL");
        break;
    }
    printf("soak lost: %ld accepted requests lost (%ld streams without [DONE], %ld bodies cut or not JSON): %s\n",
           r.lost, in.no_done, in.bad_body, r.lost ? "FAIL" : "ok");
    if (!r.itl_measured)
        printf("soak itl: FAIL: no inter-token samples in the first or the last quarter\n");
    else
        printf("soak itl: p99 %.1f ms in the first quarter, %.1f ms in the last, limit %.1f ms (+%.0f%%): %s\n",
               r.itl_first_ms, r.itl_last_ms, r.itl_limit_ms, r.itl_drift * 100, r.itl_ok ? "ok" : "FAIL");
    if (!r.done_ok) printf("soak done: FAIL: no request completed\n");
    if (r.pass) printf("soak: PASS\n");
    else printf("soak: FAIL (%s)\n", r.reasons);
    fflush(stdout);
    return r.pass;
}
