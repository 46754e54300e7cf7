/*
 * test_server.c - `dsv4 serve` over real HTTP on loopback: the test generates a tiny-a
 * checkpoint plus a small DeepSeek-style tokenizer.json (byte-level BPE with the V4
 * special tokens), starts `dsv4 serve --port 0` as a child process, and checks:
 *   - chat (streaming and not) and completions, token for token against `dsv4 run` with
 *     the same seed and sampling, and the same text both ways;
 *   - usage (cached tokens after a follow-up turn), logprobs, stop strings, token-id
 *     prompts;
 *   - every bad input of the API (status, OpenAI error shape, a useful message), and the
 *     server still healthy afterwards;
 *   - 32 concurrent clients served exactly as when alone;
 *   - a full queue answers 429 with Retry-After; SSE keep-alive comments while queued;
 *   - a client that disconnects mid-stream (or mid-request) frees its sequence;
 *   - SIGTERM drains without losing an accepted request and exits 0; a second signal
 *     exits at once;
 *   - /metrics parses as Prometheus text exposition (a validator below);
 *   - the official OpenAI node client (tests/server/openai_client.mjs) for chat,
 *     streaming and tool calls.
 * The canned-output tests (tool calls, reasoning, stop strings split across tokens) are in
 * test_server_out.c.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "support/gen.h"
#include "support/http_client.h"
#include "server/server.h"
#include "test_cases.h"
#include "test_server_util.h"
#include "test_server_anthropic.h"
#include "test_server_responses.h"
#include "test_server_limits.h"
#include "test_server_standby.h"

/* ------------------------------------------------------------------ the model */

static char g_dir[512];
static bool g_model_ok, g_model_tried;

static bool model_dir(struct test_ctx *t)
{
    if (g_model_tried) return g_model_ok;
    g_model_tried = true;
    snprintf(g_dir, sizeof(g_dir), "%s/srv-tiny", t->tmpdir);
    g_model_ok = tsrv_make_model(t, g_dir, 7);
    return g_model_ok;
}

/* The main server, shared by the tests that do not need special options. */
static struct tsrv g_main;
static bool        g_main_up;

static struct tsrv *main_server(struct test_ctx *t)
{
    if (g_main_up) return &g_main;
    if (!model_dir(t)) return NULL;
    g_main_up = tsrv_start(t, &g_main, g_dir, "--max-seqs 4 --ctx 2048 --max-queue 64");
    return g_main_up ? &g_main : NULL;
}


/* ------------------------------------------------------------------ expectations */

/* Prompt ids for a chat, as the server builds them (same public API). */
static int chat_prompt(const char *messages_json, int32_t **ids)
{
    dsv4_tokenizer *tok;
    char            path[600];
    snprintf(path, sizeof(path), "%s/tokenizer.json", g_dir);
    if (dsv4_tokenizer_load(&tok, path, NULL)) return -1;
    struct dsv4_chat_params cp;
    dsv4_chat_params_default(&cp);
    char  *prompt;
    size_t n, n_ids = 0;
    int    rc = dsv4_chat_render_json(messages_json, strlen(messages_json), &cp, &prompt, &n, NULL);
    if (rc == 0) {
        *ids = malloc(sizeof(int32_t) * (3 * n + 1));
        rc   = dsv4_tokenizer_encode(tok, prompt, n, 0, *ids, 3 * n + 1, &n_ids, NULL);
        free(prompt);
    }
    dsv4_tokenizer_free(tok);
    return rc ? -1 : (int)n_ids;
}

/* `dsv4 run` on the ids: the tokens it generates (EOS excluded). */
static int run_engine(struct test_ctx *t, const int32_t *prompt, int n_prompt, int n_gen, double temp, long long seed,
                      int32_t *out, int cap)
{
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return -1;
    size_t cmd_cap = (size_t)n_prompt * 8 + 1024;
    char  *cmd     = malloc(cmd_cap);
    size_t k       = (size_t)snprintf(cmd, cmd_cap, "%s run -m '%s'%s -n %d --temp %g --seed %lld --ids --tokens ", bin,
                                      g_dir, test_backend_arg(), n_gen, temp, seed);
    for (int i = 0; i < n_prompt; i++) k += (size_t)snprintf(cmd + k, cmd_cap - k, "%s%d", i ? "," : "", (int)prompt[i]);
    char *outp = NULL;
    int   st   = test_run(cmd, &outp);
    free(cmd);
    CHECKF(st == 0, "dsv4 run: %s", outp ? outp : "");
    int n = 0;
    for (char *p = outp, *end; st == 0 && p && n < cap; p = end) {
        while (*p == ' ') p++;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[n++] = (int32_t)v;
    }
    free(outp);
    return st == 0 ? n : -1;
}

/* Token ids from chat logprobs entries "token_id:N". */
static int ids_from_logprobs(json_t *content, int32_t *out, int cap)
{
    size_t  i;
    json_t *e;
    int     n = 0;
    json_array_foreach(content, i, e) {
        const char *s = json_string_value(json_object_get(e, "token"));
        if (!s || strncmp(s, "token_id:", 9) || n >= cap) return -1;
        out[n++] = (int32_t)atoi(s + 9);
    }
    return n;
}

/* ------------------------------------------------------------------ tests */

static void test_health_models_metrics(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    CHECK(s != NULL);
    if (!s) return;
    json_t *r = NULL;
    CHECK(tsrv_get(s, "/health", &r, NULL) == 200);
    CHECK(r && !strcmp(test_str(json_string_value(json_object_get(r, "status"))), "ok"));
    json_decref(r);
    CHECK(tsrv_get(s, "/v1/models", &r, NULL) == 200);
    json_t *m = json_array_get(json_object_get(r, "data"), 0);
    CHECKF(m && !strcmp(test_str(json_string_value(json_object_get(m, "id"))), "srv-tiny"), "models: model id");
    CHECK(json_integer_value(json_object_get(m, "max_model_len")) == 2048);
    json_decref(r);
    char *text = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    char why[256];
    CHECKF(text && tsrv_prom_validate(text, why, sizeof(why)), "metrics: %s", why);
    CHECK(text && strstr(text, "dsv4_server_state{state=\"ready\"} 1"));
    free(text);
}

/* The process_ gauges (Prometheus client convention): resident memory as /proc/self/statm of
 * the server's pid says, and a start time between the test's start of the server and now. */
static void test_process_metrics(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    char *text = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    double rss   = text ? tsrv_metric(text, "process_resident_memory_bytes") : NAN;
    double start = text ? tsrv_metric(text, "process_start_time_seconds") : NAN;
    free(text);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/statm", (int)s->sig_pid);
    char  *statm = test_read_file(path, NULL);
    double pages = 0;
    CHECKF(statm && sscanf(statm, "%*s %lf", &pages) == 1, "reading %s", path);
    free(statm);
    /* the server's RSS moves a little between the scrape and the read: within 10% */
    double want = pages * (double)sysconf(_SC_PAGESIZE);
    CHECKF(rss > 1 << 20 && fabs(rss - want) < 0.1 * want, "process_resident_memory_bytes %g, statm says %g", rss, want);
    double now = (double)time(NULL);
    CHECKF(start > now - 3600 && start <= now + 1, "process_start_time_seconds %.3f, now %.0f", start, now);
}

