/*
 * strbuf.c - the server's growable byte buffer (struct srv_buf) and the UTF-8 repair every
 * JSON string of generated text goes through.
 *
 * A buffer that cannot grow becomes sticky out-of-memory (oom): later writes are dropped and
 * the caller checks once at the end, so building a response needs no check per write.
 */
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static void grow(struct srv_buf *b, size_t need)
{
    if (b->oom || b->len + need + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + need + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    b->p   = p;
    b->cap = cap;
}

void srv_buf_put(struct srv_buf *b, const void *s, size_t n)
{
    grow(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void srv_buf_puts(struct srv_buf *b, const char *s)
{
    srv_buf_put(b, s, strlen(s));
}

void srv_buf_printf(struct srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    grow(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void srv_buf_free(struct srv_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* Length of the valid UTF-8 sequence at s (1 to 4), or 0 if the byte starts none. */
size_t srv_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t   k;
    unsigned min;
    if ((c & 0xe0) == 0xc0) k = 2, min = 0x80;
    else if ((c & 0xf0) == 0xe0) k = 3, min = 0x800;
    else if ((c & 0xf8) == 0xf0) k = 4, min = 0x10000;
    else return 0;
    if (k > n) return 0;
    unsigned cp = c & (0x7f >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

/* A JSON string of s[0..n), each invalid byte replaced by U+FFFD (token pieces may be
 * parts of a character). */
json_t *srv_json_str(const char *s, size_t n)
{
    json_t *v = json_stringn(s, n);
    if (v) return v;
    struct srv_buf b = { 0 };
    for (size_t i = 0; i < n;) {
        size_t k = srv_utf8_seq((const unsigned char *)s + i, n - i);
        if (k) {
            srv_buf_put(&b, s + i, k);
            i += k;
        } else {
            srv_buf_puts(&b, "\xef\xbf\xbd");
            i++;
        }
    }
    v = b.oom ? json_string("") : json_stringn(b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return v;
}

json_t *srv_json_buf(const struct srv_buf *b)
{
    return srv_json_str(b->p ? b->p : "", b->len);
}
