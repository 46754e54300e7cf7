/*
 * cmd_serve.c - `dsv4 serve`: the OpenAI-compatible HTTP server (src/server/, see
 * docs/SERVER.md) and its process life: options, start-up, signals and drain.
 *
 * Signals are handled synchronously: SIGTERM and SIGINT are blocked in every thread (the
 * mask is set before any thread starts) and the main thread collects them with
 * sigtimedwait. The first one drains: no new connections, in-flight requests finish until
 * --drain-timeout, then exit 0. A second one exits at once (status 128 + signal).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "server/server.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsv4 serve -m DIR [options]\n"
            "  -m DIR                 checkpoint directory (tokenizer.json in it for chat)\n"
            "  --host ADDR            address to bind (default 127.0.0.1)\n"
            "  --port N               TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --api-key KEY          require 'Authorization: Bearer KEY' on /v1/* (or env DSV4_API_KEY);\n"
            "                         an empty key is an error\n"
            "  --insecure-no-key      serve a non-loopback --host without an API key, without the warning\n"
            "  --cors-origin ORIGIN   allow browsers from ORIGIN ('*' for any) on /v1/*, with preflight (default off)\n"
            "  --special-tokens-in-messages  trusted callers only: special-token text in chat messages\n"
            "                         becomes control tokens (default: it is ordinary text)\n"
            "  --served-model-name S  model id in the API (default: the directory's name)\n"
            "  --max-seqs N           sequences generated at once (default 8)\n"
            "  --ctx N                tokens per sequence, prompt + completion (default 4096)\n"
            "  --max-queue N          accepted requests that may wait; more get 429 (default 64)\n"
            "  --max-batch-tokens N   token rows per step: decode rows + prefill chunks (default 512)\n"
            "  --max-prefill-tokens N prefill rows per step while others decode (default 128, 0 = no bound)\n"
            "  --prefill-share F      prefill time per step, as a share of a decode step (default 1, 0 = off)\n"
            "  --kv-pages N           KV pages of 256 positions (default: every sequence at full context)\n"
            "  --prefix-cache N       prefix-cache entries (default 4 per sequence, 0 = off)\n"
            "  --keep-finished N      finished sequences kept as they ended, so that the next turn of a\n"
            "                         conversation resumes at their end (default: max-seqs, 0 = off)\n"
            "  --spec-draft K         speculative decoding: tokens the MTP block drafts per step (0 = off;\n"
            "                         default off; per request \"speculative\": {\"draft\": K})\n"
            "  --tier-tokens A,B      prompts up to A tokens are short, up to B medium, longer long (512,4096)\n"
            "  --mem-limit MIB        memory the KV plan may take (default: free memory less the weights)\n"
            "  --threads N            engine CPU threads (default: all)\n"
            "  --max-conns N          open HTTP connections (default 256; 4 more are kept for /health, /metrics)\n"
            "  --max-conns-per-ip N   open connections from one client address (default 64, 0 = no bound)\n"
            "  --idle-timeout S       close connections idle or stalled for S seconds (default 60)\n"
            "  --request-timeout S    a request (headers and body) must arrive within S seconds (default 30)\n"
            "  --max-body BYTES       request body limit, 413 above (default 4194304)\n"
            "  --max-json-depth N     JSON nesting limit, 400 above (default 64)\n"
            "  --responses-store N    /v1/responses kept for previous_response_id (default 256)\n"
            "  --responses-store-mb M and at most M MiB of their conversations (default 64)\n"
            "  --keepalive S          SSE comment after S seconds without output (default 5)\n"
            "  --stream-buffer N      unsent tokens a stream may lag before it is cut (default 4096)\n"
            "  --send-buffer BYTES    kernel send buffer per connection (default 65536)\n"
            "  --drain-timeout S      on SIGTERM, wait up to S seconds for in-flight requests (default 30)\n"
            "  -v                     log debug messages\n" CLI_ENGINE_USAGE);
}

static void log_stderr(void *ud, enum dsv4_log_level level, const char *msg)
{
    int verbose = *(const int *)ud;
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

int cmd_serve(int argc, char **argv)
{
    struct srv_params p;
    srv_params_default(&p);
    p.api_key         = getenv("DSV4_API_KEY");
    struct dsv4_engine_params ep; /* the backend choices: environment, then flags */
    dsv4_engine_params_default(&ep);
    cli_engine_env(&ep);
    double drain_s    = 30;
    int    verbose    = 0;
    bool   no_key_ok  = false;
    long long iv;
    double    fv;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int         eo = cli_engine_option("serve", argc, argv, &i, &ep);
        if (eo < 0) return 2;
        if (eo > 0) continue;
        struct {
            const char *name;
            int        *dst;
            long long   lo, hi;
        } ints[] = {
            { "--port", &p.port, 0, 65535 },
            { "--max-seqs", &p.max_seqs, 1, 4096 },
            { "--ctx", &p.ctx, 2, 1 << 30 },
            { "--max-queue", &p.max_queue, 1, 1 << 20 },
            { "--max-batch-tokens", &p.max_batch_tokens, 1, 1 << 20 },
            { "--max-prefill-tokens", &p.max_prefill_tokens, 0, 1 << 20 },
            { "--kv-pages", &p.kv_pages, 1, 1 << 30 },
            { "--prefix-cache", &p.prefix_entries, 0, 1 << 24 },
            { "--keep-finished", &p.keep_finished, 0, 4096 },
            { "--spec-draft", &p.spec_draft, 0, DSV4_SPEC_MAX_DRAFT },
            { "--threads", &p.n_threads, 0, 4096 },
            { "--max-conns", &p.max_conns, 1, 1 << 16 },
            { "--max-conns-per-ip", &p.max_conns_per_ip, 0, 1 << 16 },
            { "--idle-timeout", &p.idle_timeout_s, 1, 86400 },
            { "--max-json-depth", &p.max_json_depth, 1, 10000 },
            { "--stream-buffer", &p.stream_buffer, 1, 1 << 24 },
            { "--send-buffer", &p.send_buffer, 4096, 1 << 30 },
            { "--responses-store", &p.responses_store, 1, 1 << 20 },
            { "--responses-store-mb", &p.responses_store_mb, 1, 1 << 20 },
        };
        bool done = false;
        for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]) && !done; k++) {
            if (strcmp(a, ints[k].name)) continue;
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_int("serve", a, v, ints[k].lo, ints[k].hi, &iv))
                return 2;
            *ints[k].dst = (int)iv;
            done         = true;
        }
        if (done) continue;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(p.model_dir = cli_value("serve", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--host")) {
            if (!(p.host = cli_value("serve", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--api-key")) {
            if (!(p.api_key = cli_value("serve", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--served-model-name")) {
            if (!(p.model_name = cli_value("serve", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--max-body")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_int("serve", a, v, 1, 1LL << 34, &iv)) return 2;
            p.max_body = (size_t)iv;
        } else if (!strcmp(a, "--tier-tokens")) {
            if (!(v = cli_value("serve", argc, argv, &i))) return 2;
            if (sscanf(v, "%d,%d", &p.tier_tokens[0], &p.tier_tokens[1]) != 2 || p.tier_tokens[0] < 1 ||
                p.tier_tokens[1] < p.tier_tokens[0]) {
                fprintf(stderr, "dsv4 serve: --tier-tokens wants A,B with 1 <= A <= B\n");
                return 2;
            }
        } else if (!strcmp(a, "--prefill-share")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_float("serve", a, v, 0, 1000, &fv)) return 2;
            p.prefill_share = (float)fv;
        } else if (!strcmp(a, "--mem-limit")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_int("serve", a, v, 1, 1LL << 30, &iv)) return 2;
            p.mem_limit = (size_t)iv << 20;
        } else if (!strcmp(a, "--keepalive")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_float("serve", a, v, 0.01, 3600, &fv)) return 2;
            p.keepalive_s = fv;
        } else if (!strcmp(a, "--request-timeout")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_float("serve", a, v, 0.1, 86400, &fv)) return 2;
            p.request_timeout_s = fv;
        } else if (!strcmp(a, "--cors-origin")) {
            if (!(p.cors_origin = cli_value("serve", argc, argv, &i))) return 2;
            if (!p.cors_origin[0] || strpbrk(p.cors_origin, "\r\n")) {
                fprintf(stderr, "dsv4 serve: --cors-origin wants an origin such as https://app.example or '*'\n");
                return 2;
            }
        } else if (!strcmp(a, "--insecure-no-key")) {
            no_key_ok = true;
        } else if (!strcmp(a, "--special-tokens-in-messages")) {
            p.special_in_messages = true;
        } else if (!strcmp(a, "--drain-timeout")) {
            if (!(v = cli_value("serve", argc, argv, &i)) || !cli_parse_float("serve", a, v, 0, 86400, &fv)) return 2;
            drain_s = fv;
        } else if (!strcmp(a, "-v")) {
            verbose = 1;
        } else {
            fprintf(stderr, "dsv4 serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!p.model_dir) {
        fprintf(stderr, "dsv4 serve: -m DIR is required\n");
        usage(stderr);
        return 2;
    }
    /* Authentication fails closed: an empty key would silently turn it off. */
    if (p.api_key && !p.api_key[0]) {
        fprintf(stderr, "dsv4 serve: the API key is empty (--api-key \"\" or DSV4_API_KEY=): give a key, or unset "
                        "it to serve without authentication\n");
        return 2;
    }
    if (!p.api_key && !no_key_ok && !is_loopback(p.host))
        fprintf(stderr, "dsv4 serve: warning: listening on %s without an API key: anyone who can reach it can use "
                        "the model (--api-key KEY, or --insecure-no-key to accept this)\n", p.host);
    p.backend      = ep.backend;
    p.cpu_level    = ep.cpu_level;
    p.tiles        = ep.tiles;
    p.profile_path = ep.profile_path;
    p.log          = log_stderr;
    p.log_ud = &verbose;

    /* Before any thread exists: every thread inherits the blocked signals. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct srv     *s;
    struct dsv4_err err;
    if (srv_start(&s, &p, &err)) {
        fprintf(stderr, "dsv4 serve: %s\n", err.msg);
        return 1;
    }
    printf("dsv4 serve: listening on http://%s:%d (model %s loading)\n", p.host, srv_port(s), p.model_dir);
    fflush(stdout);

    bool   ready = false, draining = false;
    double deadline = 0;
    for (;;) {
        struct timespec tick = { 0, 100 * 1000 * 1000 };
        int             sig  = sigtimedwait(&set, NULL, &tick);
        if (sig > 0) {
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
