/*
 * fuzz_server.c - libFuzzer harness for the HTTP request path of `dsv4 serve`: libmicrohttpd
 * and src/server/http.c (routing, limits, authentication), api.c and the three dialects
 * with the request core (body validation, chat rendering, tokenization), api_output.c (the
 * response, streaming or whole), without a
 * model: tests/fuzz/stub_worker.c stands in for the inference worker (src/server/worker.c)
 * and answers every job at once with one or two tokens.
 *
 * The server starts once, on the first input: srv_start on 127.0.0.1, port 0, with the
 * tokenizer of models/kjv-v4-tiny (DSV4_FUZZ_MODEL=DIR for another), API key "fuzz-key",
 * a 512-token context and a 16 KiB body limit, so 401, 413 and the context-length errors
 * are all reachable with short inputs. Each input is then the raw bytes of a whole HTTP
 * request as a client sends it (request line, headers, body; several pipelined requests
 * are fine), written unchanged to a fresh loopback connection. The harness then shuts its
 * sending side (the server sees the end of the request stream, as after a client's last
 * request, and closes once it has answered) and reads the reply until the server closes.
 * Nothing is normalised: a mangled request line or header is libmicrohttpd's to refuse, and
 * that is part of what is fuzzed. The seeds (tests/fuzz/corpus/server) carry valid
 * requests with the key, so mutations mostly reach the JSON validation behind it.
 *
 * DSV4_FUZZ_VERBOSE=1 prints every reply (the first 16 KiB), to check what seeds reach.
 *
 * Every wait is bounded: connect, send and the whole reply must complete within
 * REPLY_LIMIT_S seconds, else the harness reports the input as a hang and aborts (a hang
 * is a finding, never waited on). The in-process server is fast enough for libFuzzer:
 * a connection costs one libmicrohttpd thread and microseconds of parsing.
 *
 * Build: make fuzz (clang) -> build-fuzz/fuzz_server. Run from the repository root:
 *   mkdir -p build-fuzz/corpus-server
 *   build-fuzz/fuzz_server -max_len=8192 -timeout=20 -dict=tests/fuzz/server.dict \
 *       build-fuzz/corpus-server tests/fuzz/corpus/server
 * New inputs go to the first directory; keep those that add coverage with
 *   build-fuzz/fuzz_server -merge=1 -use_counters=0 tests/fuzz/corpus/server build-fuzz/corpus-server
 * and a crasher, once fixed, as tests/fuzz/corpus/server/crash-<what>.
 * `make test` replays tests/fuzz/corpus/server without libFuzzer (tests/fuzz/replay_main.c).
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { REPLY_LIMIT_S = 10 };

static struct srv *g_srv;
static bool        g_verbose; /* DSV4_FUZZ_VERBOSE=1: print each reply (debugging seeds) */

static void stop_server(void)
{
    srv_stop(g_srv);
    g_srv = NULL;
}

static void start_server(void)
{
    struct srv_params p;
    srv_params_default(&p);
    const char *dir      = getenv("DSV4_FUZZ_MODEL");
    p.model_dir          = dir ? dir : "models/kjv-v4-tiny";
    p.model_name         = "kjv-v4-tiny";
    p.host               = "127.0.0.1";
    p.port               = 0;
    p.api_key            = "fuzz-key";
    p.ctx                = 512;
    p.max_conns          = 64;
    p.idle_timeout_s     = 5;
    p.max_body           = 16 * 1024;
    p.keepalive_s        = 0.2;
    p.stream_buffer      = 8;
    struct dsv4_err err;
    if (srv_start(&g_srv, &p, &err)) {
        fprintf(stderr, "fuzz_server: cannot start the server: %s\n", err.msg);
        abort();
    }
    struct dsv4_err load;
    if (srv_get_state(g_srv, &load) != SRV_STATE_READY) {
        fprintf(stderr, "fuzz_server: the stub worker is not ready: %s (run from the repository root)\n", load.msg);
        abort();
    }
    g_verbose = getenv("DSV4_FUZZ_VERBOSE") != NULL;
    atexit(stop_server);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits for fd to be ready for ev until the deadline; aborts past it (a hang). */
static void wait_fd(int fd, short ev, double deadline, const char *what)
{
    for (;;) {
        double left = deadline - now_s();
        if (left <= 0) {
            fprintf(stderr, "fuzz_server: hang: the server did not %s within %d s\n", what, REPLY_LIMIT_S);
            abort();
        }
        struct pollfd pfd = { fd, ev, 0 };
        int           r   = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r > 0) return;
        if (r < 0 && errno != EINTR) {
            perror("fuzz_server: poll");
            abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_srv) start_server();
    double deadline = now_s() + REPLY_LIMIT_S;
    int    fd       = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        perror("fuzz_server: socket");
        abort();
    }
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)srv_port(g_srv)) };
    a.sin_addr.s_addr    = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (errno != EINPROGRESS) {
            perror("fuzz_server: connect");
            abort();
        }
        wait_fd(fd, POLLOUT, deadline, "accept the connection");
        int       e  = 0;
        socklen_t el = sizeof(e);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
        if (e) {
            fprintf(stderr, "fuzz_server: connect: %s\n", strerror(e));
            abort();
        }
    }
    /* the whole input as the request; the server may answer and close before it has all
     * of it (413, a malformed request line), which ends the sending early */
    size_t sent = 0;
    while (sent < size) {
        ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            wait_fd(fd, POLLOUT, deadline, "read the request");
        } else {
            break; /* EPIPE or ECONNRESET: the server is done with us */
        }
    }
    shutdown(fd, SHUT_WR);
    char   buf[16384];
    size_t got = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + got, sizeof(buf) - got, 0);
        if (n > 0) {
            got = g_verbose && got + (size_t)n < sizeof(buf) - 1 ? got + (size_t)n : 0;
            continue;
        }
        if (n == 0) break;
        if (errno == EAGAIN || errno == EINTR) {
            wait_fd(fd, POLLIN, deadline, "finish its reply and close");
            continue;
        }
        break; /* ECONNRESET: closed with unread request bytes */
    }
    close(fd);
    if (g_verbose) {
        buf[got] = '\0';
        fprintf(stderr, "--- %zu bytes sent, reply:\n%s\n", size, buf);
    }
    return 0;
}