static const char *CHAT_MSGS = "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                               "{\"role\":\"user\",\"content\":\"tell me a story about the sea\"}]";

static void chat_vs_engine(struct test_ctx *t, struct tsrv *s, double temp, long long seed, int n_gen)
{
    int32_t *prompt = NULL;
    int      n_prompt = chat_prompt(CHAT_MSGS, &prompt);
    CHECK(n_prompt > 5);
    int32_t want[256], got[256], got_stream[256];
    int     n_want = run_engine(t, prompt, n_prompt, n_gen, temp, seed, want, 256);
    free(prompt);
    if (n_want < 0) return;
    char body[1024];
    snprintf(body, sizeof(body),
             "{\"model\":\"srv-tiny\",\"messages\":%s,\"max_tokens\":%d,\"temperature\":%g,\"seed\":%lld,"
             "\"logprobs\":true,\"top_logprobs\":3,\"return_tokens_as_token_ids\":true%s}",
             CHAT_MSGS, n_gen, temp, seed, "");
    json_t *r = NULL;
    CHECK(tsrv_post(s, "/v1/chat/completions", body, NULL, &r) == 200);
    json_t *ch   = json_array_get(json_object_get(r, "choices"), 0);
    int     n_got = ids_from_logprobs(json_object_get(json_object_get(ch, "logprobs"), "content"), got, 256);
    CHECKF(n_got == n_want && !memcmp(got, want, sizeof(int32_t) * (size_t)n_want),
           "chat (temp %g seed %lld): %d tokens from the server, %d from dsv4 run", temp, seed, n_got, n_want);
    json_t *usage = json_object_get(r, "usage");
    CHECK(json_integer_value(json_object_get(usage, "prompt_tokens")) == n_prompt);
    CHECK(json_integer_value(json_object_get(usage, "completion_tokens")) == n_want);
    const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
    CHECKF(fin && !strcmp(fin, n_want == n_gen ? "length" : "stop"), "finish_reason %s", fin ? fin : "(null)");
    json_t *lp0 = json_array_get(json_object_get(json_object_get(ch, "logprobs"), "content"), 0);
    CHECK(json_array_size(json_object_get(lp0, "top_logprobs")) == 3);
    CHECK(json_real_value(json_object_get(lp0, "logprob")) <= 0);
    const char *content = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));

    /* the same request streamed: same tokens, same text */
    char sbody[1200];
    snprintf(sbody, sizeof(sbody), "%.*s,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
             (int)strlen(body) - 1, body);
    struct tsrv_stream st;
    CHECK(tsrv_stream(s, "/v1/chat/completions", sbody, NULL, &st) == 200);
    CHECK(st.done);
    int n_s = 0;
    for (size_t i = 0; i < json_array_size(st.chunks); i++) {
        json_t *c = json_array_get(st.chunks, i);
        json_t *lp = json_object_get(json_object_get(json_array_get(json_object_get(c, "choices"), 0), "logprobs"), "content");
        if (lp) {
            int k = ids_from_logprobs(lp, got_stream + n_s, 256 - n_s);
            if (k > 0) n_s += k;
        }
    }
    CHECKF(n_s == n_want && !memcmp(got_stream, want, sizeof(int32_t) * (size_t)n_want), "stream: %d tokens, want %d",
           n_s, n_want);
    CHECKF(content && st.content && !strcmp(st.content, content), "stream text differs:\n  %s\n  %s", st.content,
           content ? content : "(null)");
    CHECK(st.usage && json_integer_value(json_object_get(st.usage, "completion_tokens")) == n_want);
    CHECK(st.finish && !strcmp(st.finish, fin ? fin : ""));
    CHECK(st.role_first);
    tsrv_stream_free(&st);
    json_decref(r);
}

static void test_chat_matches_engine(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    chat_vs_engine(t, s, 0.0, 1, 24);    /* greedy */
    chat_vs_engine(t, s, 0.9, 1234, 40); /* sampled */
    chat_vs_engine(t, s, 1.5, 99, 40);
}

static void test_cached_tokens(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    /* the same 600-token prompt twice: the second resumes from the prefix cache at the last
     * page boundary (256 positions) before its end, and generates the same tokens */
    json_t *prompt = json_array();
    for (int i = 0; i < 600; i++) json_array_append_new(prompt, json_integer(100 + (i * 37) % 1900));
    json_t *req = json_pack("{s:O,s:i,s:i,s:b}", "prompt", prompt, "max_tokens", 8, "temperature", 0,
                            "return_token_ids", 1);
    char   *b   = json_dumps(req, JSON_COMPACT);
    json_t *r[2] = { NULL, NULL };
    for (int k = 0; k < 2; k++) CHECK(tsrv_post(s, "/v1/completions", b, NULL, &r[k]) == 200);
    int cached[2];
    for (int k = 0; k < 2; k++) {
        json_t *u = json_object_get(r[k], "usage");
        cached[k] = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
        CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 600);
    }
    CHECKF(cached[0] == 0 && cached[1] == 512, "cached_tokens %d then %d, want 0 then 512", cached[0], cached[1]);
    json_t *ids0 = json_object_get(json_array_get(json_object_get(r[0], "choices"), 0), "token_ids");
    json_t *ids1 = json_object_get(json_array_get(json_object_get(r[1], "choices"), 0), "token_ids");
    CHECK(json_array_size(ids0) == 8 && json_equal(ids0, ids1));
    char *text = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    CHECK(text && tsrv_metric(text, "dsv4_prompt_tokens_cached_total") >= 512);
    CHECK(text && tsrv_metric(text, "dsv4_prefix_cache_hit_ratio") > 0);
    CHECK(text && tsrv_metric(text, "dsv4_kv_pages_cached") >= 2);
    free(text);
    free(b);
    json_decref(req);
    json_decref(prompt);
    json_decref(r[0]);
    json_decref(r[1]);
}


/* A 600-token greedy completion with logprobs: its token ids, logprobs and cached tokens. */
static int disk_completion(struct tsrv *s, json_t **ids, json_t **lps)
{
    json_t *prompt = json_array();
    for (int i = 0; i < 600; i++) json_array_append_new(prompt, json_integer(200 + (i * 53) % 1800));
    json_t *req = json_pack("{s:o,s:i,s:i,s:b,s:i}", "prompt", prompt, "max_tokens", 8, "temperature", 0,
                            "return_token_ids", 1, "logprobs", 1);
    char   *b = json_dumps(req, JSON_COMPACT);
    json_t *r = NULL;
    int     cached = -1;
    if (tsrv_post(s, "/v1/completions", b, NULL, &r) == 200) {
        json_t *ch = json_array_get(json_object_get(r, "choices"), 0);
        *ids       = json_incref(json_object_get(ch, "token_ids"));
        *lps       = json_incref(json_object_get(json_object_get(ch, "logprobs"), "token_logprobs"));
        json_t *u  = json_object_get(json_object_get(r, "usage"), "prompt_tokens_details");
        cached     = (int)json_integer_value(json_object_get(u, "cached_tokens"));
    }
    free(b);
    json_decref(req);
    json_decref(r);
    return cached;
}

/* The disk tier's load summary in /metrics: its count and sum (NAN when absent). */
static void disk_loads(struct test_ctx *t, struct tsrv *s, double *count, double *sum)
{
    char *text = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    *count = text ? tsrv_metric(text, "dsv4_kv_disk_load_seconds_count") : NAN;
    *sum   = text ? tsrv_metric(text, "dsv4_kv_disk_load_seconds_sum") : NAN;
    free(text);
}

/* --kv-disk-dir: a second server on the directory is refused at start; after SIGTERM and a
 * restart, the same prompt resumes from disk (cached_tokens 512) with the same tokens and
 * logprobs; the disk counters are in /metrics, the load summary at 0 until the restarted
 * server reads its 2 records. */
