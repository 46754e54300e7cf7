/*
 * kv_disk.c - the kv-disk store (see kv_disk.h): the in-memory index of the records in the
 * directory, LRU eviction against the budget, open (lock, scan, clean-up), put and get.
 *
 * The index is a table of entries (key, file bytes, LRU links) with chained hash buckets,
 * grown by doubling; it lives under d->mu, and no pointer into it is kept across an unlock.
 * Each entry keeps its header's parent key and a count of the entries naming it as parent
 * (kept at insert and drop, recounted at open), so eviction takes leaves first (victim).
 * An entry is either ready (its file is complete and in place; on the LRU list, oldest at
 * the head) or being written (not on the list: never evicted, and a get of it misses). The
 * writing state is what lets file contents, fsync and rename run outside the lock: while a
 * key is being written no other put writes it and no eviction removes it, so its file name
 * belongs to the one writer.
 *
 * Bytes in flight count against the budget from the moment a put reserves them, so puts on
 * several threads together never overshoot it.
 *
 * Durability: a record is durable once put returns DSV4_OK (file and directory fsynced).
 * Evictions and removals are not fsynced: after a crash a removed file may come back, which
 * is harmless (it is a valid record or it is checked again), and the next open evicts down
 * to the budget again.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv_disk_file.h"

struct ent {
    struct dsv4_kv_disk_key key;
    uint64_t                bytes;      /* file size (reserved while writing) */
    int64_t                 mtime_ns;   /* at open only: the order of the LRU list */
    uint64_t                parent_chain; /* the header's: (parent_chain, depth - 1) is the parent */
    int32_t                 n_child;    /* entries in the index naming this one as parent */
    int32_t                 hnext;      /* next in the bucket; next free entry when unused */
    int32_t                 prev, next; /* LRU list of ready entries, oldest first */
    bool                    used, writing;
};

struct dsv4_kv_disk {
    char               *dir;
    int                 dir_fd, lock_fd;
    uint8_t             identity[DSV4_KV_DISK_ID_BYTES];
    uint64_t            budget;
    struct dsv4_logger  log;
    pthread_mutex_t     mu;
    /* all below: under mu */
    struct ent         *ent;       /* [n_ent] */
    int32_t             n_ent;
    int32_t             ent_free;  /* first unused entry, -1 */
    int32_t            *bucket;    /* [n_bucket] first entry of each chain, -1 */
    uint32_t            n_bucket;  /* power of two, 2 * n_ent */
    int32_t             lru_head, lru_tail;
    uint64_t            tmp_seq;   /* temp file names */
    int64_t             fault_after;
    int                 fault_errno;
    struct dsv4_kv_disk_counters cnt;
};

void dsv4_kv_disk_identity(const void *bytes, size_t n, uint8_t out[DSV4_KV_DISK_ID_BYTES])
{
    dsv4_sha256(bytes, n, out);
}

/* ------------------------------------------------------------------ index (under mu) */

