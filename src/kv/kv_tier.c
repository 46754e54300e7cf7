/*
 * kv_tier.c - the disk tier under the prefix cache (see kv_tier.h): payload layout,
 * write-behind through a bounded set of host buffers and one writer thread, checked reads
 * prefetched by one reader thread (or, for a record not prefetched, on the caller's).
 *
 * The buffers cycle between two lists under mu: free (a stack) and queued (FIFO, filled by
 * the stepping thread, emptied by the writer). A buffer taken from the free list belongs to
 * the stepping thread until it is queued, and a queued one to the writer until it is put
 * back, so the downloads and the file writes run outside the lock. The prefetch buffers
 * change hands the same way through pf: the stepping thread's while PF_IDLE or PF_DONE, the
 * reader's while PF_QUEUED or PF_READING.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv_tier.h"

static atomic_bool test_hold; /* dsv4_kv_tier_test_hold */

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
    const uint8_t       *last;       /* the payload of the last successful load (rbuf or pbuf) */
    uint8_t             *scratch;    /* [snap_bytes] in KV memory: a snapshot outside the cache */
    uint64_t             token_mismatch;
    uint64_t             loads;      /* records read whole (under mu, as the next) */
    double               load_s;     /* their reads' wall time */
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
    /* the prefetch (one chain at a time): keys, ids and buffers belong to the reader while
     * pf is PF_QUEUED or PF_READING, to the stepping thread otherwise */
    pthread_t                reader;
    bool                     reader_started;
    pthread_cond_t           pf_cv;   /* pf changed */
    enum { PF_IDLE, PF_QUEUED, PF_READING, PF_DONE } pf;
    bool                     pf_discard;
    int                      n_pf;    /* buffers: the longest chain */
    int                      pf_n, pf_good;
    struct dsv4_kv_disk_key *pkey;    /* [n_pf] */
    int32_t                 *ptok;    /* [n_pf, page_tokens] */
    uint8_t                **pbuf;    /* [n_pf][payload] */
    uint64_t                 prefetched;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads key into buf: true when it exists, is whole and holds exactly these token ids. A
 * record read whole is timed (load_s), whether or not its ids match; a missing file is not
 * (its open fails at once). */
static bool read_record(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const int32_t *tokens, uint8_t *buf)
{
    struct dsv4_kv_disk_meta meta;
    struct dsv4_err          err;
    size_t                   len = 0;
    double                   t0  = now_s();
    int                      rc  = dsv4_kv_disk_get_exact(t->disk, key, &meta, buf, t->payload, &len, &err);
    if (rc != DSV4_OK || len != t->payload) return false; /* another length: removed as a bad file */
    double dt       = now_s() - t0;
    bool   mismatch = memcmp(buf, tokens, t->tok_bytes) != 0;
    pthread_mutex_lock(&t->mu);
    t->loads++;
    t->load_s += dt;
    if (mismatch) t->token_mismatch++;
    pthread_mutex_unlock(&t->mu);
    return !mismatch;
}

/* The reader: a queued chain's records in order, up to the first that is not to be had
 * (the chain ends there), then PF_DONE (or PF_IDLE when dropped meanwhile). */
static void *reader_main(void *arg)
{
    struct dsv4_kv_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->pf != PF_QUEUED && !t->stop) pthread_cond_wait(&t->pf_cv, &t->mu);
        if (t->stop) break;
        t->pf  = PF_READING;
        int n  = t->pf_n, good = 0;
        pthread_mutex_unlock(&t->mu);
        while (good < n && read_record(t, t->pkey[good], t->ptok + (size_t)good * (size_t)t->page_tokens, t->pbuf[good]))
            good++;
        pthread_mutex_lock(&t->mu);
        while (atomic_load(&test_hold) && !t->stop) { /* the tests' hook (polled: it is global) */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&t->pf_cv, &t->mu, &ts);
        }
        t->pf_good = good;
        t->prefetched += (uint64_t)good;
        t->pf      = t->pf_discard ? PF_IDLE : PF_DONE;
        t->pf_discard = false;
        pthread_cond_broadcast(&t->pf_cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

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
    if (t->pbuf)
        for (int i = 0; i < t->n_pf; i++) free(t->pbuf[i]);
    free(t->pbuf);
    free(t->pkey);
    free(t->ptok);
    if (t->scratch) dsv4_kv_mem_free(&t->mem, t->scratch, t->snap_bytes);
    dsv4_kv_disk_close(t->disk);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_cond_destroy(&t->pf_cv);
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
    t->pkey       = calloc((size_t)t->n_pf, sizeof(*t->pkey));
    t->ptok       = calloc((size_t)t->n_pf * (size_t)t->page_tokens, sizeof(int32_t));
    t->pbuf       = calloc((size_t)t->n_pf, sizeof(*t->pbuf));
    if (!t->job || !t->free_stack || !t->queue || !t->rbuf[0] || !t->rbuf[1] || !t->scratch || !t->pkey ||
        !t->ptok || !t->pbuf)
        return false;
    for (int i = 0; i < t->n_pf; i++)
        if (!(t->pbuf[i] = malloc(t->payload))) return false;
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
    pthread_cond_init(&t->pf_cv, NULL);
    if (mem) t->mem = *mem;
    t->page_tokens = p->page_tokens;
    t->tok_bytes   = sizeof(int32_t) * (size_t)p->page_tokens;
    t->page_bytes  = p->page_bytes;
    t->snap_bytes  = p->snap_bytes;
    t->payload     = t->tok_bytes + t->page_bytes + t->snap_bytes;
    t->n_buf       = p->n_buf > 0 ? p->n_buf : 8;
    t->n_pf        = p->n_prefetch > 0 ? p->n_prefetch : 1;
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
    if (pthread_create(&t->reader, NULL, reader_main, t) != 0) {
        dsv4_kv_tier_close(t);
        return dsv4_err_set(err, DSV4_EIO, "cannot start the disk-tier reader thread");
    }
    t->reader_started = true;
    *out              = t;
    return DSV4_OK;
}