static void test_kv_disk_restart(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    char dir[600], args[800], cmd[2000];
    snprintf(dir, sizeof(dir), "%s/srv-kvdisk", t->tmpdir);
    snprintf(args, sizeof(args), "--max-seqs 1 --ctx 2048 --kv-disk-dir %s --kv-disk-budget 64M", dir);
    struct tsrv s;
    json_t     *ids[2] = { NULL, NULL }, *lps[2] = { NULL, NULL };
    int         cached[2] = { -1, -1 };
    for (int k = 0; k < 2; k++) {
        if (!tsrv_start(t, &s, g_dir, args)) break;
        double n0, s0, n1, s1;
        disk_loads(t, &s, &n0, &s0);
        cached[k] = disk_completion(&s, &ids[k], &lps[k]);
        disk_loads(t, &s, &n1, &s1);
        CHECKF(n0 == 0 && s0 == 0, "run %d: disk loads before a request: count %g sum %g", k, n0, s0);
        CHECKF(k ? n1 == 2 && s1 > 0 : n1 == 0 && s1 == 0, "run %d: disk loads after a request: count %g sum %g", k,
               n1, s1);
        if (k == 0) { /* a second process on the directory */
            snprintf(cmd, sizeof(cmd), "timeout 120 %s serve -m %s --port 0 --threads 1 %s 2>&1", getenv("DSV4_BIN"),
                     g_dir, args);
            FILE *f   = popen(cmd, "r");
            char  out[8192] = "";
            size_t n  = f ? fread(out, 1, sizeof(out) - 1, f) : 0;
            out[n]    = 0;
            int st    = f ? pclose(f) : -1;
            CHECKF(st != 0 && strstr(out, dir) && strstr(out, "pid"), "second server on the directory: %d, %s", st,
                   out);
        } else {
            char *text = NULL;
            CHECK(tsrv_get(&s, "/metrics", NULL, &text) == 200);
            CHECKF(text && tsrv_metric(text, "dsv4_kv_disk_hits_total") == 2, "disk hits %g",
                   text ? tsrv_metric(text, "dsv4_kv_disk_hits_total") : -1.0);
            CHECK(text && tsrv_metric(text, "dsv4_kv_disk_bytes_read_total") > 0);
            CHECK(text && tsrv_metric(text, "dsv4_kv_disk_writes_dropped_total") == 0);
            CHECK(text && tsrv_metric(text, "dsv4_kv_disk_refused_total") == 0);
            free(text);
        }
        CHECK(tsrv_stop(&s, SIGTERM, 30) == 0);
    }
    CHECKF(cached[0] == 0 && cached[1] == 512, "cached_tokens %d then %d, want 0 then 512", cached[0], cached[1]);
    CHECK(ids[0] && json_array_size(ids[0]) == 8 && json_equal(ids[0], ids[1]));
    CHECK(lps[0] && json_array_size(lps[0]) == 8 && json_equal(lps[0], lps[1]));
    for (int k = 0; k < 2; k++) {
        json_decref(ids[k]);
        json_decref(lps[k]);
    }
}

static void test_completions(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    /* token-id prompt against dsv4 run */
    int32_t prompt[6] = { 15, 300, 301, 302, 900, 1500 }, want[64], got[64];
    int     n_want = run_engine(t, prompt, 6, 20, 0.7, 42, want, 64);
    json_t *r = NULL;
    CHECK(tsrv_post(s, "/v1/completions",
                    "{\"prompt\":[15,300,301,302,900,1500],\"max_tokens\":20,\"temperature\":0.7,\"seed\":42,"
                    "\"return_token_ids\":true,\"logprobs\":2}",
                    NULL, &r) == 200);
    json_t *ch  = json_array_get(json_object_get(r, "choices"), 0);
    json_t *ids = json_object_get(ch, "token_ids");
    int     n   = 0;
    for (size_t i = 0; i < json_array_size(ids) && n < 64; i++) got[n++] = (int32_t)json_integer_value(json_array_get(ids, i));
    CHECKF(n == n_want && !memcmp(got, want, sizeof(int32_t) * (size_t)n), "completion ids differ (%d vs %d)", n, n_want);
    json_t *lp = json_object_get(ch, "logprobs");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == (size_t)n);
    CHECK(json_array_size(json_object_get(lp, "token_logprobs")) == (size_t)n);
    CHECK(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 0)) >= 1);
    CHECK(json_array_size(json_object_get(lp, "text_offset")) == (size_t)n);
    CHECK(!strcmp(test_str(json_string_value(json_object_get(r, "object"))), "text_completion"));

    /* stop strings: take a piece of a greedy completion's text and ask to stop there */
    json_t *g = NULL;
    CHECK(tsrv_post(s, "/v1/completions", "{\"prompt\":\"the river of light\",\"max_tokens\":30,\"temperature\":0,"
                                          "\"ignore_eos\":true}", NULL, &g) == 200);
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(g, "choices"), 0), "text"));
    CHECK(text && strlen(text) > 12);
    if (text && strlen(text) > 12) {
        char stop[8];
        snprintf(stop, sizeof(stop), "%.4s", text + 8);
        /* only ASCII stops keep this simple */
        bool ascii = true;
        for (int i = 0; stop[i]; i++) ascii &= (unsigned char)stop[i] < 0x80 && stop[i] != '"' && stop[i] != '\\';
        if (ascii) {
            json_t *req = json_pack("{s:s,s:i,s:i,s:b,s:[s,s]}", "prompt", "the river of light", "max_tokens", 30,
                                    "temperature", 0, "ignore_eos", 1, "stop", "\x01never", stop);
            char   *b   = json_dumps(req, JSON_COMPACT);
            json_t *sr  = NULL;
            CHECK(tsrv_post(s, "/v1/completions", b, NULL, &sr) == 200);
            json_t     *c0 = json_array_get(json_object_get(sr, "choices"), 0);
            const char *st = json_string_value(json_object_get(c0, "text"));
            const char *at = strstr(text, stop);
            CHECKF(st && at && strlen(st) == (size_t)(at - text) && !strncmp(st, text, strlen(st)),
                   "stop '%s': got '%s' from '%s'", stop, st ? st : "", text);
            CHECK(!strcmp(test_str(json_string_value(json_object_get(c0, "finish_reason"))), "stop"));
            /* the same streamed */
            json_object_set_new(req, "stream", json_true());
            free(b);
            b = json_dumps(req, JSON_COMPACT);
            struct tsrv_stream ss;
            CHECK(tsrv_stream(s, "/v1/completions", b, NULL, &ss) == 200);
            CHECKF(ss.content && st && !strcmp(ss.content, st), "streamed stop: '%s' vs '%s'", ss.content, st);
            CHECK(ss.finish && !strcmp(ss.finish, "stop"));
            tsrv_stream_free(&ss);
            free(b);
            json_decref(req);
            json_decref(sr);
        }
    }
    json_decref(g);
    json_decref(r);
}

struct bad_case {
    const char *path, *body, *headers;
    int         status;
    const char *needle; /* in error.message */
    const char *param;  /* expected error.param, or NULL */
};

