/*
 * test_loadtest.c - `dsv4 loadtest`'s mixed load and soak mode (tools/loadtest_*.c)
 * against `dsv4 serve` on the demo model: every request ends in exactly one outcome (the
 * counts add up, by kind and in all), bad requests are answered 4xx and counted so,
 * deliberate disconnects are counted as the client's cuts, slow senders cut by the
 * server as the server's, no accepted request is lost, and soak mode prints its report
 * lines and a verdict that agrees with its rule lines and the exit status.
 *
 * Runs that check a kind's counts send that kind alone with --requests, so what is
 * checked does not depend on random draws. Nothing depends on timing either: the live
 * soak's RSS and ITL verdicts are not required to pass (a few seconds on a busy machine
 * say nothing about drift), and the slow senders pause three times longer than the
 * server's idle timeout. The verdict's rules themselves are judged on synthetic runs
 * (soak_verdict_rules: tools/support/soak.h), each of which must PASS or must FAIL for
 * the one reason it was built with: RSS growth after the warm-up, P99 ITL drift, lost
 * requests, the server gone, nothing completed.
 *
 * The staged rollout (deploy/rollout.sh, docs/DEPLOY.md "Staged rollout") runs its five
 * phases of one second each against a server on the demo model: with gates any run meets
 * it reports every phase, calls the weight hook with 1, 5, 20, 50 and 100 and exits 0; with
 * an impossible P99 TTFT in the third phase it stops there, names the phase, the gate, the
 * measured value and the limit, calls the rollback hook with them and exits 1, and the
 * fourth phase never starts; a gate on a metric the server does not export fails (closed);
 * a malformed gates file is a usage error (2).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "support/soak.h"
#include "test_cases.h"
#include "unit/test_server_util.h"

#define DEMO_MODEL "models/kjv-v4-tiny"

/* Runs `$DSV4_BIN loadtest --url ... ARGS`; the exit status, the output in *out. */
static int loadtest(struct tsrv *s, const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' loadtest --url http://127.0.0.1:%d %s", getenv("DSV4_BIN"), s->port, args);
    return test_run(cmd, out);
}

/* The JSON summary line of a --json run (stderr lines may come before it). */
static json_t *summary_json(const char *out)
{
    for (const char *p = out; p && *p;) {
        if (*p == '{') return json_loadb(p, strcspn(p, "\n"), 0, NULL);
        p = strchr(p, '\n');
        if (p) p++;
    }
    return NULL;
}

static long jcount(json_t *summary, const char *kind, const char *outcome)
{
    return (long)json_integer_value(json_object_get(json_object_get(json_object_get(summary, "by_kind"), kind), outcome));
}

/* The sum of a kind's outcomes (all kinds when kind is NULL). */
static long jsum(json_t *summary, const char *kind)
{
    json_t     *m = kind ? json_object_get(json_object_get(summary, "by_kind"), kind)
                         : json_object_get(summary, "outcomes");
    const char *k;
    json_t     *v;
    long        n = 0;
    json_object_foreach(m, k, v) n += (long)json_integer_value(v);
    return n;
}

/* A kind's errors: its outcomes other than done and the expected ones. */
static long jerrors(json_t *summary, const char *kind)
{
    return jsum(summary, kind) - jcount(summary, kind, "done") - jcount(summary, kind, "client_cut") -
           jcount(summary, kind, "server_cut") - jcount(summary, kind, "bad_4xx");
}

static bool start_demo(struct test_ctx *t, struct tsrv *s, const char *args)
{
    if (!getenv("DSV4_BIN")) {
        test_skip(t, TEST_SKIP_MISSING, "DSV4_BIN not set (run through make test)");
        return false;
    }
    return tsrv_start(t, s, DEMO_MODEL, args);
}

