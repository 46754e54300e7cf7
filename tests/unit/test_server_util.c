/*
 * test_server_util.c - helpers of the server tests: the test tokenizer, the server child
 * process, HTTP and SSE requests through tools/http_client, the Prometheus text-format
 * validator, and canned tool-call responses built by the real output code (srv_out).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support/http_client.h"
#include "server/server.h"
#include "support/gen.h"
#include "test_server_util.h"

/* ------------------------------------------------------------------ tokenizer */

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest for 256+. */
static unsigned byte_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    unsigned n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) n++;
    return 256 + n;
}

static void put_cp(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

int tsrv_write_tokenizer(const char *dir, int n_vocab, struct dsv4_err *err)
{
    static const char *const special[] = {
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
        "｜DSML｜", "<｜latest_reminder｜>", "<｜action｜>", "<｜query｜>", "<｜authority｜>", "<｜domain｜>",
        "<｜title｜>", "<｜read_url｜>", "<｜extracted_url｜>",
    };
    static const char L[] = "etaoinshrdlucmfwypgbvkjxqz";
    int               n_sp = (int)(sizeof(special) / sizeof(special[0])), next = n_sp;
    json_t           *added = json_array(), *vocab = json_object(), *merges = json_array();
    for (int i = 0; i < n_sp; i++)
        json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", i, "content", special[i],
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    char sym[4];
    for (unsigned b = 0; b < 256; b++) {
        put_cp(sym, byte_cp(b));
        json_object_set_new(vocab, sym, json_integer(next++));
    }
    char g[4];
    put_cp(g, byte_cp(' ')); /* "Ġ" */
    int nl = (int)strlen(L);
    /* merges in rank order: "Ġx", "xy", "Ġxy", "xyz" until the vocabulary is full */
    for (int stage = 0; stage < 4 && next < n_vocab; stage++) {
        int n = stage == 0 ? nl : stage == 3 ? nl * nl * nl : nl * nl;
        for (int k = 0; k < n && next < n_vocab; k++) {
            char a[16], b2[8], whole[24];
            int  x = stage == 0 ? k : stage == 3 ? k / (nl * nl) : k / nl;
            int  y = stage == 3 ? (k / nl) % nl : k % nl, z = k % nl;
            if (stage == 0) snprintf(a, sizeof(a), "%s", g), snprintf(b2, sizeof(b2), "%c", L[x]);
            else if (stage == 1) snprintf(a, sizeof(a), "%c", L[x]), snprintf(b2, sizeof(b2), "%c", L[y]);
            else if (stage == 2) snprintf(a, sizeof(a), "%s%c", g, L[x]), snprintf(b2, sizeof(b2), "%c", L[y]);
            else snprintf(a, sizeof(a), "%c%c", L[x], L[y]), snprintf(b2, sizeof(b2), "%c", L[z]);
            snprintf(whole, sizeof(whole), "%s%s", a, b2);
            if (json_object_get(vocab, whole)) continue;
            char rule[40];
            snprintf(rule, sizeof(rule), "%s %s", a, b2);
            json_array_append_new(merges, json_string(rule));
            json_object_set_new(vocab, whole, json_integer(next++));
        }
    }
    json_t *doc = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:{s:s,s:b,s:b,s:b}, s:n, s:{s:s,s:b,s:b,s:b},"
        " s:{s:s,s:n,s:n,s:n,s:n,s:b,s:b,s:o,s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", added, "normalizer", "pre_tokenizer", "type",
        "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 1, "post_processor", "decoder", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "dropout",
        "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "vocab",
        vocab, "merges", merges);
    char path[600];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    int rc = doc && json_dump_file(doc, path, JSON_COMPACT) == 0 ? 0 : -1;
    json_decref(doc);
    if (rc) {
        if (err) snprintf(err->msg, sizeof(err->msg), "cannot write %s", path);
        return DSV4_EIO;
    }
    if (next != n_vocab) {
        if (err) snprintf(err->msg, sizeof(err->msg), "the test tokenizer has %d ids, not %d", next, n_vocab);
        return DSV4_EINVAL;
    }
    return DSV4_OK;
}