static void check_bad(struct test_ctx *t, struct tsrv *s, const struct bad_case *c)
{
    json_t *r = NULL;
    int     st = c->body ? tsrv_post(s, c->path, c->body, c->headers, &r) : tsrv_get_h(s, c->path, c->headers, &r);
    json_t *e  = json_object_get(r, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    CHECKF(st == c->status, "%s %.60s: status %d, want %d (%s)", c->path, c->body ? c->body : "", st, c->status,
           msg ? msg : "");
    CHECKF(msg && strstr(msg, c->needle), "%s %.60s: message '%s' lacks '%s'", c->path, c->body ? c->body : "",
           msg ? msg : "(none)", c->needle);
    CHECKF(json_is_string(json_object_get(e, "type")), "%s: no error.type", c->path);
    if (c->param) {
        const char *p = json_string_value(json_object_get(e, "param"));
        CHECKF(p && !strcmp(p, c->param), "%s %.60s: param %s, want %s", c->path, c->body ? c->body : "", p ? p : "null",
               c->param);
    }
    json_decref(r);
}

/* Token ids and logprobs of a greedy completion with the given extra fields. */
static int greedy_ids(struct tsrv *s, const char *extra, int32_t *ids, double *lps, int cap)
{
    char body[512];
    snprintf(body, sizeof(body),
             "{\"prompt\":[15,300,301,302,900,1500],\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true,"
             "\"return_token_ids\":true,\"logprobs\":1%s}", extra);
    json_t *r = NULL;
    if (tsrv_post(s, "/v1/completions", body, NULL, &r) != 200) return -1;
    json_t *ch = json_array_get(json_object_get(r, "choices"), 0), *tid = json_object_get(ch, "token_ids");
    json_t *lp = json_object_get(json_object_get(ch, "logprobs"), "token_logprobs");
    int     n  = 0;
    for (; n < cap && n < (int)json_array_size(tid); n++) {
        ids[n] = (int32_t)json_integer_value(json_array_get(tid, (size_t)n));
        lps[n] = json_number_value(json_array_get(lp, (size_t)n));
    }
    json_decref(r);
    return n;
}

/* "speculative": {"draft": K} on a server started with --spec-draft 3: greedy output and
 * logprobs are those without drafts; the counters move; bad values are a 400. */
static void test_speculative(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    struct tsrv s;
    if (!tsrv_start(t, &s, g_dir, "--max-seqs 2 --ctx 512 --spec-draft 3")) return;
    int32_t a[32], b[32], c[32];
    double  la[32], lb[32], lc[32];
    int     na = greedy_ids(&s, ",\"speculative\":{\"draft\":0}", a, la, 32);
    int     nb = greedy_ids(&s, ",\"speculative\":{\"draft\":3}", b, lb, 32);
    int     nc = greedy_ids(&s, "", c, lc, 32); /* the server's default: 3 */
    CHECKF(na == 24 && nb == na && nc == na, "token counts %d %d %d", na, nb, nc);
    CHECK(na > 0 && !memcmp(a, b, sizeof(int32_t) * (size_t)na) && !memcmp(a, c, sizeof(int32_t) * (size_t)na));
    CHECK(na > 0 && !memcmp(la, lb, sizeof(double) * (size_t)na) && !memcmp(la, lc, sizeof(double) * (size_t)na));
    char *text = NULL;
    CHECK(tsrv_get(&s, "/metrics", NULL, &text) == 200);
    const char *at = text ? strstr(text, "\ndsv4_spec_draft_tokens_total ") : NULL;
    CHECKF(at && atof(at + strlen("\ndsv4_spec_draft_tokens_total ")) > 0, "no drafted tokens counted");
    char why[256];
    CHECKF(text && tsrv_prom_validate(text, why, sizeof(why)), "metrics: %s", why);
    free(text);
    static const char *const bad[] = { "{\"prompt\":\"x\",\"speculative\":3}",
                                       "{\"prompt\":\"x\",\"speculative\":{\"draft\":8}}",
                                       "{\"prompt\":\"x\",\"speculative\":{\"draft\":1,\"extra\":2}}",
                                       "{\"prompt\":\"x\",\"speculative\":{\"draft\":\"2\"}}" };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *r = NULL;
        CHECKF(tsrv_post(&s, "/v1/completions", bad[i], NULL, &r) == 400, "%s: not a 400", bad[i]);
        json_decref(r);
    }
    tsrv_stop(&s, 15, 10);
}

/* logit_bias and presence_penalty through /v1/completions, greedy: a bias of 100 on token
 * 700 and 95 on 701 with a presence penalty of 10 gives 700, 701, then 700 for good (the
 * model's own logits are far smaller than these margins). Also with speculation asked. */
static void test_penalties(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    int32_t a[32], b[32];
    double  la[32];
    int     na = greedy_ids(s, ",\"logit_bias\":{\"700\":100}", a, la, 32);
    CHECKF(na == 24, "%d tokens", na);
    for (int i = 0; i < na; i++) CHECKF(a[i] == 700, "token %d is %d with a bias of 100 on 700", i, (int)a[i]);
    int nb = greedy_ids(s, ",\"logit_bias\":{\"700\":100,\"701\":95},\"presence_penalty\":2,\"frequency_penalty\":0", b,
                        la, 32);
    CHECKF(nb == 24, "%d tokens", nb);
    /* presence 2 is too small to flip 100 vs 95: all 700 */
    for (int i = 0; i < nb; i++) CHECKF(b[i] == 700, "presence 2: token %d is %d", i, (int)b[i]);
    nb = greedy_ids(s, ",\"logit_bias\":{\"700\":100,\"701\":95},\"frequency_penalty\":2,\"speculative\":{\"draft\":0}", b,
                    la, 32);
    /* frequency 2: 700 until its logit has lost 5 (3 times), then 701 once, and so on */
    int n700 = 0, n701 = 0;
    for (int i = 0; i < nb; i++) n700 += b[i] == 700, n701 += b[i] == 701;
    CHECKF(nb == 24 && n700 + n701 == 24 && n701 >= 9 && b[0] == 700 && b[1] == 700 && b[2] == 700 && b[3] == 701,
           "frequency 2: %d x 700, %d x 701, starting %d %d %d %d", n700, n701, (int)b[0], (int)b[1], (int)b[2], (int)b[3]);
}

