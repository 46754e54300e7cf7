/*
 * cmd_loadtest.c - `dsv4 loadtest`: the SLA gate of a staged rollout, and the load of a
 * soak. N client threads send requests to a running server (dsv4 serve or any OpenAI-
 * compatible one) for a duration or a request count, drawing prompts from a mix of length
 * classes; then it reports throughput, TTFT / inter-token latency / end-to-end latency
 * percentiles and the error rate, and exits 1 when a service-level objective is missed.
 *
 * Measurements (client side, wall clock):
 *   TTFT  request sent -> first SSE chunk that carries output (content, reasoning, tool
 *         calls, text or token ids; the opening role chunk does not count);
 *   ITL   between consecutive output-bearing chunks of one request;
 *   E2E   request sent -> "data: [DONE]" (or the whole body of a plain request).
 * A request is an error when the connection fails, the status is not 200 (429 included:
 * a refused request is a failed one for the gate), the stream carries an error event, or
 * it ends without [DONE]. Prompts are words (chat or text completions) or random token
 * ids (--token-prompts, for models without a tokenizer).
 *
 * By default every request is a streamed chat (or, with --completions, text completion)
 * that is read to its end. A mixed load (loadtest_mix.c) adds, by --kinds weights, plain
 * requests, clients that hang up mid-stream and bad requests that must get 4xx, plus
 * --slow-clients threads that send their requests a few bytes at a time; --completions-
 * share splits requests between the two endpoints. Outcomes that are meant to happen (a
 * client's own cut, a slow sender cut by the server, a 4xx to a bad request) are counted
 * apart and are not errors. --report S prints a line every S seconds with the server's
 * RSS (--server-pid) and KV pool (its /metrics) and the window's latencies;
 * --soak sets such a mix and judges the run (loadtest_soak.c). Traffic goes only to the
 * --url given.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "support/http_client.h"
#include "loadtest_shared.h"

/* The mix --soak sets unless --kinds, --completions-share or --slow-clients say otherwise. */
static const double SOAK_KIND_WEIGHT[LT_N_KIND] = { 0.5, 0.2, 0.15, 0.15, 0 };
static const double SOAK_COMPLETIONS_SHARE      = 0.3;
static const int    SOAK_SLOW_CLIENTS           = 2;
static const double SOAK_REPORT_S               = 180;

/* ------------------------------------------------------------------ options */

/* NAME:W,... over the names given; false on an unknown name or a bad weight. */
static bool parse_weights(const char *s, const char *const *names, int n, double *out)
{
    double w[LT_N_KIND] = { 0 }, sum = 0;
    char   buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        if (!colon) return false;
        *colon = '\0';
        int k  = 0;
        while (k < n && strcmp(tok, names[k])) k++;
        char  *end;
        double v = strtod(colon + 1, &end);
        if (k == n || *end || !(v >= 0) || !isfinite(v)) return false;
        w[k] = v;
    }
    for (int k = 0; k < n; k++) sum += w[k];
    if (sum <= 0) return false;
    memcpy(out, w, (size_t)n * sizeof(double));
    return true;
}

static bool parse_lengths(const char *s, struct lt_opts *o)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *eq = strchr(tok, '=');
        if (!eq) return false;
        *eq   = '\0';
        int k = 0;
        while (k < LT_N_CLASS && strcmp(tok, lt_class_name[k])) k++;
        char *end;
        long  v = strtol(eq + 1, &end, 10);
        if (k == LT_N_CLASS || *end || v < 1 || v > 1000000) return false;
        o->length[k] = (int)v;
    }
    return true;
}