static uint32_t bucket_of(const struct dsv4_kv_disk *d, struct dsv4_kv_disk_key k)
{
    uint64_t h = k.chain ^ ((uint64_t)k.depth * 0x9e3779b97f4a7c15ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return (uint32_t)h & (d->n_bucket - 1);
}

static int32_t find(const struct dsv4_kv_disk *d, struct dsv4_kv_disk_key k)
{
    for (int32_t i = d->bucket[bucket_of(d, k)]; i >= 0; i = d->ent[i].hnext)
        if (d->ent[i].key.chain == k.chain && d->ent[i].key.depth == k.depth) return i;
    return -1;
}

/* Doubles the entry table and rebuilds the buckets; false on out of memory. */
static bool grow(struct dsv4_kv_disk *d)
{
    int32_t  n  = d->n_ent ? 2 * d->n_ent : 64;
    uint32_t nb = 2 * (uint32_t)n;
    if (n <= d->n_ent) return false;
    struct ent *e = realloc(d->ent, sizeof(*e) * (size_t)n);
    if (!e) return false;
    d->ent     = e;
    int32_t *b = realloc(d->bucket, sizeof(*b) * nb);
    if (!b) return false;
    d->bucket   = b;
    d->n_bucket = nb;
    for (uint32_t i = 0; i < nb; i++) b[i] = -1;
    for (int32_t i = d->n_ent; i < n; i++) e[i] = (struct ent){ .hnext = i + 1 < n ? i + 1 : d->ent_free };
    d->ent_free = d->n_ent;
    for (int32_t i = 0; i < d->n_ent; i++) {
        if (!e[i].used) continue;
        uint32_t bi = bucket_of(d, e[i].key);
        e[i].hnext  = b[bi];
        b[bi]       = i;
    }
    d->n_ent = n;
    return true;
}

static void lru_unlink(struct dsv4_kv_disk *d, int32_t i)
{
    struct ent *e = &d->ent[i];
    if (e->prev >= 0) d->ent[e->prev].next = e->next;
    else d->lru_head = e->next;
    if (e->next >= 0) d->ent[e->next].prev = e->prev;
    else d->lru_tail = e->prev;
    e->prev = e->next = -1;
}

static void lru_push(struct dsv4_kv_disk *d, int32_t i) /* as the most recent */
{
    d->ent[i].prev = d->lru_tail;
    d->ent[i].next = -1;
    if (d->lru_tail >= 0) d->ent[d->lru_tail].next = i;
    else d->lru_head = i;
    d->lru_tail = i;
}

static void touch(struct dsv4_kv_disk *d, int32_t i) /* now the most recently used */
{
    lru_unlink(d, i);
    lru_push(d, i);
}

/* The entry of i's parent record, -1 when i is a root or its parent is not stored. */
static int32_t parent_of(const struct dsv4_kv_disk *d, int32_t i)
{
    const struct ent *e = &d->ent[i];
    return e->key.depth ? find(d, (struct dsv4_kv_disk_key){ e->parent_chain, e->key.depth - 1 }) : -1;
}

/* Recounts every entry's children from the parent keys (open: files arrive in any order). */
static void count_children(struct dsv4_kv_disk *d)
{
    for (int32_t i = 0; i < d->n_ent; i++) d->ent[i].n_child = 0;
    for (int32_t i = 0; i < d->n_ent; i++) {
        int32_t p = d->ent[i].used ? parent_of(d, i) : -1;
        if (p >= 0) d->ent[p].n_child++;
    }
}

/* A new entry for key (not in the index); -1 on out of memory. */
static int32_t insert(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, uint64_t parent_chain, uint64_t bytes,
                      bool writing)
{
    if (d->ent_free < 0 && !grow(d)) return -1;
    int32_t  i  = d->ent_free;
    uint32_t bi = bucket_of(d, key);
    d->ent_free = d->ent[i].hnext;
    d->ent[i]   = (struct ent){ .key = key, .parent_chain = parent_chain, .bytes = bytes, .hnext = d->bucket[bi],
                                .prev = -1, .next = -1, .used = true, .writing = writing };
    d->bucket[bi] = i;
    int32_t p     = parent_of(d, i);
    if (p >= 0) d->ent[p].n_child++;
    if (!writing) lru_push(d, i);
    d->cnt.files++;
    d->cnt.bytes_used += bytes;
    return i;
}

static void drop(struct dsv4_kv_disk *d, int32_t i)
{
    int32_t *link = &d->bucket[bucket_of(d, d->ent[i].key)];
    while (*link != i) link = &d->ent[*link].hnext;
    *link = d->ent[i].hnext;
    if (!d->ent[i].writing) lru_unlink(d, i);
    int32_t p = parent_of(d, i);
    if (p >= 0 && d->ent[p].n_child > 0) d->ent[p].n_child--;
    d->cnt.files--;
    d->cnt.bytes_used -= d->ent[i].bytes;
    d->ent[i]   = (struct ent){ .hnext = d->ent_free };
    d->ent_free = i;
}

/* The next record to evict: the least recently used one that no stored record names as its
 * parent (a chain loses its deepest page, and stays servable up to there), else the least
 * recently used of all (every ready record has a child being written); -1 when none is
 * ready. The walk passes over the older parents only: a chain is touched root first, so
 * they are few ahead of the first leaf. */
static int32_t victim(const struct dsv4_kv_disk *d)
{
    for (int32_t i = d->lru_head; i >= 0; i = d->ent[i].next)
        if (d->ent[i].n_child == 0) return i;
    return d->lru_head;
}

/* Evicts records (victim) until need more bytes fit; false when they cannot. */
static bool evict_for(struct dsv4_kv_disk *d, uint64_t need)
{
    while (d->cnt.bytes_used + need > d->budget) {
        int32_t i = victim(d);
        if (i < 0) return false;
        char name[40];
        dsv4_kv_disk_name(d->ent[i].key, name, sizeof(name));
        if (unlinkat(d->dir_fd, name, 0) != 0 && errno != ENOENT)
            dsv4_log(&d->log, DSV4_LOG_WARN, "kv-disk %s: cannot remove %s: %s", d->dir, name, strerror(errno));
        drop(d, i);
        d->cnt.evictions++;
    }
    return true;
}

/* ------------------------------------------------------------------ open */

/* Checks one record file's header at open; false (with the reason) when it is invalid. */
static bool check_file(struct dsv4_kv_disk *d, const char *name, struct dsv4_kv_disk_key key, struct stat *st,
                       uint64_t *parent_chain, char *why, size_t cap)
{
    int fd = openat(d->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return snprintf(why, cap, "cannot open: %s", strerror(errno)), false;
    uint8_t           raw[DSV4_KV_DISK_HEADER];
    struct kvd_header h;
    bool              ok = fstat(fd, st) == 0;
    if (!ok) snprintf(why, cap, "cannot stat: %s", strerror(errno));
    ssize_t got = ok ? kvd_read_full(fd, raw, sizeof(raw)) : -1;
    if (ok && got < 0) ok = false, snprintf(why, cap, "cannot read: %s", strerror(errno));
    if (ok) ok = kvd_header_is_valid(raw, (size_t)got, (uint64_t)st->st_size, d->identity, key, &h, why, cap);
    if (ok) *parent_chain = h.meta.parent_chain;
    close(fd);
    return ok;
}

static void remove_invalid(struct dsv4_kv_disk *d, const char *name, const char *why)
{
    if (unlinkat(d->dir_fd, name, 0) != 0) { /* a directory by that name, say: left alone */
        dsv4_log(&d->log, DSV4_LOG_WARN, "kv-disk %s: cannot remove %s (%s): %s", d->dir, name, why, strerror(errno));
        return;
    }
    dsv4_log(&d->log, DSV4_LOG_WARN, "kv-disk %s: removed %s: %s", d->dir, name, why);
    d->cnt.corrupt_removed++;
}

/* One directory entry at open: a leftover temp file or an invalid record is removed; a valid
 * record enters the index (ready, in no order yet); any other file is not ours and stays. */
static int scan_one(struct dsv4_kv_disk *d, const char *name)
{
    struct dsv4_kv_disk_key key;
    struct stat             st;
    char                    why[256];
    uint64_t                parent_chain = 0;
    if (!strncmp(name, "tmp.", 4)) {
        dsv4_log(&d->log, DSV4_LOG_INFO, "kv-disk %s: removed %s (a write that did not finish)", d->dir, name);
        if (unlinkat(d->dir_fd, name, 0) == 0) d->cnt.tmp_removed++;
        return DSV4_OK;
    }
    if (!kvd_name_parse(name, &key)) return DSV4_OK;
    if (!check_file(d, name, key, &st, &parent_chain, why, sizeof(why))) {
        remove_invalid(d, name, why);
        return DSV4_OK;
    }
    if (find(d, key) >= 0) return DSV4_OK; /* cannot happen: one name per key */
    int32_t i = insert(d, key, parent_chain, (uint64_t)st.st_size, false);
    if (i < 0) return DSV4_ENOMEM;
    d->ent[i].mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    return DSV4_OK;
}

static int by_mtime(const void *a, const void *b, void *base)
{
    const struct ent *e = base, *x = &e[*(const int32_t *)a], *y = &e[*(const int32_t *)b];
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    if (x->key.chain != y->key.chain) return x->key.chain < y->key.chain ? -1 : 1;
    return (x->key.depth > y->key.depth) - (x->key.depth < y->key.depth);
}

/* Rebuilds the LRU list in mtime order (a hit sets the file's mtime, so the order of the
 * last run carries over). Runs in open, before any other thread can see the store. */
static int order_by_mtime(struct dsv4_kv_disk *d)
{
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(d->cnt.files ? d->cnt.files : 1));
    if (!idx) return DSV4_ENOMEM;
    int32_t n = 0;
    for (int32_t i = 0; i < d->n_ent; i++)
        if (d->ent[i].used) idx[n++] = i;
    qsort_r(idx, (size_t)n, sizeof(int32_t), by_mtime, d->ent);
    d->lru_head = d->lru_tail = -1;
    for (int32_t k = 0; k < n; k++) lru_push(d, idx[k]);
    free(idx);
    return DSV4_OK;
}

static int scan(struct dsv4_kv_disk *d, struct dsv4_err *err)
{
    int dfd = dup(d->dir_fd);
    DIR *dir = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!dir) {
        if (dfd >= 0) close(dfd);
        return dsv4_err_set(err, DSV4_EIO, "kv-disk directory %s: cannot list it: %s", d->dir, strerror(errno));
    }
    rewinddir(dir);
    int rc = DSV4_OK;
    for (struct dirent *de; rc == DSV4_OK && (de = readdir(dir));)
        rc = scan_one(d, de->d_name);
    closedir(dir);
    if (rc == DSV4_OK) rc = order_by_mtime(d);
    count_children(d);
    if (rc != DSV4_OK) return dsv4_err_set(err, rc, "kv-disk directory %s: out of memory for its index", d->dir);
    return DSV4_OK;
}