/* n = 3: three choices, each the request alone with seed + i, whole and streamed. */
static void test_n_choices(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    json_t *r = NULL;
    CHECK(tsrv_post(s, "/v1/completions", "{\"prompt\":[15,300,301],\"max_tokens\":12,\"temperature\":1,\"seed\":40,"
                                        "\"n\":3,\"ignore_eos\":true,\"return_token_ids\":true}", NULL, &r) == 200);
    json_t *ch = json_object_get(r, "choices");
    CHECKF(json_array_size(ch) == 3, "%zu choices", json_array_size(ch));
    for (int i = 0; i < 3 && i < (int)json_array_size(ch); i++) {
        json_t *c = json_array_get(ch, (size_t)i);
        CHECK(json_integer_value(json_object_get(c, "index")) == i);
        char    body[256];
        json_t *one = NULL;
        snprintf(body, sizeof(body), "{\"prompt\":[15,300,301],\"max_tokens\":12,\"temperature\":1,\"seed\":%d,"
                 "\"ignore_eos\":true,\"return_token_ids\":true}", 40 + i);
        CHECK(tsrv_post(s, "/v1/completions", body, NULL, &one) == 200);
        json_t *ids1 = json_object_get(json_array_get(json_object_get(one, "choices"), 0), "token_ids");
        CHECKF(json_equal(json_object_get(c, "token_ids"), ids1), "choice %d differs from seed %d alone", i, 40 + i);
        json_decref(one);
    }
    CHECK(json_integer_value(json_object_get(json_object_get(r, "usage"), "completion_tokens")) == 36);
    json_decref(r);
    /* streamed chat: each choice's deltas carry its index, one [DONE], usage summed */
    struct tsrv_stream st;
    CHECK(tsrv_stream(s, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":6,"
                      "\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL, &st) == 200);
    int     seen[2] = { 0 }, finishes = 0;
    size_t  i;
    json_t *c;
    json_array_foreach(st.chunks, i, c) {
        json_t *c0 = json_array_get(json_object_get(c, "choices"), 0);
        if (!c0) continue;
        int idx = (int)json_integer_value(json_object_get(c0, "index"));
        CHECK(idx == 0 || idx == 1);
        if (idx == 0 || idx == 1) seen[idx]++;
        if (json_is_string(json_object_get(c0, "finish_reason"))) finishes++;
    }
    CHECKF(seen[0] > 1 && seen[1] > 1 && finishes == 2 && st.done, "chunks %d %d, finishes %d, done %d", seen[0], seen[1],
           finishes, st.done);
    CHECK(st.usage && json_integer_value(json_object_get(st.usage, "completion_tokens")) > 2);
    tsrv_stream_free(&st);
}

static void test_bad_inputs(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    static const char CC[] = "/v1/chat/completions", CO[] = "/v1/completions";
    static const char U[]  = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char long_prompt[16384];
    size_t k = (size_t)snprintf(long_prompt, sizeof(long_prompt), "{\"prompt\":[");
    for (int i = 0; i < 2100; i++) k += (size_t)snprintf(long_prompt + k, sizeof(long_prompt) - k, "%s7", i ? "," : "");
    snprintf(long_prompt + k, sizeof(long_prompt) - k, "]}");
    char deep[512];
    k = 0;
    k += (size_t)snprintf(deep, sizeof(deep), "{\"messages\":");
    for (int i = 0; i < 80; i++) deep[k++] = '[';
    for (int i = 0; i < 80; i++) deep[k++] = ']';
    snprintf(deep + k, sizeof(deep) - k, "}");
    char b[64][512];
    int  nb = 0;
#define B(...) (snprintf(b[nb], sizeof(b[nb]), __VA_ARGS__), b[nb++])
    const struct bad_case cases[] = {
        { CC, "{\"messages\": [", NULL, 400, "not valid JSON", NULL },
        { CC, "[1,2]", NULL, 400, "JSON object", NULL },
        { CC, "{}", NULL, 400, "'messages'", "messages" },
        { CC, "{\"messages\":[]}", NULL, 400, "non-empty", "messages" },
        { CC, "{\"messages\":\"hi\"}", NULL, 400, "'messages'", "messages" },
        { CC, "{\"messages\":[3]}", NULL, 400, "messages[0]", "messages" },
        { CC, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", NULL, 400, "unknown role", "messages" },
        { CC, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", NULL, 400, "image_url",
          "messages" },
        { CC, B("{%s,\"model\":\"gpt-4\"}", U), NULL, 400, "gpt-4", "model" },
        { CC, B("{%s,\"model\":7}", U), NULL, 400, "'model' must be a string", "model" },
        { CC, B("{%s,\"n\":17}", U), NULL, 400, "'n'", "n" },
        { CC, B("{%s,\"n\":0}", U), NULL, 400, "'n'", "n" },
        { CC, B("{%s,\"temperature\":\"hot\"}", U), NULL, 400, "'temperature' must be a number", "temperature" },
        { CC, B("{%s,\"temperature\":3}", U), NULL, 400, "'temperature' is 3", "temperature" },
        { CC, B("{%s,\"top_p\":0}", U), NULL, 400, "'top_p'", "top_p" },
        { CC, B("{%s,\"top_k\":1.5}", U), NULL, 400, "'top_k' must be an integer", "top_k" },
        { CC, B("{%s,\"max_tokens\":0}", U), NULL, 400, "'max_tokens'", "max_tokens" },
        { CC, B("{%s,\"max_tokens\":100000}", U), NULL, 400, "maximum context length", "max_tokens" },
        { CC, B("{%s,\"stream\":\"yes\"}", U), NULL, 400, "'stream' must be a boolean", "stream" },
        { CC, B("{%s,\"stop\":[1]}", U), NULL, 400, "'stop'", "stop" },
        { CC, B("{%s,\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", U), NULL, 400, "at most",
          "stop" },
        { CC, B("{%s,\"top_logprobs\":3}", U), NULL, 400, "needs 'logprobs'", "top_logprobs" },
        { CC, B("{%s,\"logprobs\":true,\"top_logprobs\":21}", U), NULL, 400, "'top_logprobs'", "top_logprobs" },
        { CC, B("{%s,\"presence_penalty\":2.5}", U), NULL, 400, "presence_penalty", "presence_penalty" },
        { CC, B("{%s,\"repetition_penalty\":0}", U), NULL, 400, "repetition_penalty", "repetition_penalty" },
        { CC, B("{%s,\"logit_bias\":{\"x5\":1}}", U), NULL, 400, "not a token id", "logit_bias" },
        { CC, B("{%s,\"logit_bias\":{\"999999\":1}}", U), NULL, 400, "not a token id", "logit_bias" },
        { CC, B("{%s,\"logit_bias\":{\"5\":101}}", U), NULL, 400, "[-100, 100]", "logit_bias" },
        { CC, B("{%s,\"logit_bias\":[1]}", U), NULL, 400, "must be an object", "logit_bias" },
        { CC, B("{%s,\"tools\":{}}", U), NULL, 400, "'tools' must be an array", "tools" },
        { CC, B("{%s,\"tools\":[{\"type\":\"function\"}]}", U), NULL, 400, "tools[0]", "tools" },
        { CC, B("{%s,\"tool_choice\":\"required\"}", U), NULL, 400, "no tools", "tool_choice" },
        { CC, B("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":"
                "\"function\",\"function\":{\"name\":\"g\"}}}", U), NULL, 400, "not in 'tools'", "tool_choice" },
        { CC, B("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
                "\"reasoning_effort\":\"high\"}", U), NULL, 400, "thinking", "tool_choice" },
        { CC, B("{%s,\"reasoning_effort\":\"extreme\"}", U), NULL, 400, "reasoning_effort", "reasoning_effort" },
        { CC, B("{%s,\"chat_template_kwargs\":{\"thinking\":1}}", U), NULL, 400, "thinking", "chat_template_kwargs" },
        { CC, B("{%s,\"response_format\":{\"type\":\"grammar\"}}", U), NULL, 400, "grammar", "response_format" },
        { CC, B("{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\","
                "\"pattern\":\"a+\"}}}}", U), NULL, 400, "pattern", "response_format" },
        { CC, B("{%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}", U), NULL, 400,
          "json_schema.schema", "response_format" },
        { CC, B("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\","
                "\"response_format\":{\"type\":\"json_object\"}}", U), NULL, 400, "cannot be combined", "response_format" },
        { CC, deep, NULL, 400, "nests", NULL },
        { CC, B("{%s,\"a\":1,\"a\":2}", U), NULL, 400, "duplicate", NULL },
        { CO, "{}", NULL, 400, "'prompt' is required", "prompt" },
        { CO, "{\"prompt\":[]}", NULL, 400, "empty", "prompt" },
        { CO, "{\"prompt\":[1,2,5000]}", NULL, 400, "5000", "prompt" },
        { CO, "{\"prompt\":[1,\"x\"]}", NULL, 400, "prompt[1]", "prompt" },
        { CO, "{\"prompt\":[\"a\",\"b\"]}", NULL, 400, "one per request", "prompt" },
        { CO, "{\"prompt\":{}}", NULL, 400, "'prompt' must be", "prompt" },
        { CO, "{\"prompt\":\"x\",\"logprobs\":true}", NULL, 400, "'logprobs'", "logprobs" },
        { CO, "{\"prompt\":\"x\",\"echo\":true}", NULL, 400, "echo", "echo" },
        { CO, "{\"prompt\":\"x\",\"best_of\":3}", NULL, 400, "best_of", "best_of" },
        { CO, long_prompt, NULL, 400, "maximum context length", "prompt" },
        { "/v1/embeddings", "{}", NULL, 404, "no such endpoint", NULL },
        { "/nothing", NULL, NULL, 404, "no such endpoint", NULL },
        { CC, NULL, NULL, 405, "POST", NULL },
        { "/v1/models", "{}", NULL, 405, "GET", NULL },
    };
#undef B
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) check_bad(t, s, &cases[i]);

    /* 413: declared too large (refused before the upload) and a chunked upload that grows past it */
    struct tsrv small;
    if (tsrv_start(t, &small, g_dir, "--max-body 2000 --api-key sekret")) {
        char *big = malloc(5000);
        memset(big, ' ', 4999);
        big[0] = '{';
        big[4998] = '}';
        big[4999] = '\0';
        struct bad_case c413 = { CC, big, "Authorization: Bearer sekret\r\n", 413, "larger than the limit", NULL };
        check_bad(t, &small, &c413);
        json_t *r = NULL;
        CHECK(tsrv_post_chunked(&small, CC, big, "Authorization: Bearer sekret\r\n", &r) == 413);
        json_decref(r);
        free(big);
        /* 401 without or with a wrong key; health and metrics stay open */
        struct bad_case c401a = { CC, "{}", NULL, 401, "API key", NULL };
        struct bad_case c401b = { CC, "{}", "Authorization: Bearer wrong\r\n", 401, "API key", NULL };
        struct bad_case c401c = { "/v1/models", NULL, "Authorization: Bearer sekre\r\n", 401, "API key", NULL };
        check_bad(t, &small, &c401a);
        check_bad(t, &small, &c401b);
        check_bad(t, &small, &c401c);
        CHECK(tsrv_get_h(&small, "/v1/models", "Authorization: Bearer sekret\r\n", NULL) == 200);
        CHECK(tsrv_get_h(&small, "/v1/models", "x-api-key: sekret\r\n", NULL) == 200);
        tanth_test_api_key(t, &small, "sekret");
        CHECK(tsrv_get(&small, "/health", NULL, NULL) == 200);
        CHECK(tsrv_post(&small, CC, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}",
                        "Authorization: Bearer sekret\r\n", NULL) == 200);
        tsrv_stop(&small, SIGTERM, 10);
    }
    /* still healthy and serving */
    CHECK(tsrv_get(s, "/health", NULL, NULL) == 200);
    CHECK(tsrv_post(s, CC, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":3}", NULL, NULL) == 200);
    char *text = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &text) == 200);
    CHECK(text && strstr(text, "dsv4_http_requests_total{endpoint=\"chat_completions\",status=\"400\"}"));
    free(text);
}