/* Bad requests alone, then disconnects alone, then streamed and plain on both endpoints. */
static void test_kinds_counted(struct test_ctx *t)
{
    struct tsrv s;
    if (!start_demo(t, &s, "--max-seqs 4")) return;
    char   *out = NULL;
    int     rc  = loadtest(&s, "--json --kinds bad:1 --completions-share 0.5 --requests 40 --concurrency 2", &out);
    json_t *j   = summary_json(out);
    CHECKF(j != NULL, "no JSON summary from loadtest (status %d): %.400s", rc, out);
    /* Nothing completed (bad requests only), so the gate fails: 1, not a usage error. */
    CHECKF(rc == 1, "loadtest with bad requests only exited %d", rc);
    CHECKF(jcount(j, "bad", "bad_4xx") == 40, "%ld of 40 bad requests counted as 4xx: %.600s",
           jcount(j, "bad", "bad_4xx"), out);
    CHECK(jsum(j, NULL) == 40 && jsum(j, "bad") == 40);
    CHECK(json_integer_value(json_object_get(j, "errors")) == 0);
    json_decref(j);
    free(out);

    /* A disconnect hangs up after at most max_tokens/2 events, long before [DONE]. */
    rc = loadtest(&s, "--json --kinds disconnect:1 --requests 4 --concurrency 2 --max-tokens 32", &out);
    j  = summary_json(out);
    CHECKF(j != NULL, "no JSON summary from loadtest (status %d): %.400s", rc, out);
    CHECKF(jcount(j, "disconnect", "client_cut") == 4, "%ld of 4 disconnects counted as client cuts: %.600s",
           jcount(j, "disconnect", "client_cut"), out);
    CHECK(jsum(j, NULL) == 4 && jerrors(j, "disconnect") == 0);
    json_decref(j);
    free(out);

    rc = loadtest(&s, "--json --kinds stream:1,plain:1 --completions-share 0.5 --requests 8 --concurrency 2 "
                      "--max-tokens 8",
                  &out);
    j  = summary_json(out);
    CHECKF(j != NULL, "no JSON summary from loadtest (status %d): %.400s", rc, out);
    CHECKF(rc == 0, "loadtest of streamed and plain requests exited %d: %.600s", rc, out);
    long done = jcount(j, "stream", "done") + jcount(j, "plain", "done");
    CHECKF(done == 8, "%ld of 8 streamed and plain requests done: %.600s", done, out);
    CHECK(jsum(j, NULL) == 8 && json_integer_value(json_object_get(j, "ok")) == 8);
    json_decref(j);
    free(out);
    CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
}

/* The number after " key=" in line; NAN if absent or "-". */
static double field(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof(pat), " %s=", key);
    const char *p = strstr(line, pat);
    if (!p) return NAN;
    p += strlen(pat);
    char  *end;
    double v = strtod(p, &end);
    return end == p ? NAN : v;
}

static const char *const OUTCOMES[] = {
    "done",     "client_cut", "server_cut",  "bad_4xx",  "connect", "no_response",
    "http_4xx", "http_5xx",   "http_other", "error_event", "no_done", "bad_body",
};

/* A report line's requests= equals the sum of its outcomes; lost= of the two lost ones. */
static void check_report_line(struct test_ctx *t, const char *line)
{
    double sum = 0;
    for (size_t k = 0; k < sizeof(OUTCOMES) / sizeof(OUTCOMES[0]); k++) {
        double v = field(line, OUTCOMES[k]);
        CHECKF(!isnan(v), "report line without %s=: %s", OUTCOMES[k], line);
        if (!isnan(v)) sum += v;
    }
    CHECKF(field(line, "requests") == sum, "requests= is not the sum of the outcomes: %s", line);
    CHECKF(field(line, "lost") == field(line, "no_done") + field(line, "bad_body"), "lost= is off: %s", line);
    CHECKF(field(line, "lost") == 0, "a request was lost: %s", line);
    CHECKF(field(line, "rss_mib") > 0, "no server RSS in: %s", line);
    CHECKF(!isnan(field(line, "kv_used")) && !isnan(field(line, "kv_free")) && !isnan(field(line, "kv_cached")) &&
               !isnan(field(line, "kv_frag")),
           "no KV pool figures in: %s", line);
}

