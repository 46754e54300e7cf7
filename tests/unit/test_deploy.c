/*
 * test_deploy.c - deploy/ checked against the things it describes (docs/DEPLOY.md):
 *   - every Kubernetes manifest parses and validates against the API schema of its kind
 *     (tests/deploy/check.mjs with kubernetes-models), and a manifest with a wrong type fails;
 *   - the Deployment's timing lets a drain finish (grace period above preStop + drain, liveness
 *     tolerant of a drain, an hour for loading), and a shorter grace period fails;
 *   - the systemd unit passes `systemd-analyze verify` without a warning (ExecStart pointed at
 *     the built binary), its TimeoutStopSec is above the drain of dsv4.env, and a unit with a
 *     misspelt option is caught;
 *   - every alert rule is complete (expr, for, severity, summary, description);
 *   - every metric the alert rules and the Grafana dashboard name is a series of a running
 *     `dsv4 serve`'s /metrics (the demo model, after one request so histograms have samples),
 *     and a rule naming a metric that does not exist fails the check.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_cases.h"
#include "test_server_util.h"

#define CHECKER    "node tests/deploy/check.mjs"
#define ALERTS     "deploy/prometheus/alerts.yml"
#define DASHBOARD  "deploy/grafana/dsv4.json"
#define UNIT       "deploy/systemd/dsv4.service"
#define DEMO_MODEL "models/kjv-v4-tiny"

/* Runs cmd, which should succeed (ok) or fail, saying want either way: true when it did;
 * otherwise its output is printed under the test. */
static bool run_expect(const char *cmd, bool ok, const char *want)
{
    char *out  = NULL;
    int   st   = test_run(cmd, &out);
    bool  pass = (st == 0) == ok && out && strstr(out, want);
    if (!pass) printf("    %s (exit %d, want %s):\n%s\n", cmd, st, ok ? "0" : "non-zero", out ? out : "(no output)");
    free(out);
    return pass;
}

static void test_manifests(struct test_ctx *t)
{
    CHECK(run_expect(CHECKER " k8s deploy/k8s/*.yaml", true, "Kubernetes objects valid"));
    /* the check can fail: a Deployment whose replicas is a string */
    char bad[512], cmd[700];
    snprintf(bad, sizeof(bad), "%s/bad-deployment.yaml", t->tmpdir);
    static const char BAD[] = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n"
                              "spec:\n  replicas: three\n  selector: {matchLabels: {a: b}}\n"
                              "  template:\n    metadata: {labels: {a: b}}\n"
                              "    spec: {containers: [{name: c, image: i}]}\n";
    CHECK(test_write_file(bad, BAD, sizeof(BAD) - 1) == 0);
    snprintf(cmd, sizeof(cmd), CHECKER " k8s %s", bad);
    CHECKF(run_expect(cmd, false, "spec/replicas must be integer"),
           "a Deployment with replicas: three passed the schema check");
    /* and the drain arithmetic: a grace period shorter than the drain */
    snprintf(bad, sizeof(bad), "%s/short-grace.yaml", t->tmpdir);
    snprintf(cmd, sizeof(cmd),
             "sed 's/terminationGracePeriodSeconds: [0-9]*/terminationGracePeriodSeconds: 10/' deploy/k8s/deployment.yaml > %s",
             bad);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof(cmd), CHECKER " k8s %s", bad);
    CHECKF(run_expect(cmd, false, "terminationGracePeriodSeconds 10 <= preStop"),
           "a Deployment killed before its drain ends passed the timing check");
}

static void test_alert_rules(struct test_ctx *t)
{
    CHECK(run_expect(CHECKER " rules " ALERTS, true, "rules complete"));
}

/* The number after "KEY=" (or "KEY" then "=") on a line of text starting with key; -1 if none. */
static double setting(const char *text, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, key, n) && p[n] == '=') return atof(p + n + 1);
    return -1;
}

static bool on_path(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* A copy of the unit with ExecStart's binary at the build's dsv4 (verify checks it exists),
 * plus extra lines at the end of [Install]; 0 on success. */
static int write_unit(struct test_ctx *t, const char *path, const char *extra)
{
    char  *unit = test_read_file(UNIT, NULL);
    char   bin[4096];
    const char *env = getenv("DSV4_BIN");
    CHECKF(env && realpath(env, bin), "DSV4_BIN is not set or not a file (run through make test)");
    if (!unit || !env || !realpath(env, bin)) {
        free(unit);
        return -1;
    }
    const char *at = strstr(unit, "/usr/local/bin/dsv4 serve");
    CHECKF(at != NULL, UNIT ": ExecStart is not /usr/local/bin/dsv4 serve");
    FILE *f = at ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "%.*s%s%s%s", (int)(at - unit), unit, bin, at + strlen("/usr/local/bin/dsv4"), extra);
        fclose(f);
    }
    free(unit);
    return f ? 0 : -1;
}