/* ------------------------------------------------------------------ the server process */

static int g_serial;

/* Reads one line from fd within timeout_s; false on EOF or timeout. */
static bool read_line_fd(int fd, char *out, size_t cap, double timeout_s)
{
    size_t n = 0;
    while (n + 1 < cap) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, (int)(timeout_s * 1000)) <= 0) return false;
        char    c;
        ssize_t r = read(fd, &c, 1);
        if (r <= 0) return false;
        if (c == '\n') break;
        out[n++] = c;
    }
    out[n] = '\0';
    return true;
}

pid_t tsrv_mpi_rank_pid(pid_t parent, int rank)
{
    char want[48];
    snprintf(want, sizeof(want), "OMPI_COMM_WORLD_RANK=%d", rank);
    for (int tries = 0; tries < 100; tries++) {
        char  path[64], cmd[200], *out = NULL;
        pid_t found = -1;
        snprintf(cmd, sizeof(cmd), "pgrep -P %d", (int)parent);
        if (test_run(cmd, &out) == 0 && out)
            for (char *tok = strtok(out, "\n"); tok && found < 0; tok = strtok(NULL, "\n")) {
                size_t n   = 0;
                snprintf(path, sizeof(path), "/proc/%d/environ", atoi(tok));
                char  *env = test_read_file(path, &n);
                for (size_t i = 0; env && i < n; i += strlen(env + i) + 1)
                    if (!strcmp(env + i, want)) found = (pid_t)atoi(tok);
                free(env);
            }
        free(out);
        if (found > 0) return found;
        struct timespec ts = { 0, 50 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    return -1;
}

bool tsrv_start(struct test_ctx *t, struct tsrv *s, const char *dir, const char *args)
{
    return tsrv_start_mpi(t, s, dir, args, test_mpi_ranks);
}

bool tsrv_start_mpi(struct test_ctx *t, struct tsrv *s, const char *dir, const char *args, int ranks)
{
    memset(s, 0, sizeof(*s));
    s->pid          = -1;
    s->sig_pid      = -1;
    s->out_fd       = -1;
    const char *bin = getenv("DSV4_BIN");
    CHECKF(bin != NULL, "DSV4_BIN not set (run through make test)");
    if (!bin) return false;
    char  argbuf[1024], np[16];
    char *argv[80];
    int   argc = 0;
    snprintf(np, sizeof(np), "%d", ranks);
    if (ranks > 1) {
        /* a SIGTERM to mpirun ends the job at once: tsrv_stop signals rank 0, which drains
         * and then lets the other ranks go (docs/DISTRIBUTED.md) */
        const char *pre[] = { "mpirun", "-np", np, "--oversubscribe", "--mca", "btl", "self,tcp" };
        for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++) argv[argc++] = (char *)pre[i];
    }
    argv[argc++] = (char *)bin;
    argv[argc++] = "serve";
    argv[argc++] = "-m";
    argv[argc++] = (char *)dir;
    argv[argc++] = "--port";
    argv[argc++] = "0";
    argv[argc++] = "--threads";
    argv[argc++] = "1";
    if (test_backend) { /* run_tests --backend: the server runs on it too */
        argv[argc++] = "--backend";
        argv[argc++] = (char *)test_backend;
    }
    snprintf(argbuf, sizeof(argbuf), "%s", args ? args : "");
    for (char *tok = strtok(argbuf, " "); tok && argc < 74; tok = strtok(NULL, " ")) argv[argc++] = tok;
    if (ranks > 1) {
        argv[argc++] = "--ep";
        argv[argc++] = np;
    }
    argv[argc] = NULL;
    snprintf(s->log, sizeof(s->log), "%s/serve-%d.log", t->tmpdir, g_serial++);
    int p[2];
    if (pipe(p) != 0) return false;
    pid_t pid = fork();
    if (pid == 0) {
        /* A test killed by a timeout must not leave its server running. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        if (ranks > 1) {
            setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
            setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
            execvp(argv[0], argv);
        } else {
            execv(bin, argv);
        }
        _exit(127);
    }
    close(p[1]);
    s->pid     = pid;
    s->sig_pid = pid;
    s->out_fd  = p[0];
    char line[512];
    bool ready = false;
    while (read_line_fd(s->out_fd, line, sizeof(line), 60)) {
        const char *at = strstr(line, "listening on http://");
        if (at) {
            const char *colon = strrchr(at + 20, ':');
            if (colon) s->port = atoi(colon + 1);
        }
        if (strstr(line, "dsv4 serve: ready") || strstr(line, "dsv4 serve: standby")) {
            ready = true;
            break;
        }
    }
    if (ready && ranks > 1) s->sig_pid = tsrv_mpi_rank_pid(pid, 0);
    CHECKF(ready && s->port > 0 && s->sig_pid > 0, "dsv4 serve did not start (log: %s)", s->log);
    if (!ready || s->port <= 0 || s->sig_pid <= 0) {
        tsrv_stop(s, SIGKILL, 5);
        return false;
    }
    return true;
}

int tsrv_stop(struct tsrv *s, int sig, double timeout_s)
{
    if (s->pid <= 0) return -1;
    if (sig) kill(s->sig_pid > 0 ? s->sig_pid : s->pid, sig);
    int             status = 0, rc = -1;
    struct timespec ts     = { 0, 10 * 1000 * 1000 };
    for (int i = 0; i < (int)(timeout_s * 100); i++) {
        pid_t w = waitpid(s->pid, &status, WNOHANG);
        if (w == s->pid) {
            rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            break;
        }
        nanosleep(&ts, NULL);
    }
    if (rc == -1) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, &status, 0);
    }
    if (s->out_fd >= 0) close(s->out_fd);
    s->pid    = -1;
    s->out_fd = -1;
    return rc;
}

/* ------------------------------------------------------------------ requests */

static json_t *parse(const char *b)
{
    return b ? json_loads(b, JSON_ALLOW_NUL, NULL) : NULL;
}

int tsrv_get(struct tsrv *s, const char *path, json_t **json, char **text)
{
    char  err[256], *body = NULL;
    int   st = http_request("127.0.0.1", s->port, "GET", path, NULL, NULL, &body, NULL, 30, err, sizeof(err));
    if (json) *json = parse(body);
    if (text) *text = body;
    else free(body);
    return st;
}

int tsrv_get_h(struct tsrv *s, const char *path, const char *headers, json_t **json)
{
    char  err[256], *body = NULL;
    int   st = http_request("127.0.0.1", s->port, "GET", path, headers, NULL, &body, NULL, 30, err, sizeof(err));
    if (json) *json = parse(body);
    free(body);
    return st;
}

int tsrv_post(struct tsrv *s, const char *path, const char *body, const char *headers, json_t **json)
{
    char  err[256], *resp = NULL;
    int   st = http_request("127.0.0.1", s->port, "POST", path, headers, body, &resp, NULL, 60, err, sizeof(err));
    if (json) *json = parse(resp);
    free(resp);
    return st;
}

int tsrv_post_retry(struct tsrv *s, const char *path, const char *body, json_t **json, char *retry_after, size_t cap)
{
    struct http_conn c;
    char             err[256];
    if (http_open(&c, "127.0.0.1", s->port, "POST", path, NULL, body, strlen(body), 30, err, sizeof(err))) return -1;
    if (!http_header(&c, "Retry-After", retry_after, cap)) retry_after[0] = '\0';
    char *b  = http_read_all(&c, NULL);
    int   st = c.status;
    http_close(&c);
    if (json) *json = parse(b);
    free(b);
    return st;
}

int tsrv_connect(int port)
{
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai;
    char            ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    if (getaddrinfo("127.0.0.1", ps, &hints, &ai)) return -1;
    int fd = socket(ai->ai_family, ai->ai_socktype, 0);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

bool tsrv_send_all(int fd, const char *s, size_t n)
{
    while (n) {
        ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        s += k;
        n -= (size_t)k;
    }
    return true;
}

int tsrv_send_only(struct tsrv *s, const char *path, const char *body)
{
    int fd = tsrv_connect(s->port);
    if (fd < 0) return -1;
    char head[512];
    int  n = snprintf(head, sizeof(head),
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      path, strlen(body));
    if (!tsrv_send_all(fd, head, (size_t)n) || !tsrv_send_all(fd, body, strlen(body))) {
        close(fd);
        return -1;
    }
    return fd;
}

int tsrv_post_chunked(struct tsrv *s, const char *path, const char *body, const char *headers, json_t **json)
{
    int fd = tsrv_connect(s->port);
    if (fd < 0) return -1;
    char head[1024];
    int  n = snprintf(head, sizeof(head),
                      "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n%s\r\n", path,
                      headers ? headers : "");
    bool ok = tsrv_send_all(fd, head, (size_t)n);
    for (size_t off = 0, len = strlen(body); ok && off < len; off += 500) {
        size_t k = len - off < 500 ? len - off : 500;
        char   sz[32];
        int    m = snprintf(sz, sizeof(sz), "%zx\r\n", k);
        ok       = tsrv_send_all(fd, sz, (size_t)m) && tsrv_send_all(fd, body + off, k) && tsrv_send_all(fd, "\r\n", 2);
    }
    if (ok) tsrv_send_all(fd, "0\r\n\r\n", 5);
    /* the whole answer, then the status and the body after the blank line */
    char   buf[16384];
    size_t len = 0;
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (poll(&p, 1, 10000) <= 0) break;
        ssize_t r = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
        if (r <= 0) break;
        len += (size_t)r;
        if (len >= sizeof(buf) - 1) break;
    }
    close(fd);
    buf[len] = '\0';
    int st = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &st) != 1) return -1;
    char *b = strstr(buf, "\r\n\r\n");
    if (json) *json = b ? parse(b + 4) : NULL;
    return st;
}

static void append(char **s, const char *add)
{
    size_t a = *s ? strlen(*s) : 0, b = strlen(add);
    char  *p = realloc(*s, a + b + 1);
    if (!p) return;
    memcpy(p + a, add, b + 1);
    *s = p;
}

int tsrv_stream(struct tsrv *s, const char *path, const char *body, const char *headers, struct tsrv_stream *out)
{
    memset(out, 0, sizeof(*out));
    out->chunks = json_array();
    out->content = strdup("");
    struct http_conn c;
    char             err[256];
    if (http_open(&c, "127.0.0.1", s->port, "POST", path, headers, body, strlen(body), 60, err, sizeof(err))) return -1;
    int st = c.status;
    if (st != 200) {
        char *b    = http_read_all(&c, NULL);
        out->error = parse(b);
        free(b);
        http_close(&c);
        return st;
    }
    const char *data;
    size_t      len;
    int         ev;
    while ((ev = http_sse_next(&c, &data, &len)) > 0) {
        if (ev == 2) {
            out->comments++;
            continue;
        }
        if (!strcmp(data, "[DONE]")) {
            out->done = true;
            break;
        }
        json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, NULL);
        if (!j) continue;
        json_array_append_new(out->chunks, j);
        if (json_object_get(j, "error")) out->error = json_incref(json_object_get(j, "error"));
        json_t *u = json_object_get(j, "usage");
        if (json_is_object(u)) {
            json_decref(out->usage);
            out->usage = json_incref(u);
        }
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *d  = json_object_get(ch, "delta");
        if (json_array_size(out->chunks) == 1) out->role_first = json_is_string(json_object_get(d, "role"));
        const char *txt = d ? json_string_value(json_object_get(d, "content")) : json_string_value(json_object_get(ch, "text"));
        if (txt) append(&out->content, txt);
        const char *rs = json_string_value(json_object_get(d, "reasoning_content"));
        if (rs) {
            if (!out->reasoning) out->reasoning = strdup("");
            append(&out->reasoning, rs);
        }
        const char *f = json_string_value(json_object_get(ch, "finish_reason"));
        if (f) {
            free(out->finish);
            out->finish = strdup(f);
        }
    }
    http_close(&c);
    return st;
}