/* The summary's row for a kind: "NAME SENT DONE EXPECTED ERRORS"; false if absent. */
static bool kind_row(const char *out, const char *kind, long v[4])
{
    char pat[32];
    snprintf(pat, sizeof(pat), "\n%s ", kind);
    const char *p = strstr(out, pat);
    return p && sscanf(p + strlen(pat), "%ld %ld %ld %ld", &v[0], &v[1], &v[2], &v[3]) == 4;
}

static void test_soak_reports(struct test_ctx *t)
{
    struct tsrv s;
    if (!start_demo(t, &s, "--max-seqs 4")) return;
    char args[512], *out = NULL;
    snprintf(args, sizeof(args),
             "--soak --duration 5 --report 2 --server-pid %d --concurrency 3 --max-tokens 16 --lengths long=128 "
             "--slow-clients 1 --slow-pause 5",
             (int)s.pid);
    int rc = loadtest(&s, args, &out);
    CHECKF(rc == 0 || rc == 1, "loadtest --soak exited %d: %.600s", rc, out);
    int    n_report = 0, n_final = 0;
    double final_requests = NAN;
    for (const char *p = out; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t      n  = nl ? (size_t)(nl - p) : strlen(p);
        char        line[2048];
        snprintf(line, sizeof(line), "%.*s", (int)n, p);
        p = nl ? nl + 1 : NULL;
        bool is_report = !strncmp(line, "report t_s=", 11), is_final = !strncmp(line, "final t_s=", 10);
        if (!is_report && !is_final) continue;
        n_report += is_report;
        n_final += is_final;
        check_report_line(t, line);
        if (is_final) final_requests = field(line, "requests");
    }
    CHECKF(n_report >= 2 && n_final == 1, "%d report lines and %d final ones (want >= 2 and 1)", n_report, n_final);
    CHECKF(final_requests > 0, "the final report counts no requests");

    /* The summary's rows by kind add up to the final report's requests. */
    static const char *const kinds[] = { "stream", "plain", "disconnect", "bad", "slow" };
    long                     total   = 0, v[4];
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        bool found = kind_row(out, kinds[k], v);
        CHECKF(found, "no row for kind %s in the summary: %.800s", kinds[k], out);
        if (!found) continue;
        CHECKF(v[0] == v[1] + v[2] + v[3], "kind %s: sent %ld != done %ld + expected %ld + errors %ld", kinds[k], v[0],
               v[1], v[2], v[3]);
        total += v[0];
    }
    CHECKF(final_requests == (double)total, "the kinds add up to %ld, the final report says %.0f", total,
           final_requests);
    CHECKF(strstr(out, "\nsoak rss: ") && strstr(out, "\nsoak lost: 0 ") && strstr(out, "\nsoak itl: "),
           "soak verdict lines missing (or requests lost): %.1200s", out);
    bool pass = strstr(out, "\nsoak: PASS\n") != NULL, fail = strstr(out, "\nsoak: FAIL (") != NULL;
    CHECKF(pass != fail, "no soak verdict, or two: %.1200s", out);
    /* the verdict is what its rule lines say, and a failed soak fails the run */
    bool rule_failed = strstr(out, ": FAIL\n") || strstr(out, ": FAIL: ");
    CHECKF(pass == !rule_failed, "soak verdict %s, rule lines %s: %.1200s", pass ? "PASS" : "FAIL",
           rule_failed ? "with a FAIL" : "all ok", out);
    CHECKF(!fail || rc == 1, "a failed soak exited %d", rc);
    free(out);
    CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
}

/* ------------------------------------------------------------------ the soak verdict */

/* A synthetic soak run, sampled as loadtest samples one: RSS once per 1/400 of the run
 * (MiB: rss0 at the start, rising linearly to rss_warm at the end of the warm-up quarter,
 * then linearly to rss_end), and 4000 inter-token gaps spread evenly over it (a base
 * that is itl0 in the first quarter and itl_end in the last, linear between, times 1 to
 * 1.49 so the P99 sits in a spread), and the outcome counts. */
struct synth_run {
    const char *name;
    double      rss0, rss_warm, rss_end;
    double      itl0, itl_end;            /* ms */
    bool        no_pid, gone, no_late_rss;
    long        no_done, bad_body, done;
    const char *reasons;                  /* what soak_judge must say: "" for a PASS */
};

