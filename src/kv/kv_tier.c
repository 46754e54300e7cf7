/*
 * kv_tier.c - the disk tier under the prefix cache (see kv_tier.h): payload layout,
 * write-behind through a bounded set of host buffers and one writer thread, synchronous
 * checked reads.
 *
 * The buffers cycle between two lists under mu: free (a stack) and queued (FIFO, filled by
 * the stepping thread, emptied by the writer). A buffer taken from the free list belongs to
 * the stepping thread until it is queued, and a queued one to the writer until it is put
 * back, so the downloads and the file writes run outside the lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_tier.h"

struct job {
    struct dsv4_kv_disk_key  key;
    struct dsv4_kv_disk_meta meta;
    uint8_t                 *buf; /* [payload] */
};

struct dsv4_kv_tier {
    struct dsv4_kv_disk *disk;
    struct dsv4_kv_mem   mem;
    int                  page_tokens;
    size_t               tok_bytes, page_bytes, snap_bytes, payload;
    uint8_t             *rbuf[2];    /* [payload] reads alternate, so the last good one stays */
    int                  last;       /* rbuf of the last successful load */
    uint8_t             *scratch;    /* [snap_bytes] in KV memory: a snapshot outside the cache */
    uint64_t             token_mismatch;
    pthread_t            writer;
    bool                 started;
    pthread_mutex_t      mu;
    pthread_cond_t       cv;
    /* under mu */
    struct job          *job;        /* [n_buf] */
    int                  n_buf;
    int                 *free_stack; /* [n_buf] */
    int                  n_free;
    int                 *queue;      /* [n_buf] ring of queued jobs */
    int                  q_head, q_len;
    int                  busy;       /* jobs the writer holds */
    bool                 stop;
    uint64_t             dropped;
};

static void *writer_main(void *arg)
{
    struct dsv4_kv_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->q_len && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->q_len) break; /* stopping and drained */
        int j     = t->queue[t->q_head];
        t->q_head = (t->q_head + 1) % t->n_buf;
        t->q_len--;
        t->busy++;
        pthread_mutex_unlock(&t->mu);
        struct dsv4_err err;
        /* failures are counted by the store (write_errors; it logs and disables writes) */
        (void)dsv4_kv_disk_put(t->disk, t->job[j].key, &t->job[j].meta, t->job[j].buf, t->payload, &err);
        pthread_mutex_lock(&t->mu);
        t->busy--;
        t->free_stack[t->n_free++] = j;
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

