/*
 * test_webui.c - the chat page of `dsv4 serve` (GET /, src/server/webui/chat.html), on the
 * demo model (models/kjv-v4-tiny):
 *   - headers: GET / is the page as text/html with its Content-Security-Policy and nosniff,
 *     without the API key of a server that has one (the API still wants it); HEAD / has the
 *     headers and no body; POST / is a 405; /metrics counts the page; --no-webui makes /
 *     a 404 and leaves the API alone;
 *   - the page in Debian's chromium driven by puppeteer-core (tests/webui/chat_page.mjs):
 *     a prompt streams an answer, Stop ends a long generation, model output is text and never
 *     markup, reasoning and tool calls are rendered, the API key is sent; a screenshot is
 *     written to build/webui-chat.png. Afterwards the servers are idle (the stopped request
 *     was cancelled on the server, not left running) and exit 0 on SIGTERM.
 * Paths are relative to the repository root (make test runs there).
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "support/http_client.h"
#include "test_cases.h"
#include "test_server_util.h"

#define DEMO_MODEL "models/kjv-v4-tiny"
#define WEBUI_KEY  "webui-test-key"

/* A request to the server: the status (-1 on failure), a header's value (when header is not
 * NULL) and the body (when body is not NULL, malloc'd). */
static int request(struct tsrv *s, const char *method, const char *path, const char *header, char *value, size_t cap,
                   char **body)
{
    struct http_conn c;
    char             err[256];
    if (value) value[0] = '\0';
    if (body) *body = NULL;
    if (http_open(&c, "127.0.0.1", s->port, method, path, NULL, NULL, 0, 10, err, sizeof(err)) != 0) return -1;
    int status = c.status;
    if (header && !http_header(&c, header, value, cap)) value[0] = '\0';
    if (body && strcmp(method, "HEAD") != 0) *body = http_read_all(&c, NULL);
    http_close(&c);
    return status;
}

static void check_page_headers(struct test_ctx *t, struct tsrv *s)
{
    char  v[512], *body = NULL;
    int   st = request(s, "GET", "/", "content-type", v, sizeof(v), &body);
    CHECKF(st == 200 && !strcmp(v, "text/html; charset=utf-8"), "GET /: %d, content-type '%s'", st, v);
    CHECKF(body && strstr(body, "<title>dsv4 chat</title>") && strstr(body, "v1/chat/completions"),
           "GET / is the chat page (%zu bytes)", body ? strlen(body) : 0);
    CHECKF(body && !strstr(body, "http://") && !strstr(body, "https://") && !strstr(body, "innerHTML"),
           "the page fetches nothing from elsewhere and writes no markup from strings");
    free(body);
    request(s, "GET", "/", "content-security-policy", v, sizeof(v), NULL);
    CHECKF(strstr(v, "default-src 'none'") && strstr(v, "connect-src 'self'") && strstr(v, "script-src 'unsafe-inline'") &&
               !strstr(v, "*"),
           "the page's Content-Security-Policy: '%s'", v);
    request(s, "GET", "/", "x-content-type-options", v, sizeof(v), NULL);
    CHECKF(!strcmp(v, "nosniff"), "X-Content-Type-Options: '%s'", v);
    st = request(s, "HEAD", "/", "content-length", v, sizeof(v), NULL);
    CHECKF(st == 200 && atol(v) > 1000, "HEAD /: %d, content-length '%s'", st, v);
    st = request(s, "POST", "/", "allow", v, sizeof(v), NULL);
    CHECKF(st == 405 && !strcmp(v, "GET, HEAD"), "POST /: %d, allow '%s'", st, v);
    CHECKF(request(s, "GET", "/index.html", NULL, NULL, 0, NULL) == 404, "only / is the page");
}

static void test_page_headers(struct test_ctx *t)
{
    struct tsrv s;
    if (!tsrv_start(t, &s, DEMO_MODEL, "--api-key " WEBUI_KEY)) return;
    check_page_headers(t, &s);
    CHECKF(request(&s, "GET", "/v1/models", NULL, NULL, 0, NULL) == 401, "the API still wants the key");
    char *metrics = NULL;
    CHECK(tsrv_get(&s, "/metrics", NULL, &metrics) == 200 && metrics);
    double n = metrics ? tsrv_metric(metrics, "dsv4_http_requests_total{endpoint=\"webui\",status=\"200\"}") : 0;
    CHECKF(n == 4, "/metrics counts the page's 200s: %g", n);
    free(metrics);
    CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "exit status after SIGTERM (log: %s)", s.log);
}

static void test_no_webui(struct test_ctx *t)
{
    struct tsrv s;
    if (!tsrv_start(t, &s, DEMO_MODEL, "--no-webui")) return;
    char *body = NULL;
    int   st   = request(&s, "GET", "/", NULL, NULL, 0, &body);
    CHECKF(st == 404 && body && strstr(body, "no such endpoint"), "--no-webui: GET / is %d: %s", st, body ? body : "");
    free(body);
    CHECKF(request(&s, "GET", "/v1/models", NULL, NULL, 0, NULL) == 200, "--no-webui leaves the API alone");
    CHECKF(tsrv_stop(&s, SIGTERM, 20) == 0, "exit status after SIGTERM (log: %s)", s.log);
}

/* After the browser: no request running or waiting, and the one Stop ended was cancelled. */
static void check_after_browser(struct test_ctx *t, struct tsrv *s, double cancelled)
{
    CHECKF(tsrv_wait_idle(s, 10), "the server is idle after the browser test");
    char *metrics = NULL;
    CHECK(tsrv_get(s, "/metrics", NULL, &metrics) == 200 && metrics);
    double n = metrics ? tsrv_metric(metrics, "dsv4_requests_finished_total{reason=\"cancelled\"}") : -1;
    CHECKF(n == cancelled, "requests cancelled on the server: %g, want %g (Stop)", n, cancelled);
    free(metrics);
    CHECKF(tsrv_stop(s, SIGTERM, 20) == 0, "exit status after SIGTERM (log: %s)", s->log);
}

static void test_chat_page(struct test_ctx *t)
{
    struct tsrv open_s, key_s;
    if (!tsrv_start(t, &open_s, DEMO_MODEL, "--ctx 4096 --threads 1")) return;
    if (!tsrv_start(t, &key_s, DEMO_MODEL, "--ctx 1024 --api-key " WEBUI_KEY)) {
        tsrv_stop(&open_s, SIGKILL, 5);
        return;
    }
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof(cmd),
             "mkdir -p build && timeout 300 node tests/webui/chat_page.mjs http://127.0.0.1:%d/ http://127.0.0.1:%d/ %s build/webui-chat.png",
             open_s.port, key_s.port, WEBUI_KEY);
    int st = test_run(cmd, &out);
    CHECKF(st == 0, "chat_page.mjs (exit %d):\n%s", st, out ? out : "");
    free(out);
    check_after_browser(t, &open_s, 1);
    check_after_browser(t, &key_s, 0);
}

const struct test_case test_group_webui[] = {
    { "page_headers", test_page_headers },
    { "no_webui", test_no_webui },
    { "chat_page", test_chat_page, TEST_NEEDS_WEBUI },
    { NULL, NULL },
};