static double synth_rss_mib(const struct synth_run *r, double t, int i)
{
    double v = t < 0.25 ? r->rss0 + (r->rss_warm - r->rss0) * t / 0.25
                        : r->rss_warm + (r->rss_end - r->rss_warm) * (t - 0.25) / 0.75;
    return v + 0.25 * (double)(i * 7 % 5 - 2); /* +-0.5 MiB of allocator noise */
}

static double synth_itl_ms(const struct synth_run *r, double t, int i)
{
    double base = t < 0.25 ? r->itl0 : t >= 0.75 ? r->itl_end : r->itl0 + (r->itl_end - r->itl0) * (t - 0.25) / 0.5;
    return base * (1 + 0.01 * (double)(i % 50));
}

/* Judges the run; the ITL samples are freed. */
static void synth_judge(const struct synth_run *r, struct soak_result *res)
{
    enum { N_RSS = 400, N_ITL = 4000 };
    struct lt_samples q_itl[LT_N_QUARTER] = { { 0 } };
    struct soak_input in = { .rss_checked = !r->no_pid, .rss_gone = r->gone, .no_done = r->no_done,
                             .bad_body = r->bad_body, .done = r->done };
    for (int q = 0; q < LT_N_QUARTER; q++) in.rss_max_kib[q] = -1;
    for (int i = 0; i < N_RSS; i++) {
        double t = (double)i / N_RSS;
        if (r->no_late_rss && t >= 0.75) break;
        soak_rss_sample(in.rss_max_kib, soak_quarter(t), (long)(synth_rss_mib(r, t, i) * 1024));
    }
    for (int i = 0; i < N_ITL; i++) {
        double t = (double)i / N_ITL;
        lt_samples_add(&q_itl[soak_quarter(t)], synth_itl_ms(r, t, i) / 1e3);
    }
    in.itl_first = &q_itl[0];
    in.itl_last  = &q_itl[LT_N_QUARTER - 1];
    soak_judge(&in, res);
    for (int q = 0; q < LT_N_QUARTER; q++) free(q_itl[q].v);
}

static void test_soak_verdict_rules(struct test_ctx *t)
{
    /* The margins: RSS may end 5% + 8 MiB above the warm-up's peak (300 MiB -> ~321 MiB),
     * P99 ITL 20% above the first quarter's. */
    static const struct synth_run runs[] = {
        { "flat after a steep warm-up", 100, 300, 300, 50, 50, false, false, false, 0, 0, 500, "" },
        { "growth and drift inside the margins", 100, 300, 312, 50, 58, false, false, false, 0, 0, 500, "" },
        { "a faster first quarter only", 100, 300, 300, 60, 50, false, false, false, 0, 0, 500, "" },
        { "a leak without --server-pid is not judged", 100, 300, 900, 50, 50, true, false, false, 0, 0, 500, "" },
        { "RSS grows after the warm-up", 100, 300, 340, 50, 50, false, false, false, 0, 0, 500, "rss grew" },
        { "a slow leak just past the margin", 100, 300, 330, 50, 50, false, false, false, 0, 0, 500, "rss grew" },
        { "P99 ITL drifts", 100, 300, 300, 50, 65, false, false, false, 0, 0, 500, "itl p99 drifted" },
        { "a stream lost", 100, 300, 300, 50, 50, false, false, false, 1, 0, 500, "lost requests" },
        { "a body lost", 100, 300, 300, 50, 50, false, false, false, 0, 1, 500, "lost requests" },
        { "the server gone", 100, 300, 300, 50, 50, false, true, false, 0, 0, 500, "server gone" },
        { "no RSS in the last quarter", 100, 300, 300, 50, 50, false, false, true, 0, 0, 500, "rss not measured" },
        { "nothing completed", 100, 300, 300, 50, 50, false, false, false, 0, 0, 0, "nothing completed" },
        { "every drift at once", 100, 300, 400, 50, 80, false, false, false, 2, 1, 500,
          "rss grew, lost requests, itl p99 drifted" },
    };
    for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
        const struct synth_run *r = &runs[k];
        struct soak_result      res;
        synth_judge(r, &res);
        bool want_pass = !r->reasons[0];
        CHECKF(res.pass == want_pass && !strcmp(res.reasons, r->reasons),
               "%s: %s (%s), expected %s (%s); rss %.1f -> %.1f MiB (limit %.1f), itl p99 %.1f -> %.1f ms (limit %.1f)",
               r->name, res.pass ? "PASS" : "FAIL", res.reasons, want_pass ? "PASS" : "FAIL", r->reasons,
               res.rss_first_mib, res.rss_last_mib, res.rss_limit_mib, res.itl_first_ms, res.itl_last_ms,
               res.itl_limit_ms);
    }
    /* ITL samples only in the middle quarters: not measured */
    struct lt_samples empty = { 0 }, some = { 0 };
    lt_samples_add(&some, 0.05);
    struct soak_input  in = { .rss_checked = false, .itl_first = &some, .itl_last = &empty, .done = 1 };
    struct soak_result res;
    soak_judge(&in, &res);
    CHECKF(!res.pass && !res.itl_measured && !strcmp(res.reasons, "itl not measured"), "no late ITL: %s",
           res.reasons);
    free(some.v);
    /* quarters: clamped at both ends; an RSS sample outside any quarter (--requests) ignored */
    CHECK(soak_quarter(-0.1) == 0 && soak_quarter(0.2499) == 0 && soak_quarter(0.25) == 1 && soak_quarter(0.99) == 3 &&
          soak_quarter(1.5) == 3);
    long mx[LT_N_QUARTER] = { -1, -1, -1, -1 };
    soak_rss_sample(mx, -1, 100);
    soak_rss_sample(mx, 2, 100);
    soak_rss_sample(mx, 2, 50);
    CHECK(mx[0] == -1 && mx[1] == -1 && mx[2] == 100 && mx[3] == -1);
}