static void test_systemd_unit(struct test_ctx *t)
{
    if (!on_path("systemd-analyze")) {
        test_skip(t, TEST_SKIP_MISSING, "needs systemd-analyze (fix: apt-get install systemd)");
        return;
    }
    char dir[512], path[600], cmd[1400];
    snprintf(dir, sizeof(dir), "%s/systemd", t->tmpdir);
    snprintf(cmd, sizeof(cmd), "mkdir -p %s", dir);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof(path), "%s/dsv4.service", dir);
    if (write_unit(t, path, "") == 0) {
        /* verify exits 0 on unknown keys too: only its silence means every line was understood */
        char *out = NULL;
        snprintf(cmd, sizeof(cmd), "systemd-analyze verify %s 2>&1", path);
        int st = test_run(cmd, &out);
        CHECKF(st == 0 && out && out[0] == '\0', "systemd-analyze verify: status %d: %s", st, out ? out : "");
        free(out);
    }
    snprintf(path, sizeof(path), "%s/dsv4-typo.service", dir);
    if (write_unit(t, path, "\n[Service]\nProtectSytem=strict\n") == 0) {
        snprintf(cmd, sizeof(cmd), "systemd-analyze verify %s 2>&1", path);
        /* verify exits 0 here too: it only warns */
        CHECKF(run_expect(cmd, true, "Unknown key 'ProtectSytem'"), "systemd-analyze verify did not report a misspelt option");
    }
    /* systemd's SIGKILL must come after the drain and the 2 s given to cut streams */
    char *unit = test_read_file(UNIT, NULL), *env = test_read_file("deploy/systemd/dsv4.env", NULL);
    double stop = unit ? setting(unit, "TimeoutStopSec") : -1, drain = env ? setting(env, "DSV4_DRAIN_TIMEOUT") : -1;
    CHECKF(drain > 0 && stop > drain + 2, "TimeoutStopSec %g must be above DSV4_DRAIN_TIMEOUT %g + 2", stop, drain);
    free(unit);
    free(env);
}

static void test_metric_names(struct test_ctx *t)
{
    struct tsrv s;
    if (!tsrv_start(t, &s, DEMO_MODEL, "")) return;
    json_t *r = NULL;
    CHECK(tsrv_post(&s, "/v1/chat/completions",
                    "{\"messages\":[{\"role\":\"user\",\"content\":\"In the beginning\"}],\"max_tokens\":4}", NULL,
                    &r) == 200);
    json_decref(r);
    char *text = NULL;
    CHECK(tsrv_get(&s, "/metrics", NULL, &text) == 200 && text);
    CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "dsv4 serve did not drain and exit 0 (log: %s)", s.log);
    char metrics[512], bad[512], cmd[1400];
    snprintf(metrics, sizeof(metrics), "%s/deploy-metrics.txt", t->tmpdir);
    CHECK(text && test_write_file(metrics, text, strlen(text)) == 0);
    free(text);
    snprintf(cmd, sizeof(cmd), CHECKER " names %s " ALERTS " " DASHBOARD, metrics);
    CHECK(run_expect(cmd, true, "each exported"));
    /* the check can fail: one more rule, on a metric dsv4 does not export */
    snprintf(bad, sizeof(bad), "%s/bad-alerts.yml", t->tmpdir);
    snprintf(cmd, sizeof(cmd),
             "cp " ALERTS " %s && printf '      - alert: Made\\n        expr: rate(dsv4_made_up_total[5m]) > 0\\n' >> %s",
             bad, bad);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof(cmd), CHECKER " names %s %s " DASHBOARD, metrics, bad);
    CHECKF(run_expect(cmd, false, "dsv4_made_up_total is not exported"),
           "a rule on dsv4_made_up_total passed the metric-name check");
}

const struct test_case test_group_deploy[] = {
    { "manifests", test_manifests, TEST_NEEDS_NPM_DEPLOY },
    { "systemd_unit", test_systemd_unit },
    { "alert_rules", test_alert_rules, TEST_NEEDS_NPM_DEPLOY },
    { "metric_names", test_metric_names, TEST_NEEDS_NPM_DEPLOY },
    { NULL, NULL },
};