static bool fetch_model(struct lt_shared *sh)
{
    const struct lt_opts *o = sh->o;
    char                  path[600], headers[512] = "", err[256];
    snprintf(path, sizeof(path), "%s/v1/models", o->url.path);
    if (o->api_key) snprintf(headers, sizeof(headers), "Authorization: Bearer %s\r\n", o->api_key);
    char *body = NULL;
    int   st   = http_request(o->url.host, o->url.port, "GET", path, headers, NULL, &body, NULL, 30, err, sizeof(err));
    json_t *j  = st == 200 && body ? json_loads(body, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    if (id) snprintf(sh->model, sizeof(sh->model), "%s", id);
    else fprintf(stderr, "dsv4 loadtest: GET %s failed (%s)\n", path, st < 0 ? err : body ? body : "no model id");
    json_decref(j);
    free(body);
    return id != NULL;
}

/* The command line: the options, the URL, and which options --soak must not override
 * because they were given. */
struct lt_args {
    struct lt_opts o;
    const char    *url;
    bool           kinds, share, slow, report, requests;
};

static bool set_requests(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct lt_args *a = base;
    long long       iv;
    if (!cli_parse_int(cmd, o->name, v, 1, 1LL << 40, &iv)) return false;
    a->o.requests = (long)iv;
    a->requests   = true;
    return true;
}

static bool set_mix(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    (void)o;
    if (parse_weights(v, lt_class_name, LT_N_CLASS, ((struct lt_args *)base)->o.weight)) return true;
    fprintf(stderr, "dsv4 %s: --mix wants CLASS:WEIGHT,... with classes short, medium, long\n", cmd);
    return false;
}

static bool set_kinds(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct lt_args *a = base;
    (void)o;
    if (!parse_weights(v, lt_kind_name, LT_KIND_SLOW, a->o.kind_weight)) {
        fprintf(stderr, "dsv4 %s: --kinds wants KIND:WEIGHT,... with kinds stream, plain, disconnect, bad\n", cmd);
        return false;
    }
    a->kinds = true;
    return true;
}

static bool set_lengths(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    (void)o;
    if (parse_lengths(v, &((struct lt_args *)base)->o)) return true;
    fprintf(stderr, "dsv4 %s: --lengths wants CLASS=N,... with classes short, medium, long\n", cmd);
    return false;
}

/* --completions-share F, --completions (v NULL: 1) and --token-prompts (also token ids). */
static bool set_share(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct lt_args *a = base;
    double          fv = 1;
    if (v && !cli_parse_float(cmd, o->name, v, 0, 1, &fv)) return false;
    if (!strcmp(o->name, "--token-prompts")) a->o.token_prompts = true;
    a->o.completions_share = fv;
    a->share               = true;
    return true;
}

static bool set_slow(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct lt_args *a = base;
    long long       iv;
    if (!cli_parse_int(cmd, o->name, v, 0, 256, &iv)) return false;
    a->o.slow_clients = (int)iv;
    a->slow           = true;
    return true;
}

static bool set_slow_pause(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    double ms;
    if (!cli_parse_float(cmd, o->name, v, 0, 600000, &ms)) return false;
    ((struct lt_args *)base)->o.slow_pause_s = ms / 1e3;
    return true;
}

static bool set_report(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    struct lt_args *a = base;
    if (!cli_parse_float(cmd, o->name, v, 0.1, 1e6, &a->o.report_s)) return false;
    a->report = true;
    return true;
}

static bool set_no_ignore_eos(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    (void)o, (void)cmd, (void)v;
    ((struct lt_args *)base)->o.ignore_eos = false;
    return true;
}

#define LA(field) offsetof(struct lt_args, field)
static const struct cli_opt LT_OPTS[] = {
    { "--url", NULL, "URL", "server base URL, e.g. http://127.0.0.1:8000", CLI_STR, LA(url), 0, 0, NULL },
    { "--concurrency", NULL, "N", "client threads, one request in flight each (default 8)", CLI_INT, LA(o.concurrency), 1,
      4096, NULL },
    { "--duration", NULL, "S", "seconds to run (default 30)", CLI_DOUBLE, LA(o.duration_s), 0.1, 1e6, NULL },
    { "--requests", NULL, "N", "stop after N requests instead", CLI_CALL, 0, 0, 0, set_requests },
    { "--mix", NULL, "CLASS:W,...",
      "prompt classes short, medium, long with weights (default\nshort:0.9,long:0.1)", CLI_CALL, 0, 0, 0, set_mix },
    { "--lengths", NULL, "CLASS=N,...",
      "prompt words (or tokens) per class (default\nshort=32,medium=256,long=1024)", CLI_CALL, 0, 0, 0, set_lengths },
    { "--max-tokens", NULL, "N", "tokens per completion (default 64)", CLI_INT, LA(o.max_tokens), 1, 1 << 24, NULL },
    { "--completions", NULL, NULL, "use /v1/completions instead of /v1/chat/completions", CLI_CALL, 0, 0, 0, set_share },
    { "--completions-share", NULL, "F", "send this share of requests to /v1/completions, the rest to chat", CLI_CALL, 0,
      0, 0, set_share },
    { "--token-prompts", NULL, NULL, "prompts as random token ids (implies --completions)", CLI_CALL, 0, 0, 0, set_share },
    { "--vocab", NULL, "N", "token ids are drawn below N (default 1000)", CLI_INT, LA(o.vocab), 1, 1 << 30, NULL },
    { "--no-ignore-eos", NULL, NULL, "let completions end at EOS (default: ignore_eos, fixed lengths)", CLI_CALL, 0, 0,
      0, set_no_ignore_eos },
    { "--temperature", NULL, "T", "sampling temperature (default 0.8)", CLI_DOUBLE, LA(o.temperature), 0, 2, NULL },
    { "--model", NULL, "NAME", "model id (default: the first of /v1/models)", CLI_STR, LA(o.model), 0, 0, NULL },
    { "--api-key", NULL, "KEY", "bearer token (or env DSV4_API_KEY)", CLI_STR, LA(o.api_key), 0, 0, NULL },
    { "--timeout", NULL, "S", "per-read network timeout (default 300)", CLI_DOUBLE, LA(o.timeout_s), 0.1, 1e5, NULL },
    { "--kinds", NULL, "KIND:W,...",
      "mixed load: request kinds with weights (default stream:1): stream (read\nto [DONE]), plain (not streamed), "
      "disconnect (hang up after a random\nnumber of events), bad (malformed or invalid, expects 4xx)",
      CLI_CALL, 0, 0, 0, set_kinds },
    { "--slow-clients", NULL, "N", "extra threads sending their requests 8 bytes at a time (default 0)", CLI_CALL, 0, 0,
      0, set_slow },
    { "--slow-pause", NULL, "MS", "pause between those pieces (default 30: a short request takes ~2 s)", CLI_CALL, 0, 0,
      0, set_slow_pause },
    { "--max-body", NULL, "BYTES", "the server's body limit, exceeded by the oversized bad request (4194304)", CLI_LLONG,
      LA(o.max_body), 1, (double)(1LL << 40), NULL },
    { "--report", NULL, "S", "print a report line every S seconds, and a final one", CLI_CALL, 0, 0, 0, set_report },
    { "--server-pid", NULL, "PID", "the server's process, for its RSS in the reports", CLI_INT, LA(o.server_pid), 1,
      1 << 30, NULL },
    { "--soak", NULL, NULL,
      "soak run: mix stream:0.5,plain:0.2,disconnect:0.15,bad:0.15,\n--completions-share 0.3, --slow-clients 2, --report "
      "180 unless given;\nfails on RSS growth, lost requests or ITL drift (needs --duration)",
      CLI_FLAG, LA(o.soak), 0, 0, NULL },
    { "--slo-p99-ttft", NULL, "MS", "gate: fail when P99 time to first token exceeds MS", CLI_DOUBLE, LA(o.slo_ttft_ms), 0,
      1e9, NULL },
    { "--slo-p99-itl", NULL, "MS", "gate: fail when P99 inter-token latency exceeds MS", CLI_DOUBLE, LA(o.slo_itl_ms), 0,
      1e9, NULL },
    { "--max-error-rate", NULL, "R", "gate: fail when the share of failed requests exceeds R (0..1)", CLI_DOUBLE,
      LA(o.max_error_rate), 0, 1, NULL },
    { "--json", NULL, NULL, "print the summary as one JSON object", CLI_FLAG, LA(o.json), 0, 0, NULL },
};
#undef LA

/* ------------------------------------------------------------------ summary */

static bool is_mixed(const struct lt_opts *o)
{
    for (int k = LT_KIND_PLAIN; k < LT_KIND_SLOW; k++)
        if (o->kind_weight[k] > 0) return true;
    return o->slow_clients > 0;
}

/* Outcome counts of one kind (or of all, kind < 0) as a JSON object. */
static json_t *outcomes_json(const struct lt_shared *sh, int kind)
{
    json_t *m = json_object();
    for (int o = 0; o < LT_N_OUT; o++) {
        long n = 0;
        for (int k = 0; k < LT_N_KIND; k++)
            if (kind < 0 || k == kind) n += sh->count[k][o];
        json_object_set_new(m, lt_outcome_name[o], json_integer(n));
    }
    return m;
}

static void print_kinds(const struct lt_shared *sh)
{
    printf("%-10s %8s %8s %8s %8s  (expected: client_cut, server_cut, bad_4xx)\n", "kind", "sent", "done", "expected",
           "errors");
    for (int k = 0; k < LT_N_KIND; k++) {
        long done = sh->count[k][LT_OUT_DONE], exp = 0, err = 0;
        for (int o = 0; o < LT_N_OUT; o++) {
            if (lt_outcome_is_expected((enum lt_outcome)o)) exp += sh->count[k][o];
            if (lt_outcome_is_error((enum lt_outcome)o)) err += sh->count[k][o];
        }
        printf("%-10s %8ld %8ld %8ld %8ld\n", lt_kind_name[k], lt_count_kind(sh, (enum lt_kind)k), done, exp, err);
    }
    printf("errors    ");
    for (int o = LT_OUT_CONNECT; o < LT_N_OUT; o++)
        printf(" %s %ld", lt_outcome_name[o], lt_count_outcome(sh, (enum lt_outcome)o));
    printf("\n");
}

/* The summary as text or JSON; whether every objective was met. */
static bool print_summary(struct lt_shared *sh, const struct lt_opts *o, double wall)
{
    long   done   = lt_count_outcome(sh, LT_OUT_DONE), errors = 0, expected = 0;
    for (int k = 0; k < LT_N_OUT; k++) {
        if (lt_outcome_is_error((enum lt_outcome)k)) errors += lt_count_outcome(sh, (enum lt_outcome)k);
        if (lt_outcome_is_expected((enum lt_outcome)k)) expected += lt_count_outcome(sh, (enum lt_outcome)k);
    }
    long   total = done + errors + expected;
    double erate = total ? (double)errors / (double)total : 1.0;
    struct lt_samples *ss[3]   = { &sh->ttft, &sh->itl, &sh->e2e };
    const char        *names[] = { "ttft", "itl", "e2e" };
    double             p[3][3];
    for (int k = 0; k < 3; k++) {
        p[k][0] = lt_samples_pct_ms(ss[k], 50);
        p[k][1] = lt_samples_pct_ms(ss[k], 90);
        p[k][2] = lt_samples_pct_ms(ss[k], 99);
    }
    bool fail_ttft = o->slo_ttft_ms >= 0 && !(p[0][2] <= o->slo_ttft_ms);
    bool fail_itl  = o->slo_itl_ms >= 0 && sh->itl.n && !(p[1][2] <= o->slo_itl_ms);
    bool fail_err  = o->max_error_rate >= 0 && erate > o->max_error_rate;
    bool pass      = done > 0 && !fail_ttft && !fail_itl && !fail_err;
    bool mixed     = is_mixed(o);
    const char *api = o->token_prompts                ? "token-id prompts"
                      : o->completions_share >= 1     ? "text completions"
                      : o->completions_share > 0      ? "chat and text completions"
                                                     : "chat";

    if (o->json) {
        json_t *r = json_pack("{s:s, s:i, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:b}", "model", sh->model, "concurrency",
                              o->concurrency, "duration_s", wall, "requests", (json_int_t)total, "ok", (json_int_t)done,
                              "errors", (json_int_t)errors, "error_rate", erate, "requests_per_s",
                              (double)done / wall, "output_tokens_per_s", (double)sh->out_tokens / wall,
                              "output_tokens", (json_int_t)sh->out_tokens, "pass", pass);
        for (int k = 0; k < 3; k++) {
            json_t *m = json_object();
            static const char *const pn[] = { "p50_ms", "p90_ms", "p99_ms" };
            for (int q = 0; q < 3; q++) json_object_set_new(m, pn[q], isnan(p[k][q]) ? json_null() : json_real(p[k][q]));
            json_object_set_new(r, names[k], m);
        }
        if (mixed) {
            json_t *bk = json_object();
            for (int k = 0; k < LT_N_KIND; k++) json_object_set_new(bk, lt_kind_name[k], outcomes_json(sh, k));
            json_object_set_new(r, "expected", json_integer(expected));
            json_object_set_new(r, "outcomes", outcomes_json(sh, -1));
            json_object_set_new(r, "by_kind", bk);
        }
        if (sh->first_error[0]) json_object_set_new(r, "first_error", json_string(sh->first_error));
        char *js = json_dumps(r, JSON_COMPACT);
        if (js) puts(js);
        free(js);
        json_decref(r);
    } else {
        printf("model %s, %d clients%s, %.1f s, %s\n", sh->model, o->concurrency,
               o->slow_clients ? " (and slow senders)" : "", wall, api);
        printf("requests   %ld ok, %ld failed (%ld refused with 429), error rate %.4f\n", done, errors, sh->refused,
               erate);
        if (mixed) printf("expected   %ld (cut by the client, slow senders cut by the server, 4xx to bad requests)\n",
                          expected);
        printf("mix        short %ld, medium %ld, long %ld (prompt tokens %ld in all)\n", sh->by_class[0], sh->by_class[1],
               sh->by_class[2], sh->prompt_tokens);
        printf("throughput %.2f requests/s, %.1f output tokens/s (%ld tokens)\n", (double)done / wall,
               (double)sh->out_tokens / wall, sh->out_tokens);
        printf("%-10s %10s %10s %10s  (ms, %s)\n", "", "p50", "p90", "p99", "client side");
        for (int k = 0; k < 3; k++)
            printf("%-10s %10.1f %10.1f %10.1f  (%zu samples)\n", names[k], p[k][0], p[k][1], p[k][2], ss[k]->n);
        if (mixed) print_kinds(sh);
        if (sh->first_error[0]) printf("first error: %s\n", sh->first_error);
        if (o->slo_ttft_ms >= 0) printf("SLO p99 TTFT <= %.1f ms: %s\n", o->slo_ttft_ms, fail_ttft ? "MISSED" : "met");
        if (o->slo_itl_ms >= 0) printf("SLO p99 ITL <= %.1f ms: %s\n", o->slo_itl_ms, fail_itl ? "MISSED" : "met");
        if (o->max_error_rate >= 0)
            printf("SLO error rate <= %.4f: %s\n", o->max_error_rate, fail_err ? "MISSED" : "met");
        printf("%s\n", pass ? "PASS" : "FAIL");
    }
    return pass;
}

/* The options after parsing: the URL, and --soak's defaults for what was not given. */
static int check_args(const struct cli_spec *spec, struct lt_args *a)
{
    char err[256];
    if (!a->url) return cli_usage_error(spec, "--url is required");
    if (!http_url_parse(a->url, &a->o.url, err, sizeof(err))) {
        fprintf(stderr, "dsv4 loadtest: %s\n", err);
        return 2;
    }
    if (!a->o.soak) return 0;
    if (a->requests) {
        fprintf(stderr, "dsv4 loadtest: --soak compares quarters of --duration; it does not take --requests\n");
        return 2;
    }
    if (!a->kinds) memcpy(a->o.kind_weight, SOAK_KIND_WEIGHT, sizeof(a->o.kind_weight));
    if (!a->share) a->o.completions_share = SOAK_COMPLETIONS_SHARE;
    if (!a->slow) a->o.slow_clients = SOAK_SLOW_CLIENTS;
    if (!a->report) a->o.report_s = SOAK_REPORT_S;
    return 0;
}

int cmd_loadtest(int argc, char **argv)
{
    struct lt_args a = { .o = {
        .concurrency    = 8,
        .duration_s     = 30,
        .weight         = { 0.9, 0, 0.1 },
        .length         = { 32, 256, 1024 },
        .max_tokens     = 64,
        .kind_weight    = { 1, 0, 0, 0, 0 },
        .vocab          = 1000,
        .ignore_eos     = true,
        .temperature    = 0.8,
        .api_key        = getenv("DSV4_API_KEY"),
        .timeout_s      = 300,
        .slow_pause_s   = 0.030,
        .max_body       = 4194304,
        .slo_ttft_ms    = -1,
        .slo_itl_ms     = -1,
        .max_error_rate = -1,
    } };
    const struct cli_group group = { NULL, LT_OPTS, sizeof(LT_OPTS) / sizeof(LT_OPTS[0]), &a };
    const struct cli_spec  spec  = {
        "loadtest", "usage: dsv4 loadtest --url URL [options]\n", &group, 1,
        "exit status: 0 all objectives met, 1 an objective missed, no request succeeded or the soak\nfailed, 2 usage\n"
    };
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if ((rc = check_args(&spec, &a))) return rc;
    struct lt_opts o = a.o;
    struct lt_shared sh;
    memset(&sh, 0, sizeof(sh));
    sh.o = &o;
    pthread_mutex_init(&sh.mu, NULL);
    if (o.model) snprintf(sh.model, sizeof(sh.model), "%s", o.model);
    else if (!fetch_model(&sh)) return 1;

    int               n_threads = o.concurrency + o.slow_clients;
    struct lt_thread *th        = calloc((size_t)n_threads, sizeof(*th));
    if (!th) return 1;
    sh.t_start = cli_now();
    sh.t_end   = sh.t_start + o.duration_s;
    int n_started = 0;
    for (int i = 0; i < n_threads; i++) {
        th[i].sh   = &sh;
        th[i].slow = i >= o.concurrency;
        th[i].rng  = 0x1234567ull * (unsigned long long)(i + 1) ^ (unsigned long long)(sh.t_start * 1e6);
        pthread_mutex_lock(&sh.mu);
        sh.running++;
        pthread_mutex_unlock(&sh.mu);
        if (pthread_create(&th[i].th, NULL, lt_client_main, &th[i]) != 0) {
            pthread_mutex_lock(&sh.mu);
            sh.running--;
            pthread_mutex_unlock(&sh.mu);
            break;
        }
        n_started++;
    }
    struct lt_watch watch;
    lt_watch_run(&sh, &watch);
    for (int i = 0; i < n_started; i++) pthread_join(th[i].th, NULL);
    double wall = cli_now() - sh.t_start;
    free(th);
    lt_watch_final(&sh, &watch);

    bool pass = print_summary(&sh, &o, wall);
    fflush(stdout);
    if (o.soak && !lt_soak_verdict(&sh, &watch)) pass = false;
    free(sh.ttft.v);
    free(sh.itl.v);
    free(sh.e2e.v);
    free(sh.win_ttft.v);
    free(sh.win_itl.v);
    for (int q = 0; q < LT_N_QUARTER; q++) free(sh.q_itl[q].v);
    pthread_mutex_destroy(&sh.mu);
    return pass ? 0 : 1;
}