/* ------------------------------------------------------------------ concurrency */

struct conc_arg {
    struct tsrv *s;
    int          i;
    char        *text; /* result */
    int          status;
};

static char *conc_body(int i)
{
    char *b = malloc(512);
    if (i % 2)
        snprintf(b, 512,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"client %d asks about the river\"}],\"max_tokens\":%d,"
                 "\"temperature\":0.8,\"seed\":%d,\"stream\":%s}",
                 i, 8 + i % 9, 100 + i, i % 4 == 1 ? "true" : "false");
    else
        snprintf(b, 512, "{\"prompt\":[%d,%d,%d],\"max_tokens\":%d,\"temperature\":0.5,\"seed\":%d,\"stream\":%s}",
                 20 + i, 40 + i, 60 + i, 6 + i % 7, i, i % 4 == 2 ? "true" : "false");
    return b;
}

/* The request's output as one string: the text (streams concatenated). */
static char *conc_run(struct tsrv *s, int i, int *status)
{
    char       *body = conc_body(i);
    const char *path = i % 2 ? "/v1/chat/completions" : "/v1/completions";
    char       *out  = NULL;
    if (strstr(body, "\"stream\":true")) {
        struct tsrv_stream st;
        *status = tsrv_stream(s, path, body, NULL, &st);
        if (st.done) out = strdup(st.content ? st.content : "");
        tsrv_stream_free(&st);
    } else {
        json_t *r = NULL;
        *status   = tsrv_post(s, path, body, NULL, &r);
        json_t *c = json_array_get(json_object_get(r, "choices"), 0);
        const char *txt = i % 2 ? json_string_value(json_object_get(json_object_get(c, "message"), "content"))
                                : json_string_value(json_object_get(c, "text"));
        out = txt ? strdup(txt) : NULL;
        json_decref(r);
    }
    free(body);
    return out;
}

static void *conc_main(void *p)
{
    struct conc_arg *a = p;
    a->text            = conc_run(a->s, a->i, &a->status);
    return NULL;
}

static void test_concurrent_32(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    enum { N = 32 };
    char *alone[N];
    for (int i = 0; i < N; i++) {
        int st;
        alone[i] = conc_run(s, i, &st);
        CHECKF(st == 200 && alone[i], "request %d alone: %d", i, st);
    }
    struct conc_arg a[N];
    pthread_t       th[N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct conc_arg){ s, i, NULL, 0 };
        pthread_create(&th[i], NULL, conc_main, &a[i]);
    }
    int same = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECKF(a[i].status == 200, "concurrent request %d: status %d", i, a[i].status);
        bool eq = a[i].text && alone[i] && !strcmp(a[i].text, alone[i]);
        CHECKF(eq, "concurrent request %d: '%s' vs alone '%s'", i, a[i].text ? a[i].text : "(none)",
               alone[i] ? alone[i] : "(none)");
        same += eq;
        free(a[i].text);
        free(alone[i]);
    }
    CHECK(same == N);
    CHECK(tsrv_wait_idle(s, 5.0));
}

/* ------------------------------------------------------------------ queue, keep-alive, disconnect */

static void test_queue_full_and_keepalive(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    struct tsrv s;
    if (!tsrv_start(t, &s, g_dir, "--max-seqs 1 --max-queue 1 --ctx 4096 --keepalive 0.05")) return;
    const char *longreq = "{\"prompt\":[5,6,7],\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true}";
    struct http_conn a, b;
    char             err[256];
    bool             oa = http_open(&a, "127.0.0.1", s.port, "POST", "/v1/completions", NULL, longreq, strlen(longreq), 30,
                                    err, sizeof(err)) == 0;
    CHECKF(oa && a.status == 200, "first stream: %s", err);
    const char *data;
    size_t      len;
    int         ev_a = 0;
    while (oa && (ev_a = http_sse_next(&a, &data, &len)) == 2) {} /* keep-alive comments, if slow */
    CHECK(oa && ev_a == 1); /* running */
    bool ob = http_open(&b, "127.0.0.1", s.port, "POST", "/v1/completions", NULL, longreq, strlen(longreq), 30, err,
                        sizeof(err)) == 0;
    CHECKF(ob && b.status == 200, "second stream: %s", err);
    /* b waits in the queue: keep-alive comments arrive before any token */
    int comments = 0, ev = 0;
    for (int i = 0; ob && i < 3 && (ev = http_sse_next(&b, &data, &len)) == 2; i++) comments++;
    CHECKF(comments == 3, "keep-alive comments while queued: %d (last event %d)", comments, ev);
    /* a third one finds the queue full */
    json_t *r = NULL;
    char    retry[32] = "";
    int     st = tsrv_post_retry(&s, "/v1/completions", "{\"prompt\":[1],\"max_tokens\":2}", &r, retry, sizeof(retry));
    CHECKF(st == 429, "third request: %d", st);
    CHECK(!strcmp(retry, "1"));
    const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
    CHECK(msg && strstr(msg, "busy"));
    json_decref(r);
    if (oa) http_close(&a);
    if (ob) http_close(&b);
    CHECK(tsrv_wait_idle(&s, 5.0));
    char *text = NULL;
    CHECK(tsrv_get(&s, "/metrics", NULL, &text) == 200);
    CHECK(text && strstr(text, "status=\"429\"} 1"));
    CHECK(text && tsrv_metric(text, "dsv4_requests_finished_total{reason=\"cancelled\"}") == 2);
    free(text);
    CHECK(tsrv_stop(&s, SIGTERM, 10) == 0);
}