static int open_dir(struct dsv4_kv_disk *d, const char *dir, struct dsv4_err *err)
{
    if (kvd_mkdir_p(dir) != 0)
        return dsv4_err_set(err, DSV4_EIO, "cannot create kv-disk directory %s: %s", dir, strerror(errno));
    d->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d->dir_fd < 0) return dsv4_err_set(err, DSV4_EIO, "cannot open kv-disk directory %s: %s", dir, strerror(errno));
    return kvd_lock(d->dir_fd, dir, &d->lock_fd, err);
}

int dsv4_kv_disk_open(struct dsv4_kv_disk **out, const char *dir, uint64_t budget_bytes,
                      const uint8_t identity[DSV4_KV_DISK_ID_BYTES], const struct dsv4_logger *log,
                      struct dsv4_err *err)
{
    *out                  = NULL;
    struct dsv4_kv_disk *d = calloc(1, sizeof(*d));
    if (!d || !(d->dir = strdup(dir))) {
        free(d);
        return dsv4_err_set(err, DSV4_ENOMEM, "kv-disk directory %s: out of memory", dir);
    }
    d->dir_fd = d->lock_fd = -1;
    d->ent_free = d->lru_head = d->lru_tail = -1;
    d->budget      = budget_bytes;
    d->fault_after = -1;
    memcpy(d->identity, identity, DSV4_KV_DISK_ID_BYTES);
    if (log) d->log = *log;
    pthread_mutex_init(&d->mu, NULL);
    int rc = open_dir(d, dir, err);
    if (rc == DSV4_OK) rc = grow(d) ? scan(d, err) : dsv4_err_set(err, DSV4_ENOMEM, "kv-disk: out of memory");
    if (rc != DSV4_OK) {
        dsv4_kv_disk_close(d);
        return rc;
    }
    evict_for(d, 0);
    dsv4_log(&d->log, DSV4_LOG_INFO,
             "kv-disk %s: %llu records, %llu bytes (budget %llu); removed %llu invalid and %llu temp files, evicted %llu",
             d->dir, (unsigned long long)d->cnt.files, (unsigned long long)d->cnt.bytes_used,
             (unsigned long long)d->budget, (unsigned long long)d->cnt.corrupt_removed,
             (unsigned long long)d->cnt.tmp_removed, (unsigned long long)d->cnt.evictions);
    *out = d;
    return DSV4_OK;
}