/* Slow senders pausing longer than the server's idle timeout are cut by it: expected. */
static void test_slow_cut_expected(struct test_ctx *t)
{
    struct tsrv s;
    if (!start_demo(t, &s, "--max-seqs 2 --idle-timeout 1")) return;
    char   *out = NULL;
    int     rc  = loadtest(&s, "--json --kinds plain:1 --max-tokens 2 --concurrency 1 --slow-clients 2 --slow-pause 3000 "
                               "--duration 3",
                           &out);
    json_t *j   = summary_json(out);
    CHECKF(j != NULL, "no JSON summary from loadtest (status %d): %.400s", rc, out);
    long cut = jcount(j, "slow", "server_cut");
    CHECKF(cut >= 2 && cut == jsum(j, "slow"), "slow senders: %ld cut by the server of %ld: %.600s", cut,
           jsum(j, "slow"), out);
    CHECK(jerrors(j, "slow") == 0);
    json_decref(j);
    free(out);
    CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
}

/* ------------------------------------------------------------------ staged rollout */

/* Writes the five phases of a gates file: one second each, limits any run meets, except
 * phase fail_phase (1-based; 0 = none), whose P99 TTFT limit is 0.001 ms; rss: every
 * phase's max_rss_mb ("-": none). */
static bool write_gates(const char *path, int fail_phase, const char *rss)
{
    static const int pct[5] = { 1, 5, 20, 50, 100 };
    FILE            *f      = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "# percent duration_s concurrency p99_ttft_ms p99_itl_ms max_error_rate min_pass_rate "
               "max_server_errors max_rss_mb\n");
    for (int i = 0; i < 5; i++)
        fprintf(f, "%d 1 2 %s 60000 0.005 0.995 0 %s\n", pct[i], i + 1 == fail_phase ? "0.001" : "60000", rss);
    return fclose(f) == 0;
}

/* Runs deploy/rollout.sh against s with the gates file and more options; the hooks append
 * to files in tmpdir. */
static int rollout(struct test_ctx *t, struct tsrv *s, const char *gates, const char *more, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "rm -f %1$s/weights %1$s/rollback; sh deploy/rollout.sh --url http://127.0.0.1:%2$d --gates %3$s "
             "--dsv4 '%4$s' --set-weight 'echo >>%1$s/weights' --rollback 'echo >>%1$s/rollback' %5$s -- --max-tokens 4",
             t->tmpdir, s->port, gates, getenv("DSV4_BIN"), more);
    return test_run(cmd, out);
}

