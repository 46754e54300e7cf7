/*
 * session_file.c - a session saved to one file and loaded back (dsv4_session_save/load,
 * include/dsv4.h), so a conversation resumes after a restart without a prefill.
 *
 * The file is a kv-disk record (kv_disk_file.h: the 128-byte header with magic, version,
 * the model's identity and CRC-32C of header and payload) of its own kind: key chain
 * SESSION_CHAIN, depth SESSION_DEPTH (no prefix-cache record has that depth, so neither kind
 * of file is read as the other). Identity: dsv4_model_kv_identity of the session's state
 * layout, so a file of another model, revision or MTP setting is refused. The payload
 * (docs/FORMAT.md, "Saved sessions"):
 *   preamble  32 bytes, u32 LE: version, n_tok, mtp_pos, has_logits, vocab, n_pages,
 *             then u64 LE slot bytes
 *   tokens    [n_tok] i32 LE
 *   logits    [vocab] f32 (has_logits only): the row the next token is sampled from
 *   slot      the session's slot as it lies in KV memory (rings, frontiers, MTP streams)
 *   pages     [n_pages] pages in use, ceil(n_tok / page_tokens), as in KV memory
 * Slot, pages and logits are host-order bytes; the format is little-endian hosts only.
 * Everything goes through the backend's download and upload, so any backend saves and loads.
 * The payload's encoder and decoder (session_file.h) also serve the prompt cache's records
 * (session_cache.c), which hold the same payload in a kv-disk store.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/session_file.h"
#include "kv/kv_disk_file.h"

enum { SESSION_VERSION = 1, PREAMBLE = 32 };
static const uint64_t SESSION_CHAIN = 0x5353455334565344ull; /* "DSV4SESS" little-endian */
static const uint32_t SESSION_DEPTH = 0xFFFFFFFFu;

_Static_assert(sizeof(float) == 4 && sizeof(int32_t) == 4, "the file stores 4-byte floats and ids");

struct layout {
    size_t slot, page, logits, tokens, total;
    int    n_pages;
};

static void layout_of(const dsv4_session *s, int n_tok, bool logits, struct layout *l)
{
    const struct dsv4_seq_state *st = &s->st;
    l->slot    = (size_t)(st->page_base - (const uint8_t *)st->mem);
    l->page    = st->page_bytes;
    l->n_pages = (n_tok + st->page_tokens - 1) / st->page_tokens;
    l->tokens  = sizeof(int32_t) * (size_t)n_tok;
    l->logits  = logits ? sizeof(float) * (size_t)s->engine->model.cfg.vocab_size : 0;
    l->total   = PREAMBLE + l->tokens + l->logits + l->slot + (size_t)l->n_pages * l->page;
}

