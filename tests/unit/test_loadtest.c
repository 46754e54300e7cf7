/*
 * test_loadtest.c - `dsv4 loadtest`'s mixed load and soak mode (tools/loadtest_*.c)
 * against `dsv4 serve` on the demo model: every request ends in exactly one outcome (the
 * counts add up, by kind and in all), bad requests are answered 4xx and counted so,
 * deliberate disconnects are counted as the client's cuts, slow senders cut by the
 * server as the server's, no accepted request is lost, and soak mode prints its report
 * lines and verdict.
 *
 * Runs that check a kind's counts send that kind alone with --requests, so what is
 * checked does not depend on random draws. Nothing depends on timing either: the soak's
 * RSS and ITL verdicts are read but whether they pass is not checked (a few seconds on a
 * busy machine say nothing about drift), and the slow senders pause three times longer
 * than the server's idle timeout.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

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
    CHECKF(strstr(out, "\nsoak: PASS") || strstr(out, "\nsoak: FAIL ("), "no soak verdict: %.1200s", out);
    free(out);
    CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
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

const struct test_case test_group_loadtest[] = {
    { "kinds_counted", test_kinds_counted },
    { "soak_reports", test_soak_reports },
    { "slow_cut_expected", test_slow_cut_expected },
    { NULL, NULL },
};