/* The hook's calls, one per line, joined with '|'. */
static void hook_calls(struct test_ctx *t, const char *name, char *buf, size_t cap)
{
    char path[512], line[128];
    snprintf(path, sizeof(path), "%s/%s", t->tmpdir, name);
    buf[0]  = '\0';
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s", buf[0] ? "|" : "", line);
    }
    if (f) fclose(f);
}

static void test_rollout_phases(struct test_ctx *t)
{
    if (test_run("command -v curl", NULL) != 0) {
        test_skip(t, TEST_SKIP_MISSING, "needs curl, which deploy/rollout.sh reads /metrics with (apt-get install curl)");
        return;
    }
    struct tsrv s;
    if (!start_demo(t, &s, "--max-seqs 4")) return;
    char gates[512], calls[256], *out = NULL;
    snprintf(gates, sizeof(gates), "%s/gates", t->tmpdir);

    CHECK(write_gates(gates, 0, "-"));
    int rc = rollout(t, &s, gates, "", &out);
    CHECKF(rc == 0, "rollout with passable gates: exit %d: %.2000s", rc, out);
    CHECKF(out && strstr(out, "phase 1/5 (1%) passed") && strstr(out, "phase 5/5 (100%) passed") &&
               strstr(out, "rollout: PASS: all 5 phases passed"),
           "passing rollout output: %.2000s", out);
    hook_calls(t, "weights", calls, sizeof(calls));
    CHECKF(!strcmp(calls, "1|5|20|50|100"), "set-weight hook calls: %s", calls);
    hook_calls(t, "rollback", calls, sizeof(calls));
    CHECKF(!calls[0], "rollback hook called on a passing rollout: %s", calls);
    free(out);

    CHECK(write_gates(gates, 3, "-"));
    rc = rollout(t, &s, gates, "", &out);
    CHECKF(rc == 1, "rollout with an impossible phase-3 gate: exit %d: %.2000s", rc, out);
    const char *at = out ? strstr(out, "rollout: FAIL at phase 3/5 (20%): gate p99_ttft_ms: measured ") : NULL;
    CHECKF(at && strstr(at, ", limit <= 0.001"), "failing rollout output: %.2000s", out);
    CHECKF(out && strstr(out, "phase 2/5 (5%) passed") && !strstr(out, "phase 4/5"), "phases run: %.2000s", out);
    hook_calls(t, "weights", calls, sizeof(calls));
    CHECKF(!strcmp(calls, "1|5|20"), "set-weight hook calls: %s", calls);
    hook_calls(t, "rollback", calls, sizeof(calls));
    CHECKF(!strcmp(calls, "3 20 p99_ttft_ms"), "rollback hook calls: %s", calls);
    free(out);

    /* a gate on a metric the server does not export fails closed, in the first phase */
    CHECK(write_gates(gates, 0, "100000"));
    rc = rollout(t, &s, gates, "--rss-metric dsv4_no_such_metric", &out);
    CHECKF(rc == 1 && out && strstr(out, "FAIL at phase 1/5 (1%): gate max_rss_mb: measured -, limit <= 100000"),
           "RSS gate without the metric: exit %d: %.2000s", rc, out);
    free(out);

    FILE *f = fopen(gates, "w");
    CHECK(f && fputs("1 1 2\n", f) >= 0 && fclose(f) == 0);
    rc = rollout(t, &s, gates, "", &out);
    CHECKF(rc == 2 && out && strstr(out, "needs 9 fields"), "short gates line: exit %d: %.600s", rc, out);
    free(out);
    CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
}

const struct test_case test_group_loadtest[] = {
    { "kinds_counted", test_kinds_counted },
    { "soak_reports", test_soak_reports },
    { "soak_verdict_rules", test_soak_verdict_rules },
    { "slow_cut_expected", test_slow_cut_expected },
    { "rollout_phases", test_rollout_phases },
    { NULL, NULL },
};