void tsrv_stream_free(struct tsrv_stream *st)
{
    json_decref(st->chunks);
    json_decref(st->usage);
    json_decref(st->error);
    free(st->content);
    free(st->reasoning);
    free(st->finish);
    memset(st, 0, sizeof(*st));
}

/* ------------------------------------------------------------------ Prometheus text format */

static bool name_char(int c, bool first)
{
    return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

struct fam {
    char name[128];
    char type[32];
    bool seen_samples;
};

#define BAD(...)                                                                                                      \
    do {                                                                                                              \
        snprintf(why, cap, "line %d: ", line_no);                                                                     \
        size_t l_ = strlen(why);                                                                                      \
        snprintf(why + l_, cap - l_, __VA_ARGS__);                                                                    \
        goto out;                                                                                                     \
    } while (0)

bool tsrv_prom_validate(const char *text, char *why, size_t cap)
{
    enum { MAX_FAM = 256, MAX_SERIES = 4096 };
    struct fam *fams = calloc(MAX_FAM, sizeof(*fams));
    char      **series = calloc(MAX_SERIES, sizeof(char *));
    int         n_fam = 0, n_series = 0, line_no = 0;
    bool        ok = false;
    /* histogram bookkeeping: the last bucket count per (family, labels without le) */
    char   hist_key[1400] = "";
    double last_bucket = -1, inf_bucket = -1;
    why[0] = '\0';
    if (!fams || !series) BAD("out of memory");
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        if (!eol) BAD("the last line has no newline");
        line_no++;
        size_t len = (size_t)(eol - p);
        char   line[2048];
        if (len >= sizeof(line)) BAD("line too long");
        memcpy(line, p, len);
        line[len] = '\0';
        p         = eol + 1;
        if (len == 0) continue;
        if (line[0] == '#') {
            char kw[16], name[128];
            if (sscanf(line, "# %15s %127s", kw, name) == 2 && (!strcmp(kw, "HELP") || !strcmp(kw, "TYPE"))) {
                for (int i = 0; name[i]; i++)
                    if (!name_char((unsigned char)name[i], i == 0)) BAD("bad metric name '%s'", name);
                if (!strcmp(kw, "TYPE")) {
                    char type[32];
                    if (sscanf(line, "# TYPE %*s %31s", type) != 1) BAD("TYPE without a type");
                    if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram") &&
                        strcmp(type, "summary") && strcmp(type, "untyped"))
                        BAD("unknown type '%s'", type);
                    for (int i = 0; i < n_fam; i++)
                        if (!strcmp(fams[i].name, name)) BAD("second TYPE for %s", name);
                    if (n_fam == MAX_FAM) BAD("too many families");
                    snprintf(fams[n_fam].name, sizeof(fams[n_fam].name), "%s", name);
                    snprintf(fams[n_fam].type, sizeof(fams[n_fam].type), "%s", type);
                    n_fam++;
                }
            }
            continue;
        }
        /* name{labels} value [timestamp] */
        const char *q = line;
        char        name[128];
        size_t      nn = 0;
        while (*q && name_char((unsigned char)*q, nn == 0) && nn < sizeof(name) - 1) name[nn++] = *q++;
        name[nn] = '\0';
        if (!nn) BAD("no metric name");
        char labels[1024] = "", le[256] = "";
        size_t lk = 0;
        if (*q == '{') {
            q++;
            while (*q && *q != '}') {
                char   ln[128];
                size_t k = 0;
                while (*q && name_char((unsigned char)*q, k == 0) && k < sizeof(ln) - 1) ln[k++] = *q++;
                ln[k] = '\0';
                if (!k || *q != '=' || q[1] != '"') BAD("bad label in %s", name);
                q += 2;
                char val[256];
                size_t v = 0;
                while (*q && *q != '"') {
                    if (*q == '\\') {
                        q++;
                        if (*q != '\\' && *q != '"' && *q != 'n') BAD("bad escape in a label value");
                    }
                    if (v < sizeof(val) - 1) val[v++] = *q;
                    q++;
                }
                val[v] = '\0';
                if (*q != '"') BAD("unterminated label value");
                q++;
                if (!strcmp(ln, "le")) snprintf(le, sizeof(le), "%s", val);
                else lk += (size_t)snprintf(labels + lk, sizeof(labels) - lk, "%s=%s,", ln, val);
                if (*q == ',') q++;
                else if (*q != '}') BAD("expected , or } in the labels of %s", name);
            }
            if (*q != '}') BAD("unterminated labels");
            q++;
        }
        if (*q != ' ') BAD("no space before the value of %s", name);
        q++;
        char  *end;
        double v;
        if (!strncmp(q, "+Inf", 4)) v = INFINITY, end = (char *)q + 4;
        else if (!strncmp(q, "-Inf", 4)) v = -INFINITY, end = (char *)q + 4;
        else if (!strncmp(q, "NaN", 3)) v = NAN, end = (char *)q + 3;
        else v = strtod(q, &end);
        if (end == q) BAD("bad value for %s", name);
        if (*end == ' ') {
            char *e2;
            strtoll(end + 1, &e2, 10);
            if (e2 == end + 1 || *e2) BAD("bad timestamp");
        } else if (*end) {
            BAD("text after the value of %s", name);
        }
        /* its family: the name, or the name less _bucket/_sum/_count for histograms */
        struct fam *f = NULL;
        for (int i = 0; i < n_fam && !f; i++) {
            size_t fl = strlen(fams[i].name);
            if (!strcmp(name, fams[i].name)) f = &fams[i];
            else if (!strncmp(name, fams[i].name, fl) && (!strcmp(fams[i].type, "histogram") || !strcmp(fams[i].type, "summary")) &&
                     (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") || !strcmp(name + fl, "_count")))
                f = &fams[i];
        }
        if (!f) BAD("sample %s before (or without) its TYPE", name);
        f->seen_samples = true;
        if (!strcmp(f->type, "counter") && !(v >= 0)) BAD("counter %s is %g", name, v);
        if (!strcmp(f->type, "histogram")) {
            size_t fl = strlen(f->name);
            char   key[1400];
            snprintf(key, sizeof(key), "%s{%s}", f->name, labels);
            if (!strcmp(name + fl, "_bucket")) {
                if (!le[0]) BAD("%s without le", name);
                if (strcmp(key, hist_key)) {
                    snprintf(hist_key, sizeof(hist_key), "%s", key);
                    last_bucket = -1;
                    inf_bucket  = -1;
                }
                if (v < last_bucket) BAD("%s buckets are not cumulative", f->name);
                last_bucket = v;
                if (!strcmp(le, "+Inf")) inf_bucket = v;
            } else if (!strcmp(name + fl, "_count")) {
                if (strcmp(key, hist_key) || inf_bucket < 0) BAD("%s_count without a +Inf bucket before it", f->name);
                if (v != inf_bucket) BAD("%s_count %g differs from its +Inf bucket %g", f->name, v, inf_bucket);
            } else if (name[fl] == '\0') {
                BAD("histogram %s has a plain sample", name);
            }
        }
        char full[1600];
        snprintf(full, sizeof(full), "%s{%s%s%s}", name, labels, le[0] ? "le=" : "", le);
        for (int i = 0; i < n_series; i++)
            if (!strcmp(series[i], full)) BAD("duplicate series %s", full);
        if (n_series < MAX_SERIES) series[n_series++] = strdup(full);
    }
    if (n_fam == 0) BAD("no metric families");
    ok = true;
out:
    for (int i = 0; i < n_series; i++) free(series[i]);
    free(series);
    free(fams);
    return ok;
}

#undef BAD

double tsrv_metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') return strtod(p + n + 1, NULL);
    return NAN;
}

