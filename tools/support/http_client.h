/*
 * http_client.h - a small blocking HTTP/1.1 client over plain sockets, for `dsv4 loadtest`
 * and the server tests: one request per connection (Connection: close), Content-Length or
 * chunked bodies, and server-sent events read one at a time. Timeouts are per read, so a
 * stalled server shows up as an error instead of a hang. http_open_raw sends a request as
 * given, optionally a few bytes at a time (the slow and malformed clients of loadtest).
 */
#ifndef DSV4_HTTP_CLIENT_H
#define DSV4_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

struct http_url {
    char host[256];
    int  port;
    char path[512]; /* prefix of every request path, without a trailing slash ("" or "/x") */
};

/* Parses http://HOST[:PORT][/PREFIX]; false (with a message in err) otherwise. */
bool http_url_parse(const char *url, struct http_url *u, char *err, size_t err_cap);

struct http_conn {
    int    fd;
    int    status;      /* of the response, once the headers are read */
    char  *headers;     /* raw header block, NUL-terminated (lower-cased names not applied) */
    bool   chunked;
    long long remaining; /* Content-Length bytes left, -1 when unknown (read to close) */
    long long chunk_left; /* chunked: bytes left in the current chunk */
    bool   eof;
    char  *buf;          /* bytes received and not yet returned */
    size_t buf_len, buf_cap, buf_off;
    char  *sse;          /* SSE: decoded body bytes not yet parsed into events */
    size_t sse_len, sse_cap;
    char  *ev;           /* SSE: the data of the event returned last */
    size_t ev_len, ev_cap;
    double timeout_s;
};

/*
 * Connects, sends a request (body may be NULL) with extra header lines (each ending in
 * "\r\n", or NULL), and reads the status line and headers. Returns 0, or -1 with err set
 * (connection refused, timeout, malformed response).
 */
int http_open(struct http_conn *c, const char *host, int port, const char *method, const char *path,
              const char *extra_headers, const char *body, size_t body_len, double timeout_s, char *err,
              size_t err_cap);
/* How far http_open_raw got when it failed. */
enum http_open_status {
    HTTP_OPEN_OK        = 0,
    HTTP_OPEN_ECONNECT  = -1, /* no connection: refused, unresolvable, timed out */
    HTTP_OPEN_ESEND     = -2, /* the server stopped taking the request (closed, reset) and sent no status */
    HTTP_OPEN_ERESPONSE = -3, /* the request went out whole; no or a malformed response came back */
};

/*
 * http_open for a request already written out whole (request line, headers, blank line,
 * body), so a caller can send malformed or lying requests. piece > 0 sends it piece bytes
 * at a time, waiting pause_s between pieces (a slow client; TCP_NODELAY so each piece
 * leaves on its own); it stops sending as soon as the server answers or closes. Returns
 * HTTP_OPEN_OK with the status and headers read (also when the server answered before
 * the whole request was sent), or a negative enum http_open_status with err set.
 */
int http_open_raw(struct http_conn *c, const char *host, int port, const char *req, size_t req_len, size_t piece,
                  double pause_s, double timeout_s, char *err, size_t err_cap);
/* The value of a response header (case-insensitive name) copied into out; false if absent. */
bool http_header(const struct http_conn *c, const char *name, char *out, size_t cap);
/* Reads decoded body bytes: > 0 bytes, 0 at the end of the body, -1 on error or timeout. */
long http_read(struct http_conn *c, char *out, size_t cap);
/* Reads the whole body into a malloc'd NUL-terminated buffer; NULL on error. */
char *http_read_all(struct http_conn *c, size_t *len);
/*
 * Server-sent events: returns 1 with *data pointing at the next event's data (its "data:"
 * lines joined by newlines; valid until the next call), 2 for a comment line (":..."),
 * 0 at the end of the body, -1 on error.
 */
int http_sse_next(struct http_conn *c, const char **data, size_t *len);
void http_close(struct http_conn *c);

/* One-shot: a whole request and response. Returns the status, or -1 with err set. */
int http_request(const char *host, int port, const char *method, const char *path, const char *extra_headers,
                 const char *body, char **resp_body, size_t *resp_len, double timeout_s, char *err, size_t err_cap);

#endif
