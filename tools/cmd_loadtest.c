/*
 * cmd_loadtest.c - `dsv4 loadtest`: the SLA gate of a staged rollout. N client threads
 * send streaming requests to a running server (dsv4 serve or any OpenAI-compatible one)
 * for a duration or a request count, drawing prompts from a mix of length classes; then
 * it reports throughput, TTFT / inter-token latency / end-to-end latency percentiles and
 * the error rate, and exits 1 when a service-level objective is missed.
 *
 * Measurements (client side, wall clock):
 *   TTFT  request sent -> first SSE chunk that carries output (content, reasoning, tool
 *         calls, text or token ids; the opening role chunk does not count);
 *   ITL   between consecutive output-bearing chunks of one request;
 *   E2E   request sent -> "data: [DONE]".
 * A request is an error when the connection fails, the status is not 200 (429 included:
 * a refused request is a failed one for the gate), the stream carries an error event, or
 * it ends without [DONE]. Prompts are words (chat or text completions) or random token
 * ids (--token-prompts, for models without a tokenizer).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "http_client.h"

enum { N_CLASS = 3 };
static const char *const CLASS_NAME[N_CLASS] = { "short", "medium", "long" };

struct lt_opts {
    struct http_url url;
    int             concurrency;
    double          duration_s;
    long            requests;      /* > 0: stop after this many */
    double          weight[N_CLASS];
    int             length[N_CLASS]; /* prompt words / tokens per class */
    int             max_tokens;
    bool            completions;   /* /v1/completions instead of chat */
    bool            token_prompts; /* prompts as token ids */
    int             vocab;         /* token ids drawn below this */
    bool            ignore_eos;
    double          temperature;
    const char     *model;
    const char     *api_key;
    double          timeout_s;
    double          slo_ttft_ms, slo_itl_ms, max_error_rate; /* < 0: no gate */
    bool            json;
};

struct samples {
    double *v;
    size_t  n, cap;
};

static void add(struct samples *s, double x)
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

struct lt_shared {
    const struct lt_opts *o;
    char                  model[256];
    double                t_end;
    pthread_mutex_t       mu;
    /* Protected by mu. */
    long                  started, ok, errors, refused;
    long                  out_tokens, prompt_tokens;
    long                  by_class[N_CLASS];
    struct samples        ttft, itl, e2e;
    char                  first_error[256];
};

struct lt_thread {
    struct lt_shared  *sh;
    unsigned long long rng;
    pthread_t          th;
};

