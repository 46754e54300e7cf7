/*
 * cmd_serve.c - `dsv4 serve`: the OpenAI-compatible HTTP server (src/server/, see
 * docs/SERVER.md) and its process life: options, start-up, signals and drain.
 *
 * Signals are handled synchronously: SIGTERM and SIGINT are blocked in every thread (the
 * mask is set before any thread starts) and the main thread collects them with
 * sigtimedwait. The first one drains: no new connections, in-flight requests finish until
 * --drain-timeout, then exit 0. A second one exits at once (status 128 + signal).
 * SIGUSR1 promotes a hot standby (--standby; docs/DEPLOY.md "Hot standby").
 */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "server/server.h"

/* Everything the options set: the server's parameters (the engine's among them) and the
 * process's own. */
struct serve_opts {
    struct srv_params p;
    double            drain_s;
    bool              verbose;
    bool              no_key_ok;
};

static bool set_tiers(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    int *t = (int *)(void *)((char *)base + o->off);
    if (sscanf(v, "%d,%d", &t[0], &t[1]) != 2 || t[0] < 1 || t[1] < t[0]) {
        fprintf(stderr, "dsv4 %s: --tier-tokens wants A,B with 1 <= A <= B\n", cmd);
        return false;
    }
    return true;
}

static bool set_cors(const struct cli_opt *o, const char *cmd, const char *v, void *base)
{
    if (!v[0] || strpbrk(v, "\r\n")) {
        fprintf(stderr, "dsv4 %s: --cors-origin wants an origin such as https://app.example or '*'\n", cmd);
        return false;
    }
    *(const char **)(void *)((char *)base + o->off) = v;
    return true;
}

