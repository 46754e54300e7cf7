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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 loadtest --url URL [options]\n"
            "  --url URL              server base URL, e.g. http://127.0.0.1:8000\n"
            "  --concurrency N        client threads, one request in flight each (default 8)\n"
            "  --duration S           seconds to run (default 30)\n"
            "  --requests N           stop after N requests instead\n"
            "  --mix CLASS:W,...      prompt classes short, medium, long with weights (default short:0.9,long:0.1)\n"
            "  --lengths CLASS=N,...  prompt words (or tokens) per class (default short=32,medium=256,long=1024)\n"
            "  --max-tokens N         tokens per completion (default 64)\n"
            "  --completions          use /v1/completions instead of /v1/chat/completions\n"
            "  --completions-share F  send this share of requests to /v1/completions, the rest to chat\n"
            "  --token-prompts        prompts as random token ids (implies --completions)\n"
            "  --vocab N              token ids are drawn below N (default 1000)\n"
            "  --no-ignore-eos        let completions end at EOS (default: ignore_eos, fixed lengths)\n"
            "  --temperature T        sampling temperature (default 0.8)\n"
            "  --model NAME           model id (default: the first of /v1/models)\n"
            "  --api-key KEY          bearer token (or env DSV4_API_KEY)\n"
            "  --timeout S            per-read network timeout (default 300)\n"
            "mixed load:\n"
            "  --kinds KIND:W,...     request kinds with weights (default stream:1): stream (read to [DONE]),\n"
            "                         plain (not streamed), disconnect (hang up after a random number of\n"
            "                         events), bad (malformed or invalid, expects 4xx)\n"
            "  --slow-clients N       extra threads sending their requests 8 bytes at a time (default 0)\n"
            "  --slow-pause MS        pause between those pieces (default 30: a short request takes ~2 s)\n"
            "  --max-body BYTES       the server's body limit, exceeded by the oversized bad request (4194304)\n"
            "  --report S             print a report line every S seconds, and a final one\n"
            "  --server-pid PID       the server's process, for its RSS in the reports\n"
            "  --soak                 soak run: mix stream:0.5,plain:0.2,disconnect:0.15,bad:0.15,\n"
            "                         --completions-share 0.3, --slow-clients 2, --report 180 unless given;\n"
            "                         fails on RSS growth, lost requests or ITL drift (needs --duration)\n"
            "gates:\n"
            "  --slo-p99-ttft MS      fail when P99 time to first token exceeds MS\n"
            "  --slo-p99-itl MS       fail when P99 inter-token latency exceeds MS\n"
            "  --max-error-rate R     fail when the share of failed requests exceeds R (0..1)\n"
            "  --json                 print the summary as one JSON object\n"
            "exit status: 0 all objectives met, 1 an objective missed, no request succeeded or the soak\n"
            "failed, 2 usage\n");
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

/* Options that --soak must not override when they were given. */
struct given {
    bool kinds, share, slow, report, requests;
};