static unsigned long long next_rand(unsigned long long *s)
{
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z                    = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z                    = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const char *const WORDS[] = {
    "the",    "river",  "of",     "light",   "ran",    "through", "a",      "quiet",  "valley", "where",
    "old",    "stone",  "houses", "kept",    "their",  "doors",   "open",   "to",     "every",  "traveller",
    "who",    "brought", "news",  "from",    "distant", "cities", "and",    "markets", "in",    "autumn",
    "farmers", "counted", "grain", "while",  "children", "learned", "letters", "by",    "lamp",   "after",
    "supper", "merchants", "weighed", "silver", "on",    "brass",   "scales", "before",  "dawn",  "sailors",
};

/* The request body for one prompt of `len` words or tokens. */
static char *make_body(const struct lt_opts *o, const char *model, int len, unsigned long long *rng)
{
    json_t *req = json_pack("{s:s, s:b, s:i, s:f, s:{s:b}}", "model", model, "stream", 1, "max_tokens", o->max_tokens,
                            "temperature", o->temperature, "stream_options", "include_usage", 1);
    if (!req) return NULL;
    json_object_set_new(req, "seed", json_integer((json_int_t)(next_rand(rng) >> 2)));
    if (o->ignore_eos) json_object_set_new(req, "ignore_eos", json_true());
    if (o->token_prompts) {
        json_t *ids = json_array();
        for (int i = 0; i < len; i++) json_array_append_new(ids, json_integer((json_int_t)(next_rand(rng) % (unsigned)o->vocab)));
        json_object_set_new(req, "prompt", ids);
    } else {
        size_t nw = sizeof(WORDS) / sizeof(WORDS[0]), cap = (size_t)len * 12 + 64, k = 0;
        char  *text = malloc(cap);
        if (!text) {
            json_decref(req);
            return NULL;
        }
        k += (size_t)snprintf(text, cap, "Request %llu:", next_rand(rng) % 1000000);
        for (int i = 0; i < len; i++) k += (size_t)snprintf(text + k, cap - k, " %s", WORDS[next_rand(rng) % nw]);
        if (o->completions) json_object_set_new(req, "prompt", json_string(text));
        else json_object_set_new(req, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", text));
        free(text);
    }
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s;
}

/* True when a chunk carries output (not just the role or usage). */
static bool has_output(json_t *chunk, bool *is_error)
{
    *is_error = json_object_get(chunk, "error") != NULL;
    json_t *ch = json_array_get(json_object_get(chunk, "choices"), 0);
    if (!ch) return false;
    json_t *d = json_object_get(ch, "delta");
    if (d) {
        const char *c = json_string_value(json_object_get(d, "content"));
        const char *r = json_string_value(json_object_get(d, "reasoning_content"));
        return (c && *c) || (r && *r) || json_array_size(json_object_get(d, "tool_calls")) > 0;
    }
    const char *t = json_string_value(json_object_get(ch, "text"));
    return (t && *t) || json_array_size(json_object_get(ch, "token_ids")) > 0;
}

static void record_error(struct lt_shared *sh, const char *what)
{
    pthread_mutex_lock(&sh->mu);
    sh->errors++;
    if (!sh->first_error[0]) snprintf(sh->first_error, sizeof(sh->first_error), "%s", what);
    pthread_mutex_unlock(&sh->mu);
}

static void one_request(struct lt_thread *t, int cls)
{
    struct lt_shared     *sh = t->sh;
    const struct lt_opts *o  = sh->o;
    char                 *body = make_body(o, sh->model, o->length[cls], &t->rng);
    if (!body) {
        record_error(sh, "out of memory");
        return;
    }
    char path[600], headers[512] = "", err[256];
    snprintf(path, sizeof(path), "%s/v1/%s", o->url.path, o->completions ? "completions" : "chat/completions");
    if (o->api_key) snprintf(headers, sizeof(headers), "Authorization: Bearer %s\r\n", o->api_key);
    struct http_conn c;
    double           t0 = cli_now();
    int rc = http_open(&c, o->url.host, o->url.port, "POST", path, headers, body, strlen(body), o->timeout_s, err,
                       sizeof(err));
    free(body);
    if (rc) {
        record_error(sh, err);
        return;
    }
    if (c.status != 200) {
        char  msg[256];
        char *b = http_read_all(&c, NULL);
        snprintf(msg, sizeof(msg), "HTTP %d: %.200s", c.status, b ? b : "");
        free(b);
        pthread_mutex_lock(&sh->mu);
        if (c.status == 429) sh->refused++;
        pthread_mutex_unlock(&sh->mu);
        http_close(&c);
        record_error(sh, msg);
        return;
    }
    double      t_first = -1, t_last = 0;
    bool        done = false, failed = false;
    long        n_out = 0, usage_out = -1, usage_prompt = -1;
    double      itl_local[4096];
    int         n_itl = 0;
    const char *data;
    size_t      len;
    int         ev;
    char        what[256] = "";
    while ((ev = http_sse_next(&c, &data, &len)) > 0) {
        if (ev == 2) continue;
        if (!strcmp(data, "[DONE]")) {
            done = true;
            break;
        }
        json_t *chunk = json_loadb(data, len, JSON_ALLOW_NUL, NULL);
        if (!chunk) {
            snprintf(what, sizeof(what), "an SSE event that is not JSON: %.100s", data);
            failed = true;
            break;
        }
        bool   is_err;
        double now = cli_now();
        if (has_output(chunk, &is_err)) {
            if (t_first < 0) t_first = now;
            else if (n_itl < (int)(sizeof(itl_local) / sizeof(itl_local[0]))) itl_local[n_itl++] = now - t_last;
            t_last = now;
            n_out++;
        }
        json_t *u = json_object_get(chunk, "usage");
        if (json_is_object(u)) {
            usage_out    = (long)json_integer_value(json_object_get(u, "completion_tokens"));
            usage_prompt = (long)json_integer_value(json_object_get(u, "prompt_tokens"));
        }
        if (is_err) {
            char *e = json_dumps(json_object_get(chunk, "error"), JSON_COMPACT);
            snprintf(what, sizeof(what), "error event: %.200s", e ? e : "?");
            free(e);
            failed = true;
        }
        json_decref(chunk);
    }
    double t_end = cli_now();
    http_close(&c);
    if (!failed && !done) {
        snprintf(what, sizeof(what), "the stream ended without [DONE]");
        failed = true;
    }
    if (failed) {
        record_error(sh, what);
        return;
    }
    pthread_mutex_lock(&sh->mu);
    sh->ok++;
    sh->by_class[cls]++;
    sh->out_tokens += usage_out >= 0 ? usage_out : n_out;
    if (usage_prompt > 0) sh->prompt_tokens += usage_prompt;
    if (t_first >= 0) add(&sh->ttft, t_first - t0);
    for (int i = 0; i < n_itl; i++) add(&sh->itl, itl_local[i]);
    add(&sh->e2e, t_end - t0);
    pthread_mutex_unlock(&sh->mu);
}

static void *client_main(void *arg)
{
    struct lt_thread     *t  = arg;
    struct lt_shared     *sh = t->sh;
    const struct lt_opts *o  = sh->o;
    double                total = 0;
    for (int k = 0; k < N_CLASS; k++) total += o->weight[k];
    for (;;) {
        pthread_mutex_lock(&sh->mu);
        bool go = o->requests > 0 ? sh->started < o->requests : cli_now() < sh->t_end;
        if (go) sh->started++;
        pthread_mutex_unlock(&sh->mu);
        if (!go) break;
        double r   = (double)(next_rand(&t->rng) >> 11) * 0x1.0p-53 * total;
        int    cls = 0;
        while (cls < N_CLASS - 1 && r >= o->weight[cls]) r -= o->weight[cls++];
        while (o->weight[cls] == 0 && cls > 0) cls--;
        one_request(t, cls);
    }
    return NULL;
}

/* ------------------------------------------------------------------ report */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile in milliseconds; NAN without samples. */
static double pct_ms(struct samples *s, double p)
{
    if (!s->n) return NAN;
    size_t k = (size_t)ceil(p / 100.0 * (double)s->n);
    if (k < 1) k = 1;
    return s->v[k - 1] * 1e3;
}

static bool parse_mix(const char *s, struct lt_opts *o)
{
    double w[N_CLASS] = { 0 };
    char   buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        if (!colon) return false;
        *colon = '\0';
        int k  = 0;
        while (k < N_CLASS && strcmp(tok, CLASS_NAME[k])) k++;
        char *end;
        double v = strtod(colon + 1, &end);
        if (k == N_CLASS || *end || !(v >= 0)) return false;
        w[k] = v;
    }
    if (w[0] + w[1] + w[2] <= 0) return false;
    memcpy(o->weight, w, sizeof(w));
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
        while (k < N_CLASS && strcmp(tok, CLASS_NAME[k])) k++;
        char *end;
        long  v = strtol(eq + 1, &end, 10);
        if (k == N_CLASS || *end || v < 1 || v > 1000000) return false;
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
            "  --token-prompts        prompts as random token ids (implies --completions)\n"
            "  --vocab N              token ids are drawn below N (default 1000)\n"
            "  --no-ignore-eos        let completions end at EOS (default: ignore_eos, fixed lengths)\n"
            "  --temperature T        sampling temperature (default 0.8)\n"
            "  --model NAME           model id (default: the first of /v1/models)\n"
            "  --api-key KEY          bearer token (or env DSV4_API_KEY)\n"
            "  --timeout S            per-read network timeout (default 300)\n"
            "  --slo-p99-ttft MS      fail when P99 time to first token exceeds MS\n"
            "  --slo-p99-itl MS       fail when P99 inter-token latency exceeds MS\n"
            "  --max-error-rate R     fail when the share of failed requests exceeds R (0..1)\n"
            "  --json                 print the report as one JSON object\n"
            "exit status: 0 all objectives met, 1 an objective missed or no request succeeded, 2 usage\n");
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

int cmd_loadtest(int argc, char **argv)
{
    struct lt_opts o = {
        .concurrency    = 8,
        .duration_s     = 30,
        .weight         = { 0.9, 0, 0.1 },
        .length         = { 32, 256, 1024 },
        .max_tokens     = 64,
        .vocab          = 1000,
        .ignore_eos     = true,
        .temperature    = 0.8,
        .api_key        = getenv("DSV4_API_KEY"),
        .timeout_s      = 300,
        .slo_ttft_ms    = -1,
        .slo_itl_ms     = -1,
        .max_error_rate = -1,
    };
    const char *url = NULL;
    long long   iv;
    double      fv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--url")) {
            if (!(url = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--concurrency")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 4096, &iv)) return 2;
            o.concurrency = (int)iv;
        } else if (!strcmp(a, "--duration")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0.1, 1e6, &fv)) return 2;
            o.duration_s = fv;
        } else if (!strcmp(a, "--requests")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1LL << 40, &iv)) return 2;
            o.requests = (long)iv;
        } else if (!strcmp(a, "--mix")) {
            if (!(v = cli_value("loadtest", argc, argv, &i))) return 2;
            if (!parse_mix(v, &o)) {
                fprintf(stderr, "dsv4 loadtest: --mix wants CLASS:WEIGHT,... with classes short, medium, long\n");
                return 2;
            }
        } else if (!strcmp(a, "--lengths")) {
            if (!(v = cli_value("loadtest", argc, argv, &i))) return 2;
            if (!parse_lengths(v, &o)) {
                fprintf(stderr, "dsv4 loadtest: --lengths wants CLASS=N,... with classes short, medium, long\n");
                return 2;
            }
        } else if (!strcmp(a, "--max-tokens")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1 << 24, &iv)) return 2;
            o.max_tokens = (int)iv;
        } else if (!strcmp(a, "--vocab")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_int("loadtest", a, v, 1, 1 << 30, &iv)) return 2;
            o.vocab = (int)iv;
        } else if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 2, &fv)) return 2;
            o.temperature = fv;
        } else if (!strcmp(a, "--timeout")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0.1, 1e5, &fv)) return 2;
            o.timeout_s = fv;
        } else if (!strcmp(a, "--slo-p99-ttft")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1e9, &fv)) return 2;
            o.slo_ttft_ms = fv;
        } else if (!strcmp(a, "--slo-p99-itl")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1e9, &fv)) return 2;
            o.slo_itl_ms = fv;
        } else if (!strcmp(a, "--max-error-rate")) {
            if (!(v = cli_value("loadtest", argc, argv, &i)) || !cli_parse_float("loadtest", a, v, 0, 1, &fv)) return 2;
            o.max_error_rate = fv;
        } else if (!strcmp(a, "--model")) {
            if (!(o.model = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--api-key")) {
            if (!(o.api_key = cli_value("loadtest", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--completions")) {
            o.completions = true;
        } else if (!strcmp(a, "--token-prompts")) {
            o.token_prompts = o.completions = true;
        } else if (!strcmp(a, "--no-ignore-eos")) {
            o.ignore_eos = false;
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else {
            fprintf(stderr, "dsv4 loadtest: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
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
    struct lt_shared sh;
    memset(&sh, 0, sizeof(sh));
    sh.o = &o;
    pthread_mutex_init(&sh.mu, NULL);
    if (o.model) snprintf(sh.model, sizeof(sh.model), "%s", o.model);
    else if (!fetch_model(&sh)) return 1;

    struct lt_thread *th = calloc((size_t)o.concurrency, sizeof(*th));
    if (!th) return 1;
    double t0 = cli_now();
    sh.t_end  = t0 + o.duration_s;
    int n_started = 0;
    for (int i = 0; i < o.concurrency; i++) {
        th[i].sh  = &sh;
        th[i].rng = 0x1234567ull * (unsigned long long)(i + 1) ^ (unsigned long long)(t0 * 1e6);
        if (pthread_create(&th[i].th, NULL, client_main, &th[i]) != 0) break;
        n_started++;
    }
    for (int i = 0; i < n_started; i++) pthread_join(th[i].th, NULL);
    double wall = cli_now() - t0;
    free(th);

    qsort(sh.ttft.v, sh.ttft.n, sizeof(double), cmp_double);
    qsort(sh.itl.v, sh.itl.n, sizeof(double), cmp_double);
    qsort(sh.e2e.v, sh.e2e.n, sizeof(double), cmp_double);
    long   total = sh.ok + sh.errors;
    double erate = total ? (double)sh.errors / (double)total : 1.0;
    struct samples *ss[3]   = { &sh.ttft, &sh.itl, &sh.e2e };
    const char     *names[] = { "ttft", "itl", "e2e" };
    double          p[3][3];
    for (int k = 0; k < 3; k++) {
        p[k][0] = pct_ms(ss[k], 50);
        p[k][1] = pct_ms(ss[k], 90);
        p[k][2] = pct_ms(ss[k], 99);
    }
    bool fail_ttft = o.slo_ttft_ms >= 0 && !(p[0][2] <= o.slo_ttft_ms);
    bool fail_itl  = o.slo_itl_ms >= 0 && sh.itl.n && !(p[1][2] <= o.slo_itl_ms);
    bool fail_err  = o.max_error_rate >= 0 && erate > o.max_error_rate;
    bool pass      = sh.ok > 0 && !fail_ttft && !fail_itl && !fail_err;

    if (o.json) {
        json_t *r = json_pack("{s:s, s:i, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:b}", "model", sh.model, "concurrency",
                              o.concurrency, "duration_s", wall, "requests", (json_int_t)total, "ok", (json_int_t)sh.ok,
                              "errors", (json_int_t)sh.errors, "error_rate", erate, "requests_per_s",
                              (double)sh.ok / wall, "output_tokens_per_s", (double)sh.out_tokens / wall,
                              "output_tokens", (json_int_t)sh.out_tokens, "pass", pass);
        for (int k = 0; k < 3; k++) {
            json_t *m = json_object();
            static const char *const pn[] = { "p50_ms", "p90_ms", "p99_ms" };
            for (int q = 0; q < 3; q++) json_object_set_new(m, pn[q], isnan(p[k][q]) ? json_null() : json_real(p[k][q]));
            json_object_set_new(r, names[k], m);
        }
        if (sh.first_error[0]) json_object_set_new(r, "first_error", json_string(sh.first_error));
        char *s = json_dumps(r, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(r);
    } else {
        printf("model %s, %d clients, %.1f s, %s\n", sh.model, o.concurrency, wall,
               o.token_prompts ? "token-id prompts" : o.completions ? "text completions" : "chat");
        printf("requests   %ld ok, %ld failed (%ld refused with 429), error rate %.4f\n", sh.ok, sh.errors, sh.refused,
               erate);
        printf("mix        short %ld, medium %ld, long %ld (prompt tokens %ld in all)\n", sh.by_class[0], sh.by_class[1],
               sh.by_class[2], sh.prompt_tokens);
        printf("throughput %.2f requests/s, %.1f output tokens/s (%ld tokens)\n", (double)sh.ok / wall,
               (double)sh.out_tokens / wall, sh.out_tokens);
        printf("%-10s %10s %10s %10s  (ms, %s)\n", "", "p50", "p90", "p99", "client side");
        for (int k = 0; k < 3; k++)
            printf("%-10s %10.1f %10.1f %10.1f  (%zu samples)\n", names[k], p[k][0], p[k][1], p[k][2], ss[k]->n);
        if (sh.first_error[0]) printf("first error: %s\n", sh.first_error);
        if (o.slo_ttft_ms >= 0) printf("SLO p99 TTFT <= %.1f ms: %s\n", o.slo_ttft_ms, fail_ttft ? "MISSED" : "met");
        if (o.slo_itl_ms >= 0) printf("SLO p99 ITL <= %.1f ms: %s\n", o.slo_itl_ms, fail_itl ? "MISSED" : "met");
        if (o.max_error_rate >= 0)
            printf("SLO error rate <= %.4f: %s\n", o.max_error_rate, fail_err ? "MISSED" : "met");
        printf("%s\n", pass ? "PASS" : "FAIL");
    }
    free(sh.ttft.v);
    free(sh.itl.v);
    free(sh.e2e.v);
    pthread_mutex_destroy(&sh.mu);
    return pass ? 0 : 1;
}