int dsv4_session_identity(const dsv4_session *s, uint8_t id[DSV4_KV_DISK_ID_BYTES])
{
    const struct dsv4_model *m = &s->engine->model;
    size_t snap = dsv4_kv_snap_bytes(&m->cfg.kv, s->st.fmt, s->st.has_mtp);
    char   compute[256];
    dsv4_engine_compute_text(s->engine, compute, sizeof(compute));
    return dsv4_model_kv_identity(m, compute, s->st.has_mtp, s->st.page_tokens, s->st.page_bytes, snap, id);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* KV memory <-> host, through the backend when there is one. */
static void kv_io(const struct dsv4_kv_mem *m, void *dst, const void *src, size_t n, bool down)
{
    if (!m->kind) memcpy(dst, src, n);
    else if (down) m->kind->download(m->impl, dst, src, n);
    else m->kind->upload(m->impl, dst, src, n);
}

size_t dsv4_session_payload_bytes(const dsv4_session *s, int n_tok, bool logits)
{
    struct layout l;
    layout_of(s, n_tok, logits, &l);
    return l.total;
}

int dsv4_session_encode(const dsv4_session *s, const int32_t *tokens, int n_tokens, uint8_t **out, size_t *len,
                        struct dsv4_err *err)
{
    const struct dsv4_seq_state *st = &s->st;
    *out                            = NULL;
    if (n_tokens != st->pos || (n_tokens > 0 && !tokens))
        return dsv4_err_set(err, DSV4_EINVAL, "saving %d tokens of a session that holds %d", n_tokens, st->pos);
    struct layout l;
    layout_of(s, n_tokens, s->has_logits, &l);
    uint8_t *buf = malloc(l.total);
    if (!buf) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for a %zu-byte session", l.total);
    uint8_t *p = buf;
    memset(p, 0, PREAMBLE);
    const uint32_t pre[6] = { SESSION_VERSION, (uint32_t)n_tokens, (uint32_t)st->mtp_pos, s->has_logits,
                              (uint32_t)s->engine->model.cfg.vocab_size, (uint32_t)l.n_pages };
    for (int i = 0; i < 6; i++) put32(p + 4 * i, pre[i]);
    put32(p + 24, (uint32_t)l.slot);
    put32(p + 28, (uint32_t)((uint64_t)l.slot >> 32));
    p += PREAMBLE;
    for (int i = 0; i < n_tokens; i++) put32(p + 4 * (size_t)i, (uint32_t)tokens[i]);
    p += l.tokens;
    memcpy(p, s->logits, l.logits);
    p += l.logits;
    kv_io(&st->kvmem, p, st->mem, l.slot + (size_t)l.n_pages * l.page, true);
    if (st->kvmem.kind && st->kvmem.kind->sync) st->kvmem.kind->sync(st->kvmem.impl);
    *out = buf;
    *len = l.total;
    return DSV4_OK;
}

int dsv4_session_save(const dsv4_session *s, const char *path, const int32_t *tokens, int n_tokens,
                      struct dsv4_err *err)
{
    struct kvd_header h = { .key = { SESSION_CHAIN, SESSION_DEPTH }, .meta = { 0, (uint64_t)n_tokens } };
    if (dsv4_session_identity(s, h.identity))
        return dsv4_err_set(err, DSV4_ENOMEM, "out of memory for the model identity");
    uint8_t *buf = NULL;
    size_t   len = 0;
    int      rc  = dsv4_session_encode(s, tokens, n_tokens, &buf, &len, err);
    if (rc) return rc;
    h.payload_len = len;
    h.payload_crc = dsv4_crc32c(0, buf, len);
    uint8_t hdr[DSV4_KV_DISK_HEADER];
    kvd_header_encode(&h, hdr);
    char why[4400];
    rc = kvd_write_file(path, hdr, buf, len, why, sizeof(why)) ? DSV4_EIO : DSV4_OK;
    free(buf);
    return rc ? dsv4_err_set(err, rc, "saving the session: %s", why) : DSV4_OK;
}

/* Reads and verifies path into a fresh buffer (*buf, header in *h); false with why. */
static int read_verified(const dsv4_session *s, const char *path, struct kvd_header *h, uint8_t **buf,
                         char *why, size_t cap)
{
    uint8_t id[DSV4_KV_DISK_ID_BYTES], raw[DSV4_KV_DISK_HEADER];
    if (dsv4_session_identity(s, id)) return snprintf(why, cap, "out of memory for the model identity"), DSV4_ENOMEM;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return snprintf(why, cap, "cannot open: %s", strerror(errno)), DSV4_EIO;
    struct stat sb;
    ssize_t     got = fstat(fd, &sb) == 0 ? kvd_read_full(fd, raw, sizeof(raw)) : -1;
    int         rc  = DSV4_EFORMAT;
    struct dsv4_kv_disk_key key = { SESSION_CHAIN, SESSION_DEPTH };
    if (got < 0) snprintf(why, cap, "cannot read: %s", strerror(errno)), rc = DSV4_EIO;
    else if (!kvd_header_is_valid(raw, (size_t)got, (uint64_t)sb.st_size, id, key, h, why, cap)) (void)0;
    else if (!(*buf = malloc(h->payload_len ? h->payload_len : 1)))
        snprintf(why, cap, "out of memory for %llu bytes", (unsigned long long)h->payload_len), rc = DSV4_ENOMEM;
    else if (kvd_read_full(fd, *buf, h->payload_len) != (ssize_t)h->payload_len)
        snprintf(why, cap, "truncated while being read");
    else if (dsv4_crc32c(0, *buf, h->payload_len) != h->payload_crc)
        snprintf(why, cap, "payload checksum mismatch");
    else rc = DSV4_OK;
    close(fd);
    if (rc && *buf) free(*buf), *buf = NULL;
    return rc;
}

/* Whether the verified payload's preamble fits this session; fills *l. */
static bool preamble_fits(const dsv4_session *s, const uint8_t *p, uint64_t len, uint64_t n_tok, int cap,
                          struct layout *l, char *why, size_t wcap)
{
    if (len < PREAMBLE) return snprintf(why, wcap, "payload shorter than its preamble"), false;
    uint32_t n = get32(p + 4), has_logits = get32(p + 12);
    if (get32(p) != SESSION_VERSION)
        return snprintf(why, wcap, "session version %u, this build reads %d", get32(p), SESSION_VERSION), false;
    if (n != n_tok || n > (uint32_t)s->st.max_ctx || (int64_t)n > cap || has_logits > 1)
        return snprintf(why, wcap, "%u tokens: the session holds at most %d and the caller %d", n, s->st.max_ctx, cap),
               false;
    layout_of(s, (int)n, has_logits, l);
    uint64_t slot = get32(p + 24) | (uint64_t)get32(p + 28) << 32;
    if (get32(p + 16) != (uint32_t)s->engine->model.cfg.vocab_size || get32(p + 20) != (uint32_t)l->n_pages ||
        slot != l->slot || get32(p + 8) > n || len != l->total)
        return snprintf(why, wcap, "its layout (vocabulary, pages, slot, length) is not this session's"), false;
    return true;
}

int dsv4_session_decode(dsv4_session *s, const uint8_t *buf, uint64_t len, uint64_t n_tok, const int32_t *expect,
                        int32_t *tokens, int cap, char *why, size_t wcap)
{
    struct layout l;
    dsv4_session_reset(s);
    if (!preamble_fits(s, buf, len, n_tok, cap, &l, why, wcap)) return DSV4_EFORMAT;
    int            n = (int)n_tok;
    const uint8_t *p = buf + PREAMBLE;
    for (int i = 0; expect && i < n; i++)
        if ((int32_t)get32(p + 4 * (size_t)i) != expect[i])
            return snprintf(why, wcap, "its token %d is not the prompt's (a key collision)", i), DSV4_EFORMAT;
    for (int i = 0; tokens && i < n; i++) tokens[i] = (int32_t)get32(p + 4 * (size_t)i);
    p += l.tokens;
    memcpy(s->logits, p, l.logits);
    p += l.logits;
    kv_io(&s->st.kvmem, s->st.mem, p, l.slot + (size_t)l.n_pages * l.page, false);
    if (s->st.kvmem.kind && s->st.kvmem.kind->sync) s->st.kvmem.kind->sync(s->st.kvmem.impl);
    s->st.pos     = n;
    s->st.mtp_pos = (int)get32(buf + 8);
    s->has_logits = l.logits > 0;
    return DSV4_OK;
}

int dsv4_session_load(dsv4_session *s, const char *path, int32_t *tokens, int cap, int *n_tokens,
                      struct dsv4_err *err)
{
    struct kvd_header h;
    uint8_t          *buf = NULL;
    char              why[512];
    dsv4_session_reset(s);
    *n_tokens = 0;
    int rc    = read_verified(s, path, &h, &buf, why, sizeof(why));
    if (rc == DSV4_OK) rc = dsv4_session_decode(s, buf, h.payload_len, h.meta.n_tok, NULL, tokens, cap, why, sizeof(why));
    free(buf);
    if (rc) return dsv4_err_set(err, rc, "session file %s: %s", path, why);
    *n_tokens = (int)h.meta.n_tok;
    return DSV4_OK;
}