#define SO(field) offsetof(struct serve_opts, field)
static const struct cli_opt SERVE_OPTS[] = {
    { "--model", "-m", "DIR", "checkpoint directory (tokenizer.json in it for chat)", CLI_STR, SO(p.model_dir), 0, 0, NULL },
    { "--host", NULL, "ADDR", "address to bind (default 127.0.0.1)", CLI_STR, SO(p.host), 0, 0, NULL },
    { "--port", NULL, "N", "TCP port (default 8000; 0 = any free port, printed at start)", CLI_INT, SO(p.port), 0, 65535,
      NULL },
    { "--api-key", NULL, "KEY",
      "require 'Authorization: Bearer KEY' on /v1/* (or env DSV4_API_KEY);\nan empty key is an error", CLI_STR,
      SO(p.api_key), 0, 0, NULL },
    { "--insecure-no-key", NULL, NULL, "serve a non-loopback --host without an API key, without the warning", CLI_FLAG,
      SO(no_key_ok), 0, 0, NULL },
    { "--cors-origin", NULL, "ORIGIN", "allow browsers from ORIGIN ('*' for any) on /v1/*, with preflight (default off)",
      CLI_CALL, SO(p.cors_origin), 0, 0, set_cors },
    { "--no-webui", NULL, NULL, "no chat page at / (default: served, see docs/SERVER.md)", CLI_FLAG, SO(p.no_webui), 0,
      0, NULL },
    { "--special-tokens-in-messages", NULL, NULL,
      "trusted callers only: special-token text in chat messages\nbecomes control tokens (default: it is ordinary text)",
      CLI_FLAG, SO(p.special_in_messages), 0, 0, NULL },
    { "--served-model-name", NULL, "S", "model id in the API (default: the directory's name)", CLI_STR, SO(p.model_name),
      0, 0, NULL },
    { "--max-seqs", NULL, "N", "sequences generated at once (default 8)", CLI_INT, SO(p.max_seqs), 1, 4096, NULL },
    { "--ctx", NULL, "N", "tokens per sequence, prompt + completion (default 4096)", CLI_INT, SO(p.ctx), 2, 1 << 30, NULL },
    { "--max-queue", NULL, "N", "accepted requests that may wait; more get 429 (default 64)", CLI_INT, SO(p.max_queue), 1,
      1 << 20, NULL },
    { "--max-batch-tokens", NULL, "N", "token rows per step: decode rows + prefill chunks (default 512)", CLI_INT,
      SO(p.max_batch_tokens), 1, 1 << 20, NULL },
    { "--max-prefill-tokens", NULL, "N", "prefill rows per step while others decode (default 128, 0 = no bound)", CLI_INT,
      SO(p.max_prefill_tokens), 0, 1 << 20, NULL },
    { "--prefill-share", NULL, "F", "prefill time per step, as a share of a decode step (default 1, 0 = off)", CLI_FLOAT,
      SO(p.prefill_share), 0, 1000, NULL },
    { "--kv-pages", NULL, "N", "KV pages of 256 positions (default: every sequence at full context)", CLI_INT,
      SO(p.kv_pages), 1, 1 << 30, NULL },
    { "--prefix-cache", NULL, "N", "prefix-cache entries (default 4 per sequence, 0 = off)", CLI_INT,
      SO(p.prefix_entries), 0, 1 << 24, NULL },
    { "--kv-disk-dir", NULL, "DIR",
      "prefix cache on disk in DIR: kept across restarts (docs/SERVING.md\n\"Disk tier\"; one process per directory)",
      CLI_STR, SO(p.kv_disk_dir), 0, 0, NULL },
    { "--kv-disk-budget", NULL, "SIZE", "bytes the disk tier may take (suffix K, M, G, T; default 10G)", CLI_BYTES,
      SO(p.kv_disk_budget), 1 << 20, 1e18, NULL },
    { "--keep-finished", NULL, "N",
      "finished sequences kept as they ended, so that the next turn of a\nconversation resumes at their end (default: "
      "max-seqs, 0 = off)",
      CLI_INT, SO(p.keep_finished), 0, 4096, NULL },
    { "--spec-draft", NULL, "K",
      "speculative decoding: tokens the MTP block drafts per step (0 = off;\ndefault off; per request \"speculative\": "
      "{\"draft\": K})",
      CLI_INT, SO(p.spec_draft), 0, DSV4_SPEC_MAX_DRAFT, NULL },
    { "--tier-tokens", NULL, "A,B", "prompts up to A tokens are short, up to B medium, longer long (512,4096)", CLI_CALL,
      SO(p.tier_tokens), 0, 0, set_tiers },
    { "--mem-limit", NULL, "MIB", "memory the KV plan may take (default: free memory less the weights)", CLI_MIB,
      SO(p.mem_limit), 1, 1 << 30, NULL },
    { "--max-conns", NULL, "N", "open HTTP connections (default 256; 4 more are kept for /health, /metrics)", CLI_INT,
      SO(p.max_conns), 1, 1 << 16, NULL },
    { "--max-conns-per-ip", NULL, "N", "open connections from one client address (default 64, 0 = no bound)", CLI_INT,
      SO(p.max_conns_per_ip), 0, 1 << 16, NULL },
    { "--idle-timeout", NULL, "S", "close connections idle or stalled for S seconds (default 60)", CLI_INT,
      SO(p.idle_timeout_s), 1, 86400, NULL },
    { "--request-timeout", NULL, "S", "a request (headers and body) must arrive within S seconds (default 30)",
      CLI_DOUBLE, SO(p.request_timeout_s), 0.1, 86400, NULL },
    { "--max-body", NULL, "BYTES", "request body limit, 413 above (default 4194304)", CLI_SIZE, SO(p.max_body), 1,
      (double)(1LL << 34), NULL },
    { "--max-json-depth", NULL, "N", "JSON nesting limit, 400 above (default 64)", CLI_INT, SO(p.max_json_depth), 1,
      10000, NULL },
    { "--responses-store", NULL, "N", "/v1/responses kept for previous_response_id (default 256)", CLI_INT,
      SO(p.responses_store), 1, 1 << 20, NULL },
    { "--responses-store-mb", NULL, "M", "and at most M MiB of their conversations (default 64)", CLI_INT,
      SO(p.responses_store_mb), 1, 1 << 20, NULL },
    { "--keepalive", NULL, "S", "SSE comment after S seconds without output (default 5)", CLI_DOUBLE, SO(p.keepalive_s),
      0.01, 3600, NULL },
    { "--stream-buffer", NULL, "N", "unsent tokens a stream may lag before it is cut (default 4096)", CLI_INT,
      SO(p.stream_buffer), 1, 1 << 24, NULL },
    { "--send-buffer", NULL, "BYTES", "kernel send buffer per connection (default 65536)", CLI_INT, SO(p.send_buffer),
      4096, 1 << 30, NULL },
    { "--drain-timeout", NULL, "S", "on SIGTERM, wait up to S seconds for in-flight requests (default 30)", CLI_DOUBLE,
      SO(drain_s), 0, 86400, NULL },
    { "--standby", NULL, NULL,
      "hot standby: load and warm the model, answer 503 \"standby\" until\npromoted by SIGUSR1 or POST /admin/promote "
      "(with --api-key)",
      CLI_FLAG, SO(p.standby), 0, 0, NULL },
    { "--lazy-weights", NULL, NULL,
      "do not read and map every weight page before answering (faster start;\nthe first requests then fault them in)",
      CLI_FLAG, SO(p.lazy_weights), 0, 0, NULL },
    { "-v", NULL, NULL, "log debug messages", CLI_FLAG, SO(verbose), 0, 0, NULL },
};
#undef SO