void dsv4_kv_disk_close(struct dsv4_kv_disk *d)
{
    if (!d) return;
    if (d->lock_fd >= 0) close(d->lock_fd); /* releases the flock */
    if (d->dir_fd >= 0) close(d->dir_fd);
    pthread_mutex_destroy(&d->mu);
    free(d->ent);
    free(d->bucket);
    free(d->dir);
    free(d);
}

/* ------------------------------------------------------------------ put */

/* What put took from the store under the lock. */
struct put_job {
    bool     fresh;       /* the key was reserved: write it */
    uint64_t seq;         /* temp file number */
    int64_t  fault_after; /* test fault, or -1 */
    int      fault_errno;
};

/* A record larger than the whole budget: every put of this size will be refused, which is a
 * configuration to fix (a budget below one page), so it is logged once per process. */
static int too_big(struct dsv4_kv_disk *d, uint64_t bytes, struct dsv4_err *err)
{
    static atomic_bool logged;
    if (!atomic_exchange(&logged, true))
        dsv4_log(&d->log, DSV4_LOG_WARN,
                 "kv-disk %s: a record of %llu bytes is larger than the whole budget of %llu bytes: nothing of this "
                 "size is stored (logged once)",
                 d->dir, (unsigned long long)bytes, (unsigned long long)d->budget);
    return dsv4_err_set(err, DSV4_ERANGE, "kv-disk %s: a record of %llu bytes exceeds the whole budget of %llu bytes",
                        d->dir, (unsigned long long)bytes, (unsigned long long)d->budget);
}

