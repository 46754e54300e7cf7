/*
 * http_client.c - the blocking HTTP/1.1 client of http_client.h: sockets, a receive
 * buffer, header parsing, Content-Length / chunked / read-to-close bodies, and an SSE
 * event splitter. Every wait for the network goes through poll() with the connection's
 * timeout.
 */
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/http_client.h"

static void seterr(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || !cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

bool http_url_parse(const char *url, struct http_url *u, char *err, size_t err_cap)
{
    memset(u, 0, sizeof(*u));
    if (strncmp(url, "http://", 7) != 0) {
        seterr(err, err_cap, "the URL must start with http:// (got '%s')", url);
        return false;
    }
    const char *h = url + 7, *end = h + strcspn(h, ":/");
    if (end == h || (size_t)(end - h) >= sizeof(u->host)) {
        seterr(err, err_cap, "no host in '%s'", url);
        return false;
    }
    memcpy(u->host, h, (size_t)(end - h));
    u->port = 80;
    if (*end == ':') {
        char *e;
        long  p = strtol(end + 1, &e, 10);
        if (e == end + 1 || p < 1 || p > 65535 || (*e && *e != '/')) {
            seterr(err, err_cap, "bad port in '%s'", url);
            return false;
        }
        u->port = (int)p;
        end     = e;
    }
    snprintf(u->path, sizeof(u->path), "%s", end);
    size_t n = strlen(u->path);
    while (n && u->path[n - 1] == '/') u->path[--n] = '\0';
    return true;
}

/* ------------------------------------------------------------------ bytes */

static bool wait_fd(int fd, short ev, double timeout_s)
{
    struct pollfd p = { .fd = fd, .events = ev };
    int           ms = timeout_s <= 0 ? 0 : (int)(timeout_s * 1000 + 0.5);
    for (;;) {
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        return r > 0;
    }
}

/* Receives more bytes into the buffer: > 0 got some, 0 closed, -1 error or timeout. */
static long fill(struct http_conn *c)
{
    if (c->buf_off == c->buf_len) c->buf_off = c->buf_len = 0;
    if (c->buf_cap - c->buf_len < 4096) {
        if (c->buf_off) {
            memmove(c->buf, c->buf + c->buf_off, c->buf_len - c->buf_off);
            c->buf_len -= c->buf_off;
            c->buf_off = 0;
        }
        if (c->buf_cap - c->buf_len < 4096) {
            size_t cap = c->buf_cap ? c->buf_cap * 2 : 16384;
            char  *p   = realloc(c->buf, cap);
            if (!p) return -1;
            c->buf     = p;
            c->buf_cap = cap;
        }
    }
    if (!wait_fd(c->fd, POLLIN, c->timeout_s)) return -1;
    ssize_t n;
    do n = recv(c->fd, c->buf + c->buf_len, c->buf_cap - c->buf_len, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) return -1;
    c->buf_len += (size_t)n;
    return n;
}

/* The next line without its CR LF (in place in the buffer, NUL-terminated); NULL on error. */
static char *read_line(struct http_conn *c)
{
    for (;;) {
        char *start = c->buf + c->buf_off;
        char *nl    = c->buf_len > c->buf_off ? memchr(start, '\n', c->buf_len - c->buf_off) : NULL;
        if (nl) {
            c->buf_off = (size_t)(nl + 1 - c->buf);
            if (nl > start && nl[-1] == '\r') nl--;
            *nl = '\0';
            return start;
        }
        if (c->buf_len - c->buf_off > 65536 || fill(c) <= 0) return NULL;
    }
}

static long raw_read(struct http_conn *c, char *out, size_t cap)
{
    if (c->buf_off == c->buf_len) {
        long n = fill(c);
        if (n <= 0) return n;
    }
    size_t n = c->buf_len - c->buf_off;
    if (n > cap) n = cap;
    memcpy(out, c->buf + c->buf_off, n);
    c->buf_off += n;
    return (long)n;
}

/* ------------------------------------------------------------------ requests */

static int connect_to(const char *host, int port, double timeout_s, char *err, size_t cap)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai = NULL;
    char            ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g) {
        seterr(err, cap, "cannot resolve %s: %s", host, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
        int       soerr = errno;
        socklen_t sl    = sizeof(soerr);
        if (soerr == EINPROGRESS && wait_fd(fd, POLLOUT, timeout_s) &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
            break;
        seterr(err, cap, "cannot connect to %s:%d: %s", host, port, soerr == EINPROGRESS ? "timeout" : strerror(soerr));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

static bool send_all(int fd, const char *p, size_t n, double timeout_s)
{
    while (n) {
        if (!wait_fd(fd, POLLOUT, timeout_s)) return false;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

bool http_header(const struct http_conn *c, const char *name, char *out, size_t cap)
{
    size_t      nl = strlen(name);
    const char *p  = c->headers;
    while (p && *p) {
        const char *eol = strchr(p, '\n');
        size_t      len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ' || *v == '\t') v++;
            size_t vl = (size_t)(p + len - v);
            while (vl && (v[vl - 1] == '\r' || v[vl - 1] == ' ')) vl--;
            if (vl >= cap) vl = cap - 1;
            memcpy(out, v, vl);
            out[vl] = '\0';
            return true;
        }
        p = eol ? eol + 1 : NULL;
    }
    return false;
}

/* Reads the status line and the headers of the response; 0, or -1 with err set. */
static int read_head(struct http_conn *c, bool is_head, const char *host, int port, char *err, size_t err_cap)
{
    char *status = read_line(c);
    if (!status || sscanf(status, "HTTP/1.%*d %d", &c->status) != 1) {
        seterr(err, err_cap, "no HTTP status line from %s:%d", host, port);
        return -1;
    }
    size_t hl = 0, hc = 1024;
    c->headers = malloc(hc);
    if (!c->headers) return -1;
    c->headers[0] = '\0';
    for (;;) {
        char *line = read_line(c);
        if (!line) {
            seterr(err, err_cap, "the response headers from %s:%d ended early", host, port);
            return -1;
        }
        if (!*line) break;
        size_t ll = strlen(line);
        if (hl + ll + 2 > hc) {
            while (hl + ll + 2 > hc) hc *= 2;
            char *p = realloc(c->headers, hc);
            if (!p) return -1;
            c->headers = p;
        }
        memcpy(c->headers + hl, line, ll);
        hl += ll;
        c->headers[hl++] = '\n';
        c->headers[hl]   = '\0';
    }
    char v[64];
    if (http_header(c, "Transfer-Encoding", v, sizeof(v)) && strcasecmp(v, "chunked") == 0) c->chunked = true;
    else if (http_header(c, "Content-Length", v, sizeof(v))) c->remaining = strtoll(v, NULL, 10);
    if (is_head || c->status == 204 || c->status == 304) c->eof = true;
    return 0;
}

int http_open(struct http_conn *c, const char *host, int port, const char *method, const char *path,
              const char *extra_headers, const char *body, size_t body_len, double timeout_s, char *err,
              size_t err_cap)
{
    memset(c, 0, sizeof(*c));
    c->fd        = -1;
    c->timeout_s = timeout_s;
    c->remaining = -1;
    if ((c->fd = connect_to(host, port, timeout_s, err, err_cap)) < 0) return -1;
    size_t hn   = strlen(method) + strlen(path) + strlen(host) + (extra_headers ? strlen(extra_headers) : 0) + 256;
    char  *head = malloc(hn);
    if (!head) goto fail;
    int k = snprintf(head, hn, "%s %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n%s", method, path, host, port,
                     extra_headers ? extra_headers : "");
    if (body) k += snprintf(head + k, hn - (size_t)k, "Content-Type: application/json\r\nContent-Length: %zu\r\n", body_len);
    k += snprintf(head + k, hn - (size_t)k, "\r\n");
    bool ok = send_all(c->fd, head, (size_t)k, timeout_s) && (!body || send_all(c->fd, body, body_len, timeout_s));
    free(head);
    if (!ok) {
        seterr(err, err_cap, "sending the request failed (%s)", strerror(errno));
        goto fail;
    }
    if (read_head(c, !strcmp(method, "HEAD"), host, port, err, err_cap)) goto fail;
    return 0;
fail:
    http_close(c);
    return -1;
}

int http_open_raw(struct http_conn *c, const char *host, int port, const char *req, size_t req_len, size_t piece,
                  double pause_s, double timeout_s, char *err, size_t err_cap)
{
    memset(c, 0, sizeof(*c));
    c->fd        = -1;
    c->timeout_s = timeout_s;
    c->remaining = -1;
    if ((c->fd = connect_to(host, port, timeout_s, err, err_cap)) < 0) return HTTP_OPEN_ECONNECT;
    if (piece) {
        /* Without it Nagle's algorithm would gather the pieces, and the server would see
         * a slow client only as one that pauses once. */
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    size_t off = 0;
    while (off < req_len) {
        size_t n = piece && piece < req_len - off ? piece : req_len - off;
        if (!send_all(c->fd, req + off, n, timeout_s)) break;
        off += n;
        /* A server that answers or closes early (a timeout, a 413 from the headers) is
         * heard at once instead of at the next piece. */
        if (piece && off < req_len && wait_fd(c->fd, POLLIN, pause_s)) break;
    }
    bool sent = off == req_len;
    if (read_head(c, req_len >= 5 && !memcmp(req, "HEAD ", 5), host, port, err, err_cap)) {
        if (!sent)
            seterr(err, err_cap, "%s:%d stopped taking the request after %zu of %zu bytes", host, port, off, req_len);
        http_close(c);
        return sent ? HTTP_OPEN_ERESPONSE : HTTP_OPEN_ESEND;
    }
    return HTTP_OPEN_OK;
}

long http_read(struct http_conn *c, char *out, size_t cap)
{
    if (c->eof || cap == 0) return 0;
    if (c->chunked) {
        if (c->chunk_left == 0) {
            char *line = read_line(c);
            if (!line) return -1;
            c->chunk_left = strtoll(line, NULL, 16);
            if (c->chunk_left == 0) {
                for (;;) { /* trailers up to the empty line */
                    line = read_line(c);
                    if (!line) return -1;
                    if (!*line) break;
                }
                c->eof = true;
                return 0;
            }
        }
        size_t want = (size_t)c->chunk_left < cap ? (size_t)c->chunk_left : cap;
        long   n    = raw_read(c, out, want);
        if (n <= 0) return -1;
        c->chunk_left -= n;
        if (c->chunk_left == 0 && !read_line(c)) return -1; /* the CRLF after the data */
        return n;
    }
    if (c->remaining >= 0) {
        if (c->remaining == 0) {
            c->eof = true;
            return 0;
        }
        size_t want = (size_t)c->remaining < cap ? (size_t)c->remaining : cap;
        long   n    = raw_read(c, out, want);
        if (n <= 0) return -1;
        c->remaining -= n;
        return n;
    }
    long n = raw_read(c, out, cap);
    if (n == 0) c->eof = true;
    return n;
}

char *http_read_all(struct http_conn *c, size_t *len)
{
    size_t n = 0, cap = 4096;
    char  *p = malloc(cap);
    while (p) {
        if (cap - n < 4096) {
            char *q = realloc(p, cap * 2);
            if (!q) break;
            p = q;
            cap *= 2;
        }
        long k = http_read(c, p + n, cap - n - 1);
        if (k < 0) break;
        if (k == 0) {
            p[n] = '\0';
            if (len) *len = n;
            return p;
        }
        n += (size_t)k;
    }
    free(p);
    return NULL;
}

static bool grow(char **p, size_t *cap, size_t need)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return false;
    *p   = q;
    *cap = c;
    return true;
}

int http_sse_next(struct http_conn *c, const char **data, size_t *len)
{
    c->ev_len = 0;
    bool have = false;
    for (;;) {
        char *nl = c->sse_len ? memchr(c->sse, '\n', c->sse_len) : NULL;
        if (!nl) {
            if (!grow(&c->sse, &c->sse_cap, c->sse_len + 4096)) return -1;
            long n = http_read(c, c->sse + c->sse_len, c->sse_cap - c->sse_len);
            if (n < 0) return -1;
            if (n == 0) return have ? 1 : 0;
            c->sse_len += (size_t)n;
            continue;
        }
        size_t ll = (size_t)(nl - c->sse), used = ll + 1;
        if (ll && c->sse[ll - 1] == '\r') ll--;
        int ret = 0;
        if (ll == 0) {
            ret = have ? 1 : 0;
        } else if (c->sse[0] == ':') {
            ret = have ? 0 : 2;
        } else if (ll >= 5 && memcmp(c->sse, "data:", 5) == 0) {
            size_t off = ll > 5 && c->sse[5] == ' ' ? 6 : 5;
            if (!grow(&c->ev, &c->ev_cap, c->ev_len + ll + 2)) return -1;
            if (have) c->ev[c->ev_len++] = '\n';
            memcpy(c->ev + c->ev_len, c->sse + off, ll - off);
            c->ev_len += ll - off;
            have = true;
        }
        memmove(c->sse, c->sse + used, c->sse_len - used);
        c->sse_len -= used;
        if (ret) {
            if (!grow(&c->ev, &c->ev_cap, c->ev_len + 1)) return -1;
            c->ev[c->ev_len] = '\0';
            *data            = c->ev;
            *len             = c->ev_len;
            return ret;
        }
    }
}

void http_close(struct http_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->headers);
    free(c->buf);
    free(c->sse);
    free(c->ev);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

int http_request(const char *host, int port, const char *method, const char *path, const char *extra_headers,
                 const char *body, char **resp_body, size_t *resp_len, double timeout_s, char *err, size_t err_cap)
{
    struct http_conn c;
    if (resp_body) *resp_body = NULL;
    if (http_open(&c, host, port, method, path, extra_headers, body, body ? strlen(body) : 0, timeout_s, err, err_cap))
        return -1;
    size_t n = 0;
    char  *b = http_read_all(&c, &n);
    int    status = c.status;
    http_close(&c);
    if (!b) {
        seterr(err, err_cap, "reading the response body failed");
        return -1;
    }
    if (resp_body) *resp_body = b;
    else free(b);
    if (resp_len) *resp_len = n;
    return status;
}