static void log_stderr(void *ud, enum dsv4_log_level level, const char *msg)
{
    bool verbose = *(const bool *)ud;
    if (level > DSV4_LOG_INFO && !verbose) return;
    static const char *const names[] = { "error", "warning", "info", "debug" };
    fprintf(stderr, "dsv4 serve: %s: %s\n", names[level], msg);
}

/* 127.0.0.0/8, ::1 and localhost; anything else (0.0.0.0, a LAN address, a name) is reachable
 * from elsewhere. */
static bool is_loopback(const char *host)
{
    return !host || !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost") ||
           !strcmp(host, "[::1]");
}

/* The options after parsing: the checks that span several, and the warnings. 2 on an error. */
static int check_opts(const struct cli_spec *spec, struct serve_opts *o)
{
    struct srv_params *p = &o->p;
    if (!p->model_dir) return cli_usage_error(spec, "-m DIR is required");
    /* Authentication fails closed: an empty key would silently turn it off. */
    if (p->api_key && !p->api_key[0]) {
        fprintf(stderr, "dsv4 serve: the API key is empty (--api-key \"\" or DSV4_API_KEY=): give a key, or unset "
                        "it to serve without authentication\n");
        return 2;
    }
    if (!p->api_key && !o->no_key_ok && !is_loopback(p->host))
        fprintf(stderr, "dsv4 serve: warning: listening on %s without an API key: anyone who can reach it can use "
                        "the model (--api-key KEY, or --insecure-no-key to accept this)\n", p->host);
    return 0;
}

/* Waits for signals and the worker until the server is drained or failed; the exit status. */
static int run_server(struct srv *s, sigset_t *set, double drain_s)
{
    struct dsv4_err err;
    bool            ready = false, standby = false, draining = false;
    double          deadline = 0;
    for (;;) {
        struct timespec tick = { 0, 100 * 1000 * 1000 };
        int             sig  = sigtimedwait(set, NULL, &tick);
        if (sig == SIGUSR1) {
            fprintf(stderr, "dsv4 serve: SIGUSR1: %s\n", srv_promote(s) ? "promoted" : "not in standby, nothing to do");
        } else if (sig > 0) {
            if (draining) {
                fprintf(stderr, "dsv4 serve: second signal: exiting now\n");
                _exit(128 + sig);
            }
            draining = true;
            deadline = cli_now() + drain_s;
            srv_drain(s);
            fprintf(stderr, "dsv4 serve: draining: %d request(s) in flight, up to %.0f s\n", srv_in_flight(s), drain_s);
        }
        enum srv_state st = srv_get_state(s, &err);
        if (st == SRV_STATE_FAILED) {
            fprintf(stderr, "dsv4 serve: %s\n", err.msg);
            srv_stop(s);
            return 1;
        }
        if (!standby && st == SRV_STATE_STANDBY) {
            standby = true;
            printf("dsv4 serve: standby: loaded and warm, promote with SIGUSR1 or POST /admin/promote\n");
            fflush(stdout);
        }
        if (!ready && st == SRV_STATE_READY) {
            ready = true;
            printf("dsv4 serve: ready\n");
            fflush(stdout);
        }
        if (draining) {
            int left = srv_in_flight(s);
            if (left == 0 || cli_now() >= deadline) {
                if (left) fprintf(stderr, "dsv4 serve: drain deadline: cutting %d request(s)\n", left);
                srv_stop(s);
                fprintf(stderr, "dsv4 serve: drained, exiting\n");
                return 0;
            }
        }
    }
}

int cmd_serve(int argc, char **argv)
{
    struct serve_opts o = { .drain_s = 30 };
    srv_params_default(&o.p);
    o.p.api_key = getenv("DSV4_API_KEY");
    cli_engine_params(&o.p.engine); /* the backend choices: defaults, environment, then flags */
    const struct cli_group groups[] = {
        { NULL, SERVE_OPTS, sizeof(SERVE_OPTS) / sizeof(SERVE_OPTS[0]), &o },
        cli_engine_group(&o.p.engine, true),
    };
    const struct cli_spec spec = { "serve", "usage: dsv4 serve -m DIR [options]\n", groups, 2, NULL };
    int                   rc   = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED) return rc;
    if ((rc = check_opts(&spec, &o))) return rc;
    o.p.log    = log_stderr;
    o.p.log_ud = &o.verbose;

    /* Before any thread exists: every thread inherits the blocked signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct srv     *s;
    struct dsv4_err err;
    if (srv_start(&s, &o.p, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 1;
    }
    printf("dsv4 serve: listening on http://%s:%d (model %s loading)\n", o.p.host, srv_port(s), o.p.model_dir);
    fflush(stdout);
    return run_server(s, &set, o.drain_s);
}