static void tier_free(struct dsv4_kv_tier *t)
{
    if (t->job)
        for (int i = 0; i < t->n_buf; i++) free(t->job[i].buf);
    free(t->job);
    free(t->free_stack);
    free(t->queue);
    free(t->rbuf[0]);
    free(t->rbuf[1]);
    if (t->scratch) dsv4_kv_mem_free(&t->mem, t->scratch, t->snap_bytes);
    dsv4_kv_disk_close(t->disk);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static bool alloc_buffers(struct dsv4_kv_tier *t)
{
    t->job        = calloc((size_t)t->n_buf, sizeof(*t->job));
    t->free_stack = calloc((size_t)t->n_buf, sizeof(int));
    t->queue      = calloc((size_t)t->n_buf, sizeof(int));
    t->rbuf[0]    = malloc(t->payload);
    t->rbuf[1]    = malloc(t->payload);
    t->scratch    = dsv4_kv_mem_alloc(&t->mem, t->snap_bytes);
    if (!t->job || !t->free_stack || !t->queue || !t->rbuf[0] || !t->rbuf[1] || !t->scratch) return false;
    for (int i = 0; i < t->n_buf; i++) {
        if (!(t->job[i].buf = malloc(t->payload))) return false;
        t->free_stack[t->n_free++] = i;
    }
    return true;
}

int dsv4_kv_tier_open(struct dsv4_kv_tier **out, const struct dsv4_kv_tier_params *p,
                      const uint8_t identity[DSV4_KV_DISK_ID_BYTES], const struct dsv4_kv_mem *mem,
                      const struct dsv4_logger *log, struct dsv4_err *err)
{
    *out                   = NULL;
    struct dsv4_kv_tier *t = calloc(1, sizeof(*t));
    if (!t) return dsv4_err_set(err, DSV4_ENOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    if (mem) t->mem = *mem;
    t->page_tokens = p->page_tokens;
    t->tok_bytes   = sizeof(int32_t) * (size_t)p->page_tokens;
    t->page_bytes  = p->page_bytes;
    t->snap_bytes  = p->snap_bytes;
    t->payload     = t->tok_bytes + t->page_bytes + t->snap_bytes;
    t->n_buf       = p->n_buf > 0 ? p->n_buf : 8;
    if (!alloc_buffers(t)) {
        tier_free(t);
        return dsv4_err_set(err, DSV4_ENOMEM, "cannot allocate %d disk-tier write buffers of %zu bytes", p->n_buf,
                            t->payload);
    }
    int rc = dsv4_kv_disk_open(&t->disk, p->dir, p->budget, identity, log, err);
    if (rc) {
        tier_free(t);
        return rc;
    }
    if (pthread_create(&t->writer, NULL, writer_main, t) != 0) {
        tier_free(t);
        return dsv4_err_set(err, DSV4_EIO, "cannot start the disk-tier writer thread");
    }
    t->started = true;
    *out       = t;
    return DSV4_OK;
}

void dsv4_kv_tier_close(struct dsv4_kv_tier *t)
{
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
    }
    tier_free(t);
}

static void from_kv(const struct dsv4_kv_mem *m, void *dst, const void *src, size_t n)
{
    if (m->kind) m->kind->download(m->impl, dst, src, n);
    else memcpy(dst, src, n);
}

static void to_kv(const struct dsv4_kv_mem *m, void *dst, const void *src, size_t n)
{
    if (m->kind) m->kind->upload(m->impl, dst, src, n);
    else memcpy(dst, src, n);
}

void dsv4_kv_tier_write(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const struct dsv4_kv_disk_meta *meta,
                        const int32_t *tokens, const void *page, const void *snap)
{
    pthread_mutex_lock(&t->mu);
    int j = t->n_free ? t->free_stack[--t->n_free] : -1;
    if (j < 0) t->dropped++;
    pthread_mutex_unlock(&t->mu);
    if (j < 0) return;
    struct job *jb = &t->job[j];
    jb->key        = key;
    jb->meta       = *meta;
    memcpy(jb->buf, tokens, t->tok_bytes); /* little-endian hosts only (as the whole engine) */
    from_kv(&t->mem, jb->buf + t->tok_bytes, page, t->page_bytes);
    from_kv(&t->mem, jb->buf + t->tok_bytes + t->page_bytes, snap, t->snap_bytes);
    if (t->mem.kind && t->mem.kind->sync) t->mem.kind->sync(t->mem.impl);
    pthread_mutex_lock(&t->mu);
    t->queue[(t->q_head + t->q_len) % t->n_buf] = j;
    t->q_len++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

bool dsv4_kv_tier_load(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const int32_t *tokens)
{
    struct dsv4_kv_disk_meta meta;
    struct dsv4_err          err;
    size_t                   len = 0;
    uint8_t                 *buf = t->rbuf[t->last ^ 1];
    int                      rc  = dsv4_kv_disk_get_exact(t->disk, key, &meta, buf, t->payload, &len, &err);
    if (rc != DSV4_OK || len != t->payload) return false; /* another length: removed as a bad file */
    if (memcmp(buf, tokens, t->tok_bytes) != 0) {
        pthread_mutex_lock(&t->mu);
        t->token_mismatch++;
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    t->last ^= 1;
    return true;
}

void dsv4_kv_tier_install(struct dsv4_kv_tier *t, void *page, void *snap)
{
    const uint8_t *buf = t->rbuf[t->last];
    if (page) to_kv(&t->mem, page, buf + t->tok_bytes, t->page_bytes);
    if (snap) to_kv(&t->mem, snap, buf + t->tok_bytes + t->page_bytes, t->snap_bytes);
    if (t->mem.kind && t->mem.kind->sync) t->mem.kind->sync(t->mem.impl); /* rbuf is reused */
}

void *dsv4_kv_tier_scratch_snap(struct dsv4_kv_tier *t)
{
    return t->scratch;
}

void dsv4_kv_tier_counters(struct dsv4_kv_tier *t, struct dsv4_kv_tier_counters *c)
{
    memset(c, 0, sizeof(*c));
    dsv4_kv_disk_counters(t->disk, &c->disk);
    pthread_mutex_lock(&t->mu);
    c->writes_dropped = t->dropped;
    c->token_mismatch = t->token_mismatch;
    c->queue_depth    = t->q_len + t->busy;
    pthread_mutex_unlock(&t->mu);
}