/* Parses argv into o; 0, or the exit status (2 usage, 0 after --help). */
static int parse_args(int argc, char **argv, struct lt_opts *o, const char **url, struct given *g)
{
    long long iv;
    double    fv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(a, "--url")) {
            if (!(*url = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--concurrency")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 4096, &iv)) return 2;
            o->concurrency = (int)iv;
        } else if (!strcmp(a, "--duration")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0.1, 1e6, &fv)) return 2;
            o->duration_s = fv;
        } else if (!strcmp(a, "--requests")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1LL << 40, &iv)) return 2;
            o->requests = (long)iv;
            g->requests = true;
        } else if (!strcmp(a, "--mix")) {
            if (!(v = cli_value("loadtest", argc, argv, &i))) return 2;
            if (!parse_weights(v, lt_class_name, LT_N_CLASS, o->weight)) {
                fprintf(stderr, "dsv4 loadtest: --mix wants CLASS:WEIGHT,... with classes short, medium, long\n");
                return 2;
            }
        } else if (!strcmp(a, "--kinds")) {
            if (!(v = cli_value("loadtest", argc, argv, &i))) return 2;
            if (!parse_weights(v, lt_kind_name, LT_KIND_SLOW, o->kind_weight)) {
                fprintf(stderr, "dsv4 loadtest: --kinds wants KIND:WEIGHT,... with kinds stream, plain, disconnect, bad\n");
                return 2;
            }
            g->kinds = true;
        } else if (!strcmp(a, "--lengths")) {
            if (!(v = cli_value("loadtest", argc, argv, &i))) return 2;
            if (!parse_lengths(v, o)) {
                fprintf(stderr, "dsv4 loadtest: --lengths wants CLASS=N,... with classes short, medium, long\n");
                return 2;
            }
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1 << 24, &iv)) return 2;
            o->max_tokens = (int)iv;
        } else if (!strcmp(a, "--vocab")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1 << 30, &iv)) return 2;
            o->vocab = (int)iv;
        } else if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 2, &fv)) return 2;
            o->temperature = fv;
        } else if (!strcmp(a, "--timeout")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0.1, 1e5, &fv)) return 2;
            o->timeout_s = fv;
        } else if (!strcmp(a, "--completions-share")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1, &fv)) return 2;
            o->completions_share = fv;
            g->share             = true;
        } else if (!strcmp(a, "--slow-clients")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 0, 256, &iv)) return 2;
            o->slow_clients = (int)iv;
            g->slow         = true;
        } else if (!strcmp(a, "--slow-pause")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 600000, &fv)) return 2;
            o->slow_pause_s = fv / 1e3;
        } else if (!strcmp(a, "--max-body")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1LL << 40, &iv)) return 2;
            o->max_body = iv;
        } else if (!strcmp(a, "--report")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0.1, 1e6, &fv)) return 2;
            o->report_s = fv;
            g->report   = true;
        } else if (!strcmp(a, "--server-pid")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1 << 30, &iv)) return 2;
            o->server_pid = (int)iv;
        } else if (!strcmp(a, "--slo-p99-ttft")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1e9, &fv)) return 2;
            o->slo_ttft_ms = fv;
        } else if (!strcmp(a, "--slo-p99-itl")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1e9, &fv)) return 2;
            o->slo_itl_ms = fv;
        } else if (!strcmp(a, "--max-error-rate")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1, &fv)) return 2;
            o->max_error_rate = fv;
        } else if (!strcmp(a, "--model")) {
            if (!(o->model = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--api-key")) {
            if (!(o->api_key = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--completions")) {
            o->completions_share = 1;
            g->share             = true;
        } else if (!strcmp(a, "--token-prompts")) {
            o->token_prompts     = true;
            o->completions_share = 1;
            g->share             = true;
        } else if (!strcmp(a, "--no-ignore-eos")) {
            o->ignore_eos = false;
        } else if (!strcmp(a, "--soak")) {
            o->soak = true;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else {
            fprintf(stderr, "dsv4 loadtest: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

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

int cmd_loadtest(int argc, char **argv)
{
    struct lt_opts o = {
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
    };
    const char  *url = NULL;
    struct given g   = { 0 };
    int          rc  = parse_args(argc, argv, &o, &url, &g);
    if (rc) return rc < 0 ? 0 : rc;
    char err[256];
    if (!url) {
        fprintf(stderr, "dsv4 loadtest: --url is required\n");
        usage(stderr);
        return 2;
    }
    if (!http_url_parse(url, &o.url, err, sizeof(err))) {
        fprintf(stderr, "dsv4 loadtest: %s\n", err);
        return 2;
    }
    if (o.soak) {
        if (g.requests) {
            fprintf(stderr, "dsv4 loadtest: --soak compares quarters of --duration; it does not take --requests\n");
            return 2;
        }
        if (!g.kinds) memcpy(o.kind_weight, SOAK_KIND_WEIGHT, sizeof(o.kind_weight));
        if (!g.share) o.completions_share = SOAK_COMPLETIONS_SHARE;
        if (!g.slow) o.slow_clients = SOAK_SLOW_CLIENTS;
        if (!g.report) o.report_s = SOAK_REPORT_S;
    }
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

    long   done   = lt_count_outcome(&sh, LT_OUT_DONE), errors = 0, expected = 0;
    for (int k = 0; k < LT_N_OUT; k++) {
        if (lt_outcome_is_error((enum lt_outcome)k)) errors += lt_count_outcome(&sh, (enum lt_outcome)k);
        if (lt_outcome_is_expected((enum lt_outcome)k)) expected += lt_count_outcome(&sh, (enum lt_outcome)k);
    }
    long   total = done + errors + expected;
    double erate = total ? (double)errors / (double)total : 1.0;
    struct lt_samples *ss[3]   = { &sh.ttft, &sh.itl, &sh.e2e };
    const char        *names[] = { "ttft", "itl", "e2e" };
    double             p[3][3];
    for (int k = 0; k < 3; k++) {
        p[k][0] = lt_samples_pct_ms(ss[k], 50);
        p[k][1] = lt_samples_pct_ms(ss[k], 90);
        p[k][2] = lt_samples_pct_ms(ss[k], 99);
    }
    bool fail_ttft = o.slo_ttft_ms >= 0 && !(p[0][2] <= o.slo_ttft_ms);
    bool fail_itl  = o.slo_itl_ms >= 0 && sh.itl.n && !(p[1][2] <= o.slo_itl_ms);
    bool fail_err  = o.max_error_rate >= 0 && erate > o.max_error_rate;
    bool pass      = done > 0 && !fail_ttft && !fail_itl && !fail_err;
    bool mixed     = is_mixed(&o);
    const char *api = o.token_prompts                ? "token-id prompts"
                      : o.completions_share >= 1     ? "text completions"
                      : o.completions_share > 0      ? "chat and text completions"
                                                     : "chat";

    if (o.json) {
        json_t *r = json_pack("{s:s, s:i, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:b}", "model", sh.model, "concurrency",
                              o.concurrency, "duration_s", wall, "requests", (json_int_t)total, "ok", (json_int_t)done,
                              "errors", (json_int_t)errors, "error_rate", erate, "requests_per_s",
                              (double)done / wall, "output_tokens_per_s", (double)sh.out_tokens / wall,
                              "output_tokens", (json_int_t)sh.out_tokens, "pass", pass);
        for (int k = 0; k < 3; k++) {
            json_t *m = json_object();
            static const char *const pn[] = { "p50_ms", "p90_ms", "p99_ms" };
            for (int q = 0; q < 3; q++) json_object_set_new(m, pn[q], isnan(p[k][q]) ? json_null() : json_real(p[k][q]));
            json_object_set_new(r, names[k], m);
        }
        if (mixed) {
            json_t *bk = json_object();
            for (int k = 0; k < LT_N_KIND; k++) json_object_set_new(bk, lt_kind_name[k], outcomes_json(&sh, k));
            json_object_set_new(r, "expected", json_integer(expected));
            json_object_set_new(r, "outcomes", outcomes_json(&sh, -1));
            json_object_set_new(r, "by_kind", bk);
        }
        if (sh.first_error[0]) json_object_set_new(r, "first_error", json_string(sh.first_error));
        char *js = json_dumps(r, JSON_COMPACT);
        if (js) puts(js);
        free(js);
        json_decref(r);
    } else {
        printf("model %s, %d clients%s, %.1f s, %s\n", sh.model, o.concurrency,
               o.slow_clients ? " (and slow senders)" : "", wall, api);
        printf("requests   %ld ok, %ld failed (%ld refused with 429), error rate %.4f\n", done, errors, sh.refused,
               erate);
        if (mixed) printf("expected   %ld (cut by the client, slow senders cut by the server, 4xx to bad requests)\n",
                          expected);
        printf("mix        short %ld, medium %ld, long %ld (prompt tokens %ld in all)\n", sh.by_class[0], sh.by_class[1],
               sh.by_class[2], sh.prompt_tokens);
        printf("throughput %.2f requests/s, %.1f output tokens/s (%ld tokens)\n", (double)done / wall,
               (double)sh.out_tokens / wall, sh.out_tokens);
        printf("%-10s %10s %10s %10s  (ms, %s)\n", "", "p50", "p90", "p99", "client side");
        for (int k = 0; k < 3; k++)
            printf("%-10s %10.1f %10.1f %10.1f  (%zu samples)\n", names[k], p[k][0], p[k][1], p[k][2], ss[k]->n);
        if (mixed) print_kinds(&sh);
        if (sh.first_error[0]) printf("first error: %s\n", sh.first_error);
        if (o.slo_ttft_ms >= 0) printf("SLO p99 TTFT <= %.1f ms: %s\n", o.slo_ttft_ms, fail_ttft ? "MISSED" : "met");
        if (o.slo_itl_ms >= 0) printf("SLO p99 ITL <= %.1f ms: %s\n", o.slo_itl_ms, fail_itl ? "MISSED" : "met");
        if (o.max_error_rate >= 0)
            printf("SLO error rate <= %.4f: %s\n", o.max_error_rate, fail_err ? "MISSED" : "met");
        printf("%s\n", pass ? "PASS" : "FAIL");
    }
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