bool tsrv_wait_metric(struct tsrv *s, const char *series, double v, double timeout_s)
{
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    for (int i = 0; i < (int)(timeout_s * 50); i++) {
        char *text = NULL;
        bool  ok   = tsrv_get(s, "/metrics", NULL, &text) == 200 && text && tsrv_metric(text, series) == v;
        free(text);
        if (ok) return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

bool tsrv_wait_idle(struct tsrv *s, double timeout_s)
{
    static const char *const series[] = {
        "dsv4_requests_running{tier=\"short\"}",  "dsv4_requests_running{tier=\"medium\"}",
        "dsv4_requests_running{tier=\"long\"}",   "dsv4_requests_waiting{tier=\"short\"}",
        "dsv4_requests_waiting{tier=\"medium\"}", "dsv4_requests_waiting{tier=\"long\"}",
    };
    struct timespec ts = { 0, 20 * 1000 * 1000 };
    for (int i = 0; i < (int)(timeout_s * 50); i++) {
        char *text = NULL;
        bool  idle = tsrv_get(s, "/metrics", NULL, &text) == 200 && text;
        for (size_t k = 0; idle && k < sizeof(series) / sizeof(series[0]); k++) idle = tsrv_metric(text, series[k]) == 0;
        free(text);
        if (idle) return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

/* ------------------------------------------------------------------ canned tool calls */

static const char *CANNED_MSGS =
    "[{\"role\":\"user\",\"content\":\"weather in Paris, and the time?\"},"
    "{\"role\":\"assistant\",\"reasoning_content\":\"The user wants two things.\",\"content\":\"Let me check.\","
    "\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"days\\\": 3}\"}},"
    "{\"id\":\"b\",\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\": \\\"CET\\\"}\"}}]}]";

/* The text after "<｜Assistant｜><think>" of the rendered turn, without the EOS text. */
char *tsrv_canned_turn(void)
{
    struct dsv4_chat_params cp;
    dsv4_chat_params_default(&cp);
    cp.mode           = DSV4_CHAT_MODE_THINKING;
    cp.keep_reasoning = true;
    char  *prompt;
    size_t n;
    if (dsv4_chat_render_json(CANNED_MSGS, strlen(CANNED_MSGS), &cp, &prompt, &n, NULL)) return NULL;
    const char *mark = "<｜Assistant｜><think>", *at = strstr(prompt, mark);
    const char *eos  = "<｜end▁of▁sentence｜>";
    char       *out  = NULL;
    if (at) {
        at += strlen(mark);
        size_t len = strlen(at), el = strlen(eos);
        if (len >= el && !strcmp(at + len - el, eos)) len -= el;
        out = strndup(at, len);
    }
    free(prompt);
    return out;
}

char *tsrv_canned_output(const dsv4_tokenizer *tok, const int32_t *ids, int n, bool stream, int tokens_per_event)
{
    return tsrv_canned_output_kind(tok, ids, n, SRV_API_CHAT, stream, tokens_per_event);
}

char *tsrv_canned_output_kind(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream,
                              int tokens_per_event)
{
    return tsrv_canned_run(tok, ids, n, kind, stream, tokens_per_event, NULL, SRV_FINISH_EOS);
}

char *tsrv_canned_output_forced(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream,
                                const char *forced)
{
    return tsrv_canned_run(tok, ids, n, kind, stream, 1, forced, SRV_FINISH_EOS);
}

char *tsrv_canned_run(const dsv4_tokenizer *tok, const int32_t *ids, int n, int kind, bool stream, int tokens_per_event,
                      const char *forced, int finish)
{
    struct srv_gen g;
    memset(&g, 0, sizeof(g));
    g.kind       = (enum srv_api_kind)kind;
    g.n_prompt   = 10;
    g.max_tokens = 1000;
    g.stream     = stream;
    g.parse_chat = true;
    g.mode       = forced ? DSV4_CHAT_MODE_CHAT : DSV4_CHAT_MODE_THINKING;
    g.tools      = true;
    g.forced     = (char *)forced; /* read by srv_out_new only */
    g.created    = 1700000000;
    snprintf(g.id, sizeof(g.id), kind == SRV_API_MESSAGES ? "msg_canned" : kind == SRV_API_RESPONSES ? "resp_canned"
                                                                                                : "chatcmpl-canned");
    struct srv_api_ctx c = { .model_name = "srv-tiny", .tok = tok, .vocab = 2048, .ctx = 4096 };
    struct srv_out    *o = srv_out_new(&g, &c);
    if (!o) return NULL;
    struct srv_buf sse = { 0 }, body = { 0 };
    if (stream) srv_out_begin(o, &sse);
    for (int i = 0; i < n; i += tokens_per_event) {
        struct srv_token ev[8];
        int              k = n - i < tokens_per_event ? n - i : tokens_per_event;
        for (int j = 0; j < k; j++) ev[j] = (struct srv_token){ .id = ids[i + j] };
        srv_out_tokens(o, ev, k, stream ? &sse : NULL);
    }
    enum srv_counter counted;
    srv_out_end(o, (enum srv_finish)finish, 4, NULL, stream ? &sse : NULL, &body, &counted);
    srv_out_free(o);
    if (stream) {
        srv_buf_free(&body);
        return sse.p;
    }
    srv_buf_free(&sse);
    return body.p;
}

bool tsrv_write_canned(const char *dir, const char *model_dir)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/tokenizer.json", model_dir);
    dsv4_tokenizer *tok;
    if (dsv4_tokenizer_load(&tok, path, NULL)) return false;
    char *turn = tsrv_canned_turn();
    bool  ok   = false;
    if (turn) {
        size_t   len = strlen(turn), n = 0;
        int32_t *ids = malloc(sizeof(int32_t) * (3 * len + 1));
        if (ids && dsv4_tokenizer_encode(tok, turn, len, 0, ids, 3 * len + 1, &n, NULL) == DSV4_OK) {
            char cmd[800];
            snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", dir);
            ok = system(cmd) == 0;
            /* OpenAI chat, Anthropic messages and OpenAI responses, each whole and streamed */
            static const char *const names[3][2] = { { "tool_whole.json", "tool_stream.sse" },
                                                     { "messages_whole.json", "messages_stream.sse" },
                                                     { "responses_whole.json", "responses_stream.sse" } };
            static const int kinds[3] = { SRV_API_CHAT, SRV_API_MESSAGES, SRV_API_RESPONSES };
            for (int api = 0; api < 3; api++)
                for (int st = 0; st < 2; st++) {
                    char *out = tsrv_canned_output_kind(tok, ids, (int)n, kinds[api], st, 1);
                    snprintf(path, sizeof(path), "%s/%s", dir, names[api][st]);
                    ok = ok && out && test_write_file(path, out, strlen(out)) == 0;
                    free(out);
                }
        }
        free(ids);
    }
    free(turn);
    dsv4_tokenizer_free(tok);
    return ok;
}

bool tsrv_make_model(struct test_ctx *t, const char *dir, unsigned long long seed)
{
    struct gen_opts o;
    gen_opts_default(&o);
    o.preset = "tiny-a";
    o.seed   = seed;
    o.quiet  = true;
    struct dsv4_err err;
    int             rc = gen_checkpoint(&o, dir, &err);
    CHECKF(rc == DSV4_OK, "gen: %s", err.msg);
    if (rc == DSV4_OK) rc = tsrv_write_tokenizer(dir, 2048, &err);
    CHECKF(rc == DSV4_OK, "tokenizer: %s", err.msg);
    return rc == DSV4_OK;
}