void dsv4_kv_tier_close(struct dsv4_kv_tier *t)
{
    if (!t) return;
    if (t->started) {
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_signal(&t->cv);
        pthread_cond_broadcast(&t->pf_cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
        if (t->reader_started) pthread_join(t->reader, NULL);
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

/* The prefetched record of key with these ids, or NULL (stepping thread: PF_DONE's buffers
 * are its own). */
static const uint8_t *prefetched(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const int32_t *tokens)
{
    pthread_mutex_lock(&t->mu);
    bool done = t->pf == PF_DONE;
    pthread_mutex_unlock(&t->mu);
    if (!done) return NULL;
    for (int i = 0; i < t->pf_good; i++)
        if (t->pkey[i].chain == key.chain && t->pkey[i].depth == key.depth && !memcmp(t->pbuf[i], tokens, t->tok_bytes))
            return t->pbuf[i];
    return NULL;
}

bool dsv4_kv_tier_load(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const int32_t *tokens)
{
    const uint8_t *pre = prefetched(t, key, tokens);
    if (pre) {
        t->last = pre;
        return true;
    }
    uint8_t *buf = t->last == t->rbuf[0] ? t->rbuf[1] : t->rbuf[0];
    if (!read_record(t, key, tokens, buf)) return false;
    t->last = buf;
    return true;
}

bool dsv4_kv_tier_prefetch(struct dsv4_kv_tier *t, const struct dsv4_kv_disk_key *keys, const int32_t *tokens, int n)
{
    pthread_mutex_lock(&t->mu);
    bool ok = t->pf == PF_IDLE && n > 0;
    if (ok) {
        if (n > t->n_pf) n = t->n_pf; /* the rest is read on the stepping thread */
        memcpy(t->pkey, keys, sizeof(*keys) * (size_t)n);
        memcpy(t->ptok, tokens, t->tok_bytes * (size_t)n);
        t->pf_n = n;
        t->pf   = PF_QUEUED;
        pthread_cond_broadcast(&t->pf_cv);
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

bool dsv4_kv_tier_prefetch_busy(struct dsv4_kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    bool busy = t->pf == PF_QUEUED || t->pf == PF_READING;
    pthread_mutex_unlock(&t->mu);
    return busy;
}

void dsv4_kv_tier_prefetch_wait(struct dsv4_kv_tier *t, double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double d   = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec  = (time_t)d;
    ts.tv_nsec = (long)((d - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&t->mu);
    while ((t->pf == PF_QUEUED || t->pf == PF_READING) &&
           pthread_cond_timedwait(&t->pf_cv, &t->mu, &ts) == 0) {
    }
    pthread_mutex_unlock(&t->mu);
}

void dsv4_kv_tier_prefetch_drop(struct dsv4_kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->pf == PF_DONE) t->pf = PF_IDLE;
    else if (t->pf != PF_IDLE) t->pf_discard = true;
    pthread_mutex_unlock(&t->mu);
    if (t->last != t->rbuf[0] && t->last != t->rbuf[1]) t->last = NULL; /* no longer ours */
}

void dsv4_kv_tier_test_hold(bool hold)
{
    atomic_store(&test_hold, hold);
}

void dsv4_kv_tier_install(struct dsv4_kv_tier *t, void *page, void *snap)
{
    const uint8_t *buf = t->last;
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
    c->prefetched     = t->prefetched;
    c->loads          = t->loads;
    c->load_s         = t->load_s;
    pthread_mutex_unlock(&t->mu);
}