/* Under mu: a stored key becomes most recent (nothing to write); otherwise room is made and
 * the key reserved as being written. */
static int reserve(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, uint64_t parent_chain, uint64_t bytes,
                   struct put_job *job, struct dsv4_err *err)
{
    int32_t i = find(d, key);
    if (i >= 0) {
        if (!d->ent[i].writing) touch(d, i);
        return DSV4_OK;
    }
    if (d->cnt.writes_disabled)
        return dsv4_err_set(err, DSV4_EIO, "kv-disk %s: writes are off for this process since: %s", d->dir,
                            d->cnt.disabled_why);
    if (bytes > d->budget) {
        d->cnt.refused++;
        return too_big(d, bytes, err);
    }
    if (!evict_for(d, bytes)) {
        d->cnt.refused++;
        return dsv4_err_set(err, DSV4_EFULL, "kv-disk %s: no room for %llu bytes: the budget is taken by writes in flight",
                            d->dir, (unsigned long long)bytes);
    }
    if (insert(d, key, parent_chain, bytes, true) < 0) return dsv4_err_set(err, DSV4_ENOMEM, "kv-disk %s: out of memory", d->dir);
    *job = (struct put_job){ .fresh = true, .seq = d->tmp_seq++, .fault_after = d->fault_after,
                             .fault_errno = d->fault_errno };
    return DSV4_OK;
}

/* Creates tmp, writes header and payload, fsyncs and closes it; -1 with errno and the step
 * that failed. */