static void test_disconnect_frees(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    char *before = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &before) == 200);
    double cancelled0 = before ? tsrv_metric(before, "dsv4_requests_finished_total{reason=\"cancelled\"}") : 0;
    const char *sreq = "{\"prompt\":[9,9,9],\"max_tokens\":500,\"ignore_eos\":true,\"stream\":true}";
    const char *wreq = "{\"prompt\":[8,8,8],\"max_tokens\":500,\"ignore_eos\":true}";
    double gen0 = before ? tsrv_metric(before, "dsv4_generation_tokens_total") : 0;
    struct http_conn a;
    char             err[256];
    CHECK(http_open(&a, "127.0.0.1", s->port, "POST", "/v1/completions", NULL, sreq, strlen(sreq), 30, err, sizeof(err)) == 0);
    const char *data;
    size_t      len;
    for (int i = 0; i < 3; i++) CHECK(http_sse_next(&a, &data, &len) == 1);
    /* b waits for its whole answer; give it a moment to start, then both go away */
    int b = tsrv_send_only(s, "/v1/completions", wreq);
    CHECK(b >= 0);
    CHECK(tsrv_wait_metric(s, "dsv4_requests_running{tier=\"short\"}", 2, 5.0));
    http_close(&a);
    if (b >= 0) close(b);
    CHECK(tsrv_wait_idle(s, 5.0));
    char *after = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &after) == 200);
    CHECKF(after && tsrv_metric(after, "dsv4_requests_finished_total{reason=\"cancelled\"}") >= cancelled0 + 2,
           "cancelled before %g, after %g", cancelled0,
           after ? tsrv_metric(after, "dsv4_requests_finished_total{reason=\"cancelled\"}") : 0);
    /* both generations stopped early: far fewer than 2 x 500 tokens */
    double gen = after ? tsrv_metric(after, "dsv4_generation_tokens_total") - gen0 : 0;
    CHECKF(gen < 800, "%g tokens generated for two cancelled requests", gen);
    free(after);
    free(before);
}

/* A client that stops reading: its request is cut once stream_buffer tokens wait unsent,
 * its sequence freed, and another client is served meanwhile. */
static void test_slow_client(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    struct tsrv s;
    if (!tsrv_start(t, &s, g_dir, "--max-seqs 2 --stream-buffer 4")) return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 1024;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s.port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    const char *body = "{\"prompt\":[4,5,6],\"max_tokens\":3000,\"ignore_eos\":true,\"stream\":true,\"logprobs\":5}";
    char        req[512];
    int n = snprintf(req, sizeof(req), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    CHECK(send(fd, req, (size_t)n, 0) == n);
    /* not reading: the request is cut while another one is served */
    json_t *r = NULL;
    CHECK(tsrv_post(&s, "/v1/completions", "{\"prompt\":[1,2],\"max_tokens\":5}", NULL, &r) == 200);
    json_decref(r);
    CHECK(tsrv_wait_metric(&s, "dsv4_requests_finished_total{reason=\"slow_client\"}", 1, 10.0));
    CHECK(tsrv_wait_idle(&s, 5.0));
    /* reading now, the stream ends with an error event and [DONE] */
    char   buf[65536];
    size_t got = 0;
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 5000) <= 0) break;
        ssize_t k = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
        if (got > sizeof(buf) - 2) got = 0; /* keep the tail */
        buf[got] = '\0';
        if (strstr(buf, "[DONE]")) break;
    }
    buf[got] = '\0';
    CHECKF(strstr(buf, "did not read the stream fast enough") && strstr(buf, "data: [DONE]"), "tail: %.300s",
           got > 300 ? buf + got - 300 : buf);
    close(fd);
    CHECK(tsrv_stop(&s, SIGTERM, 10) == 0);
}

/* A connection that stalls mid-request is closed after --idle-timeout; a model directory
 * that cannot load ends the process with status 1 and the reason. */
static void test_timeouts_and_load_failure(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    struct tsrv s;
    if (tsrv_start(t, &s, g_dir, "--idle-timeout 1")) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s.port),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
        const char *part = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\":";
        CHECK(send(fd, part, strlen(part), 0) == (ssize_t)strlen(part));
        /* closed within a few seconds (libmicrohttpd may answer something first) */
        bool closed = false;
        for (int i = 0; i < 10 && !closed; i++) {
            struct pollfd p = { .fd = fd, .events = POLLIN };
            char          buf[512];
            if (poll(&p, 1, 1000) == 1) closed = recv(fd, buf, sizeof(buf), 0) <= 0;
        }
        CHECKF(closed, "the stalled connection was not closed");
        close(fd);
        CHECK(tsrv_get(&s, "/health", NULL, NULL) == 200);
        CHECK(tsrv_stop(&s, SIGTERM, 10) == 0);
    }
    const char *bin = getenv("DSV4_BIN");
    char        cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd), "%s serve -m '%s/no-such-model' --port 0", bin ? bin : "dsv4", t->tmpdir);
    int st = test_run(cmd, &out);
    CHECKF(st == 1 && out && strstr(out, "no-such-model"), "load failure: status %d, %s", st, out ? out : "");
    free(out);
}

/* ------------------------------------------------------------------ drain */

struct drain_arg {
    struct tsrv *s;
    int          i;
    int          status;
    bool         done;
    int          n_tokens;
};

static void *drain_client(void *p)
{
    struct drain_arg *a = p;
    char              body[256];
    snprintf(body, sizeof(body), "{\"prompt\":[%d,3,4],\"max_tokens\":300,\"ignore_eos\":true,\"stream\":%s}", 30 + a->i,
             a->i % 2 ? "true" : "false");
    if (a->i % 2) {
        struct tsrv_stream st;
        a->status   = tsrv_stream(a->s, "/v1/completions", body, NULL, &st);
        a->done     = st.done && st.finish && !strcmp(st.finish, "length");
        a->n_tokens = st.usage ? 0 : -1;
        tsrv_stream_free(&st);
    } else {
        json_t *r = NULL;
        a->status = tsrv_post(a->s, "/v1/completions", body, NULL, &r);
        const char *f = json_string_value(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "finish_reason"));
        a->done       = f && !strcmp(f, "length");
        json_decref(r);
    }
    return NULL;
}