static int write_tmp(int dir_fd, const char *tmp, const uint8_t *hdr, const void *payload, size_t len,
                     const struct put_job *job, const char **step)
{
    int fd = openat(dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return *step = "create", -1;
    int64_t rest = job->fault_after < 0 ? -1 : job->fault_after > DSV4_KV_DISK_HEADER ? job->fault_after - DSV4_KV_DISK_HEADER : 0;
    int     rc   = 0;
    if (kvd_write_all(fd, hdr, DSV4_KV_DISK_HEADER, job->fault_after, job->fault_errno) != 0 ||
        kvd_write_all(fd, payload, len, rest, job->fault_errno) != 0)
        *step = "write", rc = -1;
    else if (fsync(fd) != 0)
        *step = "fsync", rc = -1;
    int e = errno;
    if (close(fd) != 0 && rc == 0) return *step = "close", -1;
    errno = e;
    return rc;
}

/* The crash-safe protocol, outside the lock: temp file, fsync, rename, fsync of the
 * directory. On failure nothing of the record is left and why says what failed. */
static bool write_record(struct dsv4_kv_disk *d, const char *name, const uint8_t *hdr, const void *payload, size_t len,
                         const struct put_job *job, char *why, size_t cap)
{
    char        tmp[64];
    const char *step = "";
    snprintf(tmp, sizeof(tmp), "tmp.%ld.%llu", (long)getpid(), (unsigned long long)job->seq);
    if (write_tmp(d->dir_fd, tmp, hdr, payload, len, job, &step) != 0) {
        snprintf(why, cap, "%s %s/%s: %s", step, d->dir, tmp, strerror(errno));
        unlinkat(d->dir_fd, tmp, 0);
        return false;
    }
    if (renameat(d->dir_fd, tmp, d->dir_fd, name) != 0) {
        snprintf(why, cap, "rename %s/%s to %s: %s", d->dir, tmp, name, strerror(errno));
        unlinkat(d->dir_fd, tmp, 0);
        return false;
    }
    if (fsync(d->dir_fd) != 0) {
        snprintf(why, cap, "fsync of directory %s: %s", d->dir, strerror(errno));
        unlinkat(d->dir_fd, name, 0);
        return false;
    }
    return true;
}

/* Under mu: the reserved key becomes a ready record, or is dropped and writes are turned off. */
static void finish_put(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, bool ok, const char *why)
{
    int32_t i = find(d, key);
    DSV4_ASSERT(i >= 0 && d->ent[i].writing);
    if (ok) {
        d->ent[i].writing = false;
        lru_push(d, i);
        d->cnt.puts++;
        d->cnt.bytes_written += d->ent[i].bytes;
        return;
    }
    drop(d, i);
    d->cnt.write_errors++;
    if (!d->cnt.writes_disabled) {
        d->cnt.writes_disabled = true;
        snprintf(d->cnt.disabled_why, sizeof(d->cnt.disabled_why), "%s", why);
    }
}

int dsv4_kv_disk_put(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, const struct dsv4_kv_disk_meta *meta,
                     const void *payload, size_t len, struct dsv4_err *err)
{
    uint64_t       bytes = DSV4_KV_DISK_HEADER + (uint64_t)len;
    struct put_job job   = { 0 };
    pthread_mutex_lock(&d->mu);
    int rc = reserve(d, key, meta->parent_chain, bytes, &job, err);
    pthread_mutex_unlock(&d->mu);
    if (rc != DSV4_OK || !job.fresh) return rc;

    struct kvd_header h = { .key = key, .meta = *meta, .payload_len = len, .payload_crc = dsv4_crc32c(0, payload, len) };
    uint8_t           hdr[DSV4_KV_DISK_HEADER];
    char              name[40], why[512];
    memcpy(h.identity, d->identity, DSV4_KV_DISK_ID_BYTES);
    kvd_header_encode(&h, hdr);
    dsv4_kv_disk_name(key, name, sizeof(name));
    bool ok = write_record(d, name, hdr, payload, len, &job, why, sizeof(why));

    pthread_mutex_lock(&d->mu);
    finish_put(d, key, ok, why);
    pthread_mutex_unlock(&d->mu);
    if (ok) return DSV4_OK;
    dsv4_log(&d->log, DSV4_LOG_ERROR, "kv-disk %s: writes turned off for this process: %s", d->dir, why);
    return dsv4_err_set(err, DSV4_EIO, "kv-disk %s: %s (writes are now off)", d->dir, why);
}

/* ------------------------------------------------------------------ get */

/* Reads and verifies the record file at fd into buf; false with the reason. *nread: bytes
 * read. DSV4_ERANGE in *rc when the payload does not fit cap. */
static bool read_record(struct dsv4_kv_disk *d, int fd, struct dsv4_kv_disk_key key, struct kvd_header *h, void *buf,
                        size_t cap, bool exact, uint64_t *nread, int *rc, char *why, size_t wcap)
{
    struct stat st;
    uint8_t     raw[DSV4_KV_DISK_HEADER];
    if (fstat(fd, &st) != 0) return snprintf(why, wcap, "cannot stat: %s", strerror(errno)), false;
    ssize_t got = kvd_read_full(fd, raw, sizeof(raw));
    if (got < 0) return snprintf(why, wcap, "cannot read: %s", strerror(errno)), false;
    *nread = (uint64_t)got;
    if (!kvd_header_is_valid(raw, (size_t)got, (uint64_t)st.st_size, d->identity, key, h, why, wcap)) return false;
    if (exact && h->payload_len != cap)
        return snprintf(why, wcap, "a payload of %llu bytes where %zu are expected", (unsigned long long)h->payload_len,
                        cap), false;
    if (h->payload_len > cap) return *rc = DSV4_ERANGE, false;
    got = kvd_read_full(fd, buf, h->payload_len);
    if (got < 0) return snprintf(why, wcap, "cannot read: %s", strerror(errno)), false;
    *nread += (uint64_t)got;
    if ((uint64_t)got != h->payload_len) return snprintf(why, wcap, "truncated while being read"), false;
    if (dsv4_crc32c(0, buf, h->payload_len) != h->payload_crc)
        return snprintf(why, wcap, "payload checksum mismatch"), false;
    return true;
}

/* Under mu, after a get that found no valid record behind an index entry: removes the file
 * (when it is still the one that was read: same inode; fd < 0: whatever is there) and the
 * entry. True when a file was removed. */
static bool remove_bad(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, const char *name, int fd)
{
    int32_t i = find(d, key);
    if (i < 0 || d->ent[i].writing) return false; /* already gone, or a new record being written */
    struct stat cur, mine;
    if (fstatat(d->dir_fd, name, &cur, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) drop(d, i); /* removed behind the store's back */
        return false;
    }
    if (fd >= 0 && (fstat(fd, &mine) != 0 || mine.st_ino != cur.st_ino || mine.st_dev != cur.st_dev)) return false;
    unlinkat(d->dir_fd, name, 0);
    drop(d, i);
    d->cnt.corrupt_removed++;
    return true;
}

static int get(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, struct dsv4_kv_disk_meta *meta, void *buf,
               size_t cap, bool exact, size_t *len, struct dsv4_err *err)
{
    char name[40], why[256] = "";
    *len = 0;
    dsv4_kv_disk_name(key, name, sizeof(name));
    pthread_mutex_lock(&d->mu);
    int32_t i    = find(d, key);
    bool    have = i >= 0 && !d->ent[i].writing;
    if (have) touch(d, i);
    else d->cnt.misses++;
    pthread_mutex_unlock(&d->mu);
    if (!have) return DSV4_KV_DISK_MISS;

    struct kvd_header h;
    uint64_t          nread = 0;
    int               rc    = DSV4_OK;
    int               fd    = openat(d->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    /* a file that cannot be opened for want of descriptors or memory is not a bad file: it
     * stays (a miss this time); gone (ENOENT) or not a plain file (ELOOP) it is dropped */
    bool transient = fd < 0 && errno != ENOENT && errno != ELOOP;
    bool ok = fd >= 0 ? read_record(d, fd, key, &h, buf, cap, exact, &nread, &rc, why, sizeof(why))
                      : (snprintf(why, sizeof(why), "cannot open: %s", strerror(errno)), false);
    if (rc != DSV4_OK) {
        close(fd);
        return dsv4_err_set(err, rc, "kv-disk %s: %s holds %llu payload bytes, more than the %zu given", d->dir, name,
                            (unsigned long long)h.payload_len, cap);
    }
    if (ok) futimens(fd, NULL); /* the LRU order of the next run (order_by_mtime) */
    pthread_mutex_lock(&d->mu);
    bool removed = !ok && !transient && remove_bad(d, key, name, fd);
    d->cnt.bytes_read += nread;
    if (ok) d->cnt.hits++;
    else d->cnt.misses++;
    pthread_mutex_unlock(&d->mu);
    if (fd >= 0) close(fd);
    if (removed) dsv4_log(&d->log, DSV4_LOG_WARN, "kv-disk %s: removed %s: %s", d->dir, name, why);
    if (!ok) return DSV4_KV_DISK_MISS;
    *meta = h.meta;
    *len  = (size_t)h.payload_len;
    return DSV4_OK;
}

int dsv4_kv_disk_get(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, struct dsv4_kv_disk_meta *meta,
                     void *buf, size_t cap, size_t *len, struct dsv4_err *err)
{
    return get(d, key, meta, buf, cap, false, len, err);
}

int dsv4_kv_disk_get_exact(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, struct dsv4_kv_disk_meta *meta,
                           void *buf, size_t len, size_t *got, struct dsv4_err *err)
{
    return get(d, key, meta, buf, len, true, got, err);
}

void dsv4_kv_disk_counters(struct dsv4_kv_disk *d, struct dsv4_kv_disk_counters *c)
{
    pthread_mutex_lock(&d->mu);
    *c = d->cnt;
    pthread_mutex_unlock(&d->mu);
}

void dsv4_kv_disk_set_fault(struct dsv4_kv_disk *d, int64_t after_bytes, int err_no)
{
    pthread_mutex_lock(&d->mu);
    d->fault_after = after_bytes;
    d->fault_errno = err_no;
    pthread_mutex_unlock(&d->mu);
}