/* True once connections to port are refused (the server closed its listening socket). */
static bool refused_soon(int port, double timeout_s)
{
    struct timespec ts = { 0, 10 * 1000 * 1000 };
    for (int i = 0; i < (int)(timeout_s * 100); i++) {
        char err[256];
        int  st = http_request("127.0.0.1", port, "GET", "/health", NULL, NULL, NULL, NULL, 2, err, sizeof(err));
        if (st == -1) return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

static void test_sigterm_drain(struct test_ctx *t)
{
    if (!model_dir(t)) return;
    struct tsrv s;
    if (!tsrv_start(t, &s, g_dir, "--max-seqs 2 --max-queue 8 --drain-timeout 60")) return;
    enum { N = 4 };
    struct drain_arg a[N];
    pthread_t        th[N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct drain_arg){ &s, i, 0, false, 0 };
        pthread_create(&th[i], NULL, drain_client, &a[i]);
    }
    CHECK(tsrv_wait_metric(&s, "dsv4_requests_running{tier=\"short\"}", 2, 5.0));
    /* and the other two accepted and queued: a client whose request is not in yet when the
     * signal comes is rightly refused, which is not what this test is about */
    CHECK(tsrv_wait_metric(&s, "dsv4_requests_waiting{tier=\"short\"}", 2, 5.0));
    kill(s.sig_pid, SIGTERM);
    /* new connections are refused once draining */
    CHECK(refused_soon(s.port, 5.0));
    char err[256];
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECKF(a[i].status == 200 && a[i].done, "request %d during drain: status %d, finished %d", i, a[i].status,
               a[i].done);
    }
    CHECK(tsrv_stop(&s, 0, 20) == 0); /* exits 0 by itself */

    /* a second signal exits at once */
    if (!tsrv_start(t, &s, g_dir, "--max-seqs 1 --drain-timeout 60")) return;
    struct http_conn c;
    const char      *req = "{\"prompt\":[5],\"max_tokens\":4000,\"ignore_eos\":true,\"stream\":true}";
    CHECK(http_open(&c, "127.0.0.1", s.port, "POST", "/v1/completions", NULL, req, strlen(req), 30, err, sizeof(err)) == 0);
    const char *data;
    size_t      len;
    CHECK(http_sse_next(&c, &data, &len) == 1);
    kill(s.sig_pid, SIGTERM);
    CHECK(refused_soon(s.port, 5.0)); /* draining: the first signal was seen */
    kill(s.sig_pid, SIGTERM);
    int code = tsrv_stop(&s, 0, 5);
    CHECKF(code == 128 + SIGTERM, "second SIGTERM: exit %d", code);
    http_close(&c);
}

/* ------------------------------------------------------------------ OpenAI node client */

/* A node script of tests/server against the main server: BASE_URL MODEL CANNED_DIR. */
static void run_node_client(struct test_ctx *t, const char *script, const char *base_path)
{
    struct tsrv *s = main_server(t);
    if (!s) return;
    char canned[600];
    snprintf(canned, sizeof(canned), "%s/canned", t->tmpdir);
    CHECKF(tsrv_write_canned(canned, g_dir), "writing canned responses to %s", canned);
    char cmd[2048], *out = NULL;
    /* sanitizer builds: the clients make fewer requests of each kind (DSV4_TEST_SCALE) */
    snprintf(cmd, sizeof(cmd), "DSV4_TEST_SCALE=%s node tests/server/%s http://127.0.0.1:%d%s srv-tiny '%s'",
             TEST_SANITIZED ? "small" : "full", script, s->port, base_path, canned);
    int st = test_run(cmd, &out);
    CHECKF(st == 0, "%s: %s", script, out ? out : "");
    free(out);
}

static void test_openai_client(struct test_ctx *t)
{
    run_node_client(t, "openai_client.mjs", "/v1");
}

/* ------------------------------------------------------------------ Anthropic */

static void test_messages_api(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (s) tanth_test_messages_api(t, s);
}

static void test_responses_api(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (s) tresp_test_responses_api(t, s);
}

static void test_turn_cache(struct test_ctx *t)
{
    struct tsrv *s = main_server(t);
    if (s) tresp_test_turn_cache(t, s);
}

static void test_responses_store(struct test_ctx *t)
{
    if (model_dir(t)) tresp_test_store_bound(t, g_dir);
}

static void test_max_tokens_rule(struct test_ctx *t)
{
    if (model_dir(t)) tlim_test_max_tokens(t, g_dir);
}

static void test_standby_signal(struct test_ctx *t)
{
    if (model_dir(t)) tsby_test_signal(t, g_dir);
}

static void test_standby_endpoint(struct test_ctx *t)
{
    if (model_dir(t)) tsby_test_endpoint(t, g_dir);
}

static void test_weights_mapped(struct test_ctx *t)
{
    if (model_dir(t)) tsby_test_weights_mapped(t, g_dir);
}

static void test_constrained_client(struct test_ctx *t)
{
    run_node_client(t, "constrained_client.mjs", "/v1");
}

static void test_anthropic_client(struct test_ctx *t)
{
    run_node_client(t, "anthropic_client.mjs", "");
}

static void test_engine_options(struct test_ctx *t)
{
    if (model_dir(t)) tsrv_test_engine_options(t, g_dir);
}

static void test_model_commands_options(struct test_ctx *t)
{
    if (model_dir(t)) tsrv_test_model_commands_options(t, g_dir);
}

/* The main server, after all of the above, drains and exits 0 (and, in sanitizer builds,
 * without leaks or errors). */
static void test_clean_exit(struct test_ctx *t)
{
    if (!main_server(t)) return; /* started here when no earlier test did (one group run alone) */
    g_main_up = false;
    int code  = tsrv_stop(&g_main, SIGTERM, 20);
    CHECKF(code == 0, "exit status %d after SIGTERM (log: %s)", code, g_main.log);
}

const struct test_case test_group_server[] = {
    { "out_tool_calls", tsrv_test_out_tool_calls },
    { "out_stop_strings", tsrv_test_out_stop_strings },
    { "out_no_markup", tsrv_test_out_no_markup },
    { "job_ring", tsrv_test_job_ring },
    { "prom_validator", tsrv_test_prom_validator },
    { "out_messages", tanth_test_out_messages },
    { "out_forced_tool", tanth_test_out_forced },
    { "out_responses", tresp_test_out_responses },
    { "health_models_metrics", test_health_models_metrics },
    { "process_metrics", test_process_metrics },
    { "chat_matches_engine", test_chat_matches_engine },
    { "cached_tokens", test_cached_tokens },
    { "kv_disk_restart", test_kv_disk_restart },
    { "completions", test_completions },
    { "speculative", test_speculative },
    { "penalties_and_bias", test_penalties },
    { "n_choices", test_n_choices },
    { "bad_inputs", test_bad_inputs },
    { "concurrent_32", test_concurrent_32 },
    { "queue_full_and_keepalive", test_queue_full_and_keepalive },
    { "disconnect_frees", test_disconnect_frees },
    { "slow_client", test_slow_client },
    { "timeouts_and_load_failure", test_timeouts_and_load_failure },
    { "sigterm_drain", test_sigterm_drain },
    { "standby_signal", test_standby_signal },
    { "standby_endpoint", test_standby_endpoint },
    { "weights_mapped", test_weights_mapped },
    { "engine_options", test_engine_options },
    { "model_commands_options", test_model_commands_options },
    { "openai_client", test_openai_client, TEST_NEEDS_NPM_SERVER },
    { "messages_api", test_messages_api },
    { "responses_api", test_responses_api },
    { "responses_store_bound", test_responses_store },
    { "max_tokens_rule", test_max_tokens_rule },
    { "turn_cache", test_turn_cache },
    { "anthropic_client", test_anthropic_client, TEST_NEEDS_NPM_SERVER },
    { "constrained_client", test_constrained_client, TEST_NEEDS_NPM_SERVER },
    { "clean_exit", test_clean_exit },
    { NULL, NULL },
};
