/*
 * test_kv_disk.c - the kv-disk store (src/kv/kv_disk.h) on its own: the checksums against
 * their published vectors, round trips with the header checked byte for byte against
 * docs/FORMAT.md, a restart, every kind of bad file (each removed, counted and logged, never
 * returned), a simulated full disk and I/O error (writes off, reads on), LRU eviction against
 * the budget (deepest page of a chain first, also after a restart; refused puts counted),
 * records of another payload length removed (get_exact), the directory lock between two stores, an unusable directory, four threads
 * putting and getting at once (every hit compared with what was put); and the prefix
 * cache's tier on it (kv_tier.h: write-behind, dropped writes, checked loads).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kv/kv_disk.h"
#include "kv/kv_tier.h"
#include "test_cases.h"

/* ------------------------------------------------------------------ helpers */

enum { HDR = DSV4_KV_DISK_HEADER };

/* Log lines, kept to check that each removal says why. */
struct logcap {
    pthread_mutex_t mu;
    int             n;
    char            all[8192];
};

static void log_cb(void *ud, enum dsv4_log_level level, const char *msg)
{
    struct logcap *lc = ud;
    pthread_mutex_lock(&lc->mu);
    if (level <= DSV4_LOG_WARN) lc->n++;
    size_t used = strlen(lc->all);
    snprintf(lc->all + used, sizeof(lc->all) - used, "%s\n", msg);
    pthread_mutex_unlock(&lc->mu);
}

static void logcap_init(struct logcap *lc, struct dsv4_logger *lg)
{
    memset(lc, 0, sizeof(*lc));
    pthread_mutex_init(&lc->mu, NULL);
    lg->fn = log_cb;
    lg->ud = lc;
}

static void ident(const char *model, uint8_t id[32])
{
    dsv4_kv_disk_identity(model, strlen(model), id);
}

static void dir_of(struct test_ctx *t, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/kvdisk/%s", t->tmpdir, name);
}

static struct dsv4_kv_disk_key key_of(uint64_t i)
{
    return (struct dsv4_kv_disk_key){ .chain = 0x1234567890abcdefull * (i + 1), .depth = (uint32_t)i };
}

/* The payload of key i: len bytes from a generator seeded by i. */
static void fill(uint8_t *p, size_t len, uint64_t i)
{
    unsigned long long s = i * 7919 + 1;
    for (size_t k = 0; k < len; k++) p[k] = (uint8_t)test_rand_u64(&s);
}

static int put_i(struct dsv4_kv_disk *d, uint64_t i, size_t len)
{
    uint8_t                 *p    = malloc(len ? len : 1);
    struct dsv4_kv_disk_meta meta = { .parent_chain = i * 3, .n_tok = 256 * (i + 1) };
    struct dsv4_err          err;
    fill(p, len, i);
    int rc = dsv4_kv_disk_put(d, key_of(i), &meta, p, len, &err);
    free(p);
    return rc;
}

/* Gets key i and compares payload and metadata with what put_i stored: DSV4_OK only when
 * they are equal, -100 when the store returned other bytes. */
static int get_i(struct dsv4_kv_disk *d, uint64_t i, size_t len)
{
    uint8_t                 *want = malloc(len + 1), *got = malloc(len + 1);
    struct dsv4_kv_disk_meta meta;
    size_t                   n = 0;
    struct dsv4_err          err;
    fill(want, len, i);
    int rc = dsv4_kv_disk_get(d, key_of(i), &meta, got, len, &n, &err);
    if (rc == DSV4_OK && (n != len || memcmp(want, got, len) || meta.parent_chain != i * 3 || meta.n_tok != 256 * (i + 1)))
        rc = -100;
    free(want);
    free(got);
    return rc;
}

static void path_of(const char *dir, uint64_t i, char *out, size_t cap)
{
    char name[40];
    dsv4_kv_disk_name(key_of(i), name, sizeof(name));
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) out[0] = '\0'; /* no such file */
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static bool key_exists(const char *dir, uint64_t i)
{
    char path[512];
    path_of(dir, i, path, sizeof(path));
    return exists(path);
}

/* Record files and temp files in dir, and the records' bytes. */
static void dir_stats(const char *dir, int *n_kvc, uint64_t *bytes, int *n_tmp)
{
    *n_kvc = *n_tmp = 0;
    *bytes          = 0;
    DIR *dp         = opendir(dir);
    if (!dp) return;
    for (struct dirent *de; (de = readdir(dp));) {
        size_t      l = strlen(de->d_name);
        char        path[600];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (!strncmp(de->d_name, "tmp.", 4)) (*n_tmp)++;
        if (l > 4 && !strcmp(de->d_name + l - 4, ".kvc") && stat(path, &st) == 0) (*n_kvc)++, *bytes += (uint64_t)st.st_size;
    }
    closedir(dp);
}

static struct dsv4_kv_disk *open_store(struct test_ctx *t, const char *dir, uint64_t budget, const char *model,
                                       struct dsv4_logger *lg)
{
    uint8_t              id[32];
    struct dsv4_kv_disk *d = NULL;
    struct dsv4_err      err;
    ident(model, id);
    int rc = dsv4_kv_disk_open(&d, dir, budget, id, lg, &err);
    CHECKF(rc == DSV4_OK && d, "open %s: %s", dir, err.msg);
    return rc == DSV4_OK ? d : NULL;
}

static struct dsv4_kv_disk_counters counters(struct dsv4_kv_disk *d)
{
    struct dsv4_kv_disk_counters c;
    dsv4_kv_disk_counters(d, &c);
    return c;
}

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ checksums */

static void hex32(const uint8_t d[32], char out[65])
{
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_checksums(struct test_ctx *t)
{
    /* FIPS 180-4 examples (NIST CSRC "SHA256.pdf", one and two blocks) and the empty string. */
    static const struct { const char *in, *out; } sha[] = {
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    };
    for (size_t k = 0; k < sizeof(sha) / sizeof(sha[0]); k++) {
        uint8_t d[32];
        char    h[65];
        dsv4_sha256(sha[k].in, strlen(sha[k].in), d);
        hex32(d, h);
        CHECKF(!strcmp(h, sha[k].out), "sha256(\"%s\") = %s, expected %s", sha[k].in, h, sha[k].out);
    }
    /* A million 'a' (FIPS 180-4 example 3): many blocks. */
    char *m = malloc(1000000);
    memset(m, 'a', 1000000);
    uint8_t d[32];
    char    h[65];
    dsv4_sha256(m, 1000000, d);
    hex32(d, h);
    CHECKF(!strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "sha256(a x 1e6) = %s", h);
    free(m);
    /* The 56-byte example above pads into a second block; the identity is SHA-256 itself. */
    uint8_t a[32], b[32];
    dsv4_kv_disk_identity("abc", 3, a);
    dsv4_sha256("abc", 3, b);
    CHECK(!memcmp(a, b, 32));

    /* CRC-32C: the check value of the catalogue ("123456789") and RFC 3720 B.4's vectors. */
    uint8_t z[32], f[32], inc[32];
    memset(z, 0, 32);
    memset(f, 0xff, 32);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    CHECKF(dsv4_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c(123456789) = %08x", dsv4_crc32c(0, "123456789", 9));
    CHECK(dsv4_crc32c(0, z, 32) == 0x8A9136AAu);
    CHECK(dsv4_crc32c(0, f, 32) == 0x62A8AB43u);
    CHECK(dsv4_crc32c(0, inc, 32) == 0x46DD794Eu);
    CHECK(dsv4_crc32c(dsv4_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u); /* continued */
}

/* ------------------------------------------------------------------ round trip, restart */

static void test_round_trip(struct test_ctx *t)
{
    char dir[512], path[600];
    dir_of(t, "round", dir, sizeof(dir));
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    size_t lens[3] = { 0, 1, 5000 };
    for (int i = 0; i < 3; i++) CHECKF(put_i(d, (uint64_t)i, lens[i]) == DSV4_OK, "put %d", i);
    for (int i = 0; i < 3; i++) CHECKF(get_i(d, (uint64_t)i, lens[i]) == DSV4_OK, "get %d", i);
    CHECK(get_i(d, 7, 10) == DSV4_KV_DISK_MISS);
    CHECK(put_i(d, 2, lens[2]) == DSV4_OK); /* stored already: not rewritten */
    struct dsv4_kv_disk_counters c = counters(d);
    CHECK(c.puts == 3 && c.hits == 3 && c.misses == 1 && c.files == 3);
    CHECK(c.bytes_written == 3 * HDR + 5001 && c.bytes_used == c.bytes_written && c.bytes_read == c.bytes_written);

    /* A payload longer than the buffer: DSV4_ERANGE, the record stays. */
    uint8_t                  small[100];
    struct dsv4_kv_disk_meta meta;
    size_t                   n;
    struct dsv4_err          err;
    CHECK(dsv4_kv_disk_get(d, key_of(2), &meta, small, sizeof(small), &n, &err) == DSV4_ERANGE);
    CHECK(get_i(d, 2, lens[2]) == DSV4_OK);

    /* The file byte for byte, as docs/FORMAT.md gives it. */
    char name[40];
    dsv4_kv_disk_name(key_of(2), name, sizeof(name));
    CHECKF(!strcmp(name, "369d0369b20369cd-00000002.kvc"), "name %s", name);
    path_of(dir, 2, path, sizeof(path));
    size_t   fsz = 0;
    uint8_t *raw = test_read_file(path, &fsz);
    CHECK(raw && fsz == HDR + 5000);
    if (raw && fsz == HDR + 5000) {
        uint8_t id[32], pay[5000];
        ident("model-a", id);
        fill(pay, 5000, 2);
        CHECK(!memcmp(raw, "DSV4KVC\0", 8) && le(raw + 8, 4) == 1 && le(raw + 12, 4) == HDR);
        CHECK(!memcmp(raw + 16, id, 32));
        CHECK(le(raw + 48, 8) == key_of(2).chain && le(raw + 56, 4) == 2 && le(raw + 60, 4) == 0);
        CHECK(le(raw + 64, 8) == 6 && le(raw + 72, 8) == 768 && le(raw + 80, 8) == 5000);
        CHECK(le(raw + 88, 4) == dsv4_crc32c(0, pay, 5000));
        CHECK(le(raw + 124, 4) == dsv4_crc32c(0, raw, 124));
        CHECK(!memcmp(raw + HDR, pay, 5000));
    }
    free(raw);
    dsv4_kv_disk_close(d);
}

static void test_restart(struct test_ctx *t)
{
    char dir[512];
    dir_of(t, "restart", dir, sizeof(dir));
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    for (int i = 0; i < 5; i++) CHECK(put_i(d, (uint64_t)i, 300 + 10 * (size_t)i) == DSV4_OK);
    dsv4_kv_disk_close(d);
    d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    struct dsv4_kv_disk_counters c = counters(d);
    CHECK(c.files == 5 && c.corrupt_removed == 0 && c.bytes_used == 5 * HDR + 5 * 300 + 100);
    for (int i = 0; i < 5; i++) CHECKF(get_i(d, (uint64_t)i, 300 + 10 * (size_t)i) == DSV4_OK, "get %d after restart", i);
    dsv4_kv_disk_close(d);
}

/* ------------------------------------------------------------------ bad files */

/* Rewrites len bytes at off of a file. */
static void patch(struct test_ctx *t, const char *path, long off, const void *p, size_t len)
{
    FILE *f = fopen(path, "r+b");
    CHECKF(f && fseek(f, off, SEEK_SET) == 0 && fwrite(p, 1, len, f) == len, "patch %s", path);
    if (f) fclose(f);
}

static void flip(struct test_ctx *t, const char *path, long off)
{
    size_t   n   = 0;
    uint8_t *raw = test_read_file(path, &n);
    CHECK(raw && (size_t)off < n);
    if (raw && (size_t)off < n) {
        uint8_t b = raw[off] ^ 0x10;
        patch(t, path, off, &b, 1);
    }
    free(raw);
}

/* A header of another format version with a valid header checksum: only the version is wrong. */
static void set_version(struct test_ctx *t, const char *path, uint32_t v)
{
    size_t   n   = 0;
    uint8_t *raw = test_read_file(path, &n);
    CHECK(raw && n >= HDR);
    if (!raw || n < HDR) return free(raw);
    for (int i = 0; i < 4; i++) raw[8 + i] = (uint8_t)(v >> (8 * i));
    uint32_t crc = dsv4_crc32c(0, raw, 124);
    for (int i = 0; i < 4; i++) raw[124 + i] = (uint8_t)(crc >> (8 * i));
    CHECK(test_write_file(path, raw, n) == 0);
    free(raw);
}

static void test_bad_files_at_open(struct test_ctx *t)
{
    char dir[512], p[8][600];
    dir_of(t, "bad-open", dir, sizeof(dir));
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    for (int i = 0; i < 8; i++) {
        CHECK(put_i(d, (uint64_t)i, 1000) == DSV4_OK);
        path_of(dir, (uint64_t)i, p[i], sizeof(p[i]));
    }
    dsv4_kv_disk_close(d);
    CHECK(truncate(p[0], 100) == 0);                 /* shorter than a header */
    CHECK(truncate(p[1], HDR + 999) == 0);           /* one payload byte missing */
    flip(t, p[2], 75);                                /* the token count: header checksum */
    set_version(t, p[3], 0);                          /* an old version */
    uint8_t junk[600];
    fill(junk, sizeof(junk), 99);
    CHECK(test_write_file(p[4], junk, sizeof(junk)) == 0); /* garbage under a record's name */
    CHECK(rename(p[5], p[7]) == 0);                   /* a record under another key's name */
    char tmp[600], other[600];
    snprintf(tmp, sizeof(tmp), "%s/tmp.999.0", dir);   /* a write a crash interrupted */
    snprintf(other, sizeof(other), "%s/notes.txt", dir);
    CHECK(test_write_file(tmp, junk, 300) == 0);
    CHECK(test_write_file(other, "mine", 4) == 0);

    struct logcap      lc;
    struct dsv4_logger lg;
    logcap_init(&lc, &lg);
    d = open_store(t, dir, 1 << 20, "model-a", &lg);
    if (!d) return;
    struct dsv4_kv_disk_counters c = counters(d);
    CHECKF(c.corrupt_removed == 6 && c.tmp_removed == 1 && c.files == 1, "removed %llu, tmp %llu, files %llu",
           (unsigned long long)c.corrupt_removed, (unsigned long long)c.tmp_removed, (unsigned long long)c.files);
    CHECKF(lc.n == 6, "%d warnings:\n%s", lc.n, lc.all);
    static const char *why[] = { "truncated", "the header says", "header checksum", "format version 0",
                                 "bad magic", "does not match its file name", "a write that did not finish" };
    for (size_t k = 0; k < sizeof(why) / sizeof(why[0]); k++) CHECKF(strstr(lc.all, why[k]), "no \"%s\" in:\n%s", why[k], lc.all);
    for (int i = 0; i < 8; i++) CHECKF(exists(p[i]) == (i == 6), "file %d", i);
    CHECK(!exists(tmp) && exists(other));
    CHECK(get_i(d, 6, 1000) == DSV4_OK);
    for (int i = 0; i < 6; i++) CHECK(get_i(d, (uint64_t)i, 1000) == DSV4_KV_DISK_MISS);
    dsv4_kv_disk_close(d);

    /* Another model's store: every record is foreign. */
    logcap_init(&lc, &lg);
    d = open_store(t, dir, 1 << 20, "model-b", &lg);
    if (!d) return;
    c = counters(d);
    CHECK(c.corrupt_removed == 1 && c.files == 0 && !exists(p[6]));
    CHECKF(strstr(lc.all, "another model"), "%s", lc.all);
    dsv4_kv_disk_close(d);
}

static void test_bad_files_at_get(struct test_ctx *t)
{
    char dir[512], p0[600], p1[600];
    dir_of(t, "bad-get", dir, sizeof(dir));
    struct logcap      lc;
    struct dsv4_logger lg;
    logcap_init(&lc, &lg);
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", &lg);
    if (!d) return;
    for (int i = 0; i < 3; i++) CHECK(put_i(d, (uint64_t)i, 2000) == DSV4_OK);
    path_of(dir, 0, p0, sizeof(p0));
    path_of(dir, 1, p1, sizeof(p1));
    flip(t, p0, HDR + 1234);           /* one payload bit: only the payload checksum sees it */
    CHECK(truncate(p1, HDR + 1000) == 0); /* cut short while the store runs */
    CHECK(get_i(d, 0, 2000) == DSV4_KV_DISK_MISS);
    CHECK(get_i(d, 1, 2000) == DSV4_KV_DISK_MISS);
    CHECK(get_i(d, 2, 2000) == DSV4_OK);
    struct dsv4_kv_disk_counters c = counters(d);
    CHECK(c.corrupt_removed == 2 && c.files == 1 && c.hits == 1 && c.misses == 2);
    CHECK(!exists(p0) && !exists(p1));
    CHECKF(strstr(lc.all, "payload checksum") && strstr(lc.all, "the header says"), "%s", lc.all);
    /* Gone from the index too: a second get is a plain miss, and the key can be written again. */
    CHECK(get_i(d, 0, 2000) == DSV4_KV_DISK_MISS && counters(d).corrupt_removed == 2);
    CHECK(put_i(d, 0, 2000) == DSV4_OK && get_i(d, 0, 2000) == DSV4_OK);
    /* A file removed behind the store's back is a miss, not an error. */
    CHECK(unlink(p0) == 0);
    CHECK(get_i(d, 0, 2000) == DSV4_KV_DISK_MISS && counters(d).files == 1);
    /* Out of descriptors (EMFILE, as on a busy server): a miss, and the record stays. */
    struct rlimit rl;
    int           lowest = dup(0);
    if (lowest >= 0 && getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        close(lowest);
        struct rlimit tight = { (rlim_t)lowest, rl.rlim_max };
        CHECK(setrlimit(RLIMIT_NOFILE, &tight) == 0);
        int rc = get_i(d, 2, 2000);
        CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
        CHECKF(rc == DSV4_KV_DISK_MISS, "get without a free descriptor: %d", rc);
        CHECK(key_exists(dir, 2) && counters(d).corrupt_removed == 2 && get_i(d, 2, 2000) == DSV4_OK);
    }
    dsv4_kv_disk_close(d);
}

/* ------------------------------------------------------------------ write errors */

static void check_write_fault(struct test_ctx *t, const char *name, int64_t after, int err_no, const char *what)
{
    char dir[512];
    dir_of(t, name, dir, sizeof(dir));
    struct logcap      lc;
    struct dsv4_logger lg;
    logcap_init(&lc, &lg);
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", &lg);
    if (!d) return;
    CHECK(put_i(d, 0, 1000) == DSV4_OK);
    dsv4_kv_disk_set_fault(d, after, err_no);
    CHECK(put_i(d, 1, 1000) == DSV4_EIO);
    dsv4_kv_disk_set_fault(d, -1, 0);
    CHECK(put_i(d, 2, 10) == DSV4_EIO); /* stays off for the process */
    struct dsv4_kv_disk_counters c = counters(d);
    CHECK(c.write_errors == 1 && c.writes_disabled && c.puts == 1 && c.files == 1 && c.bytes_used == HDR + 1000);
    CHECKF(strstr(c.disabled_why, what) && strstr(c.disabled_why, "write"), "why: %s", c.disabled_why);
    CHECKF(strstr(lc.all, "writes turned off"), "%s", lc.all);
    int      n_kvc, n_tmp;
    uint64_t bytes;
    dir_stats(dir, &n_kvc, &bytes, &n_tmp);
    CHECK(n_kvc == 1 && n_tmp == 0 && !key_exists(dir, 1) && !key_exists(dir, 2));
    CHECK(get_i(d, 0, 1000) == DSV4_OK); /* reads go on */
    CHECK(put_i(d, 0, 1000) == DSV4_OK); /* a stored key needs no write */
    dsv4_kv_disk_close(d);
    /* A new process writes again. */
    d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    CHECK(put_i(d, 1, 1000) == DSV4_OK && get_i(d, 1, 1000) == DSV4_OK);
    dsv4_kv_disk_close(d);
}

static void test_disk_full(struct test_ctx *t)
{
    check_write_fault(t, "full-payload", 600, ENOSPC, strerror(ENOSPC)); /* inside the payload */
    check_write_fault(t, "full-header", 50, ENOSPC, strerror(ENOSPC));   /* inside the header */
    check_write_fault(t, "eio", 0, EIO, strerror(EIO));
}

/* ------------------------------------------------------------------ budget */

static void set_mtime(struct test_ctx *t, const char *dir, uint64_t i, time_t sec)
{
    char            path[600];
    struct timespec ts[2] = { { sec, 0 }, { sec, 0 } };
    path_of(dir, i, path, sizeof(path));
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

static void test_budget_lru(struct test_ctx *t)
{
    char dir[512];
    dir_of(t, "budget", dir, sizeof(dir));
    const uint64_t       rec = HDR + 1000;
    struct dsv4_kv_disk *d   = open_store(t, dir, 3 * rec + 10, "model-a", NULL);
    if (!d) return;
    for (int i = 1; i <= 3; i++) CHECK(put_i(d, (uint64_t)i, 1000) == DSV4_OK);
    CHECK(get_i(d, 1, 1000) == DSV4_OK); /* 1 is now the most recent: order 2, 3, 1 */
    CHECK(put_i(d, 4, 1000) == DSV4_OK); /* evicts 2 */
    CHECK(!key_exists(dir, 2) && key_exists(dir, 1) && key_exists(dir, 3) && key_exists(dir, 4));
    CHECK(put_i(d, 3, 1000) == DSV4_OK); /* stored: now the most recent; order 1, 4, 3 */
    CHECK(put_i(d, 5, 1000) == DSV4_OK); /* evicts 1 */
    CHECK(!key_exists(dir, 1) && key_exists(dir, 3) && key_exists(dir, 4) && key_exists(dir, 5));
    struct dsv4_kv_disk_counters c = counters(d);
    CHECK(c.evictions == 2 && c.files == 3 && c.bytes_used == 3 * rec);
    CHECK(get_i(d, 2, 1000) == DSV4_KV_DISK_MISS);

    /* Larger than the whole budget: refused, nothing evicted for it. */
    CHECK(put_i(d, 6, 3 * 1000 + 2 * HDR + 11) == DSV4_ERANGE);
    c = counters(d);
    CHECK(c.evictions == 2 && c.files == 3 && !key_exists(dir, 6) && !c.writes_disabled && c.refused == 1);
    /* Exactly the budget fits: everything else goes. */
    CHECK(put_i(d, 7, 3 * 1000 + 2 * HDR + 10) == DSV4_OK);
    c = counters(d);
    CHECK(c.evictions == 5 && c.files == 1 && c.bytes_used == 3 * rec + 10);
    dsv4_kv_disk_close(d);

    /* A smaller budget at open keeps the most recently used (mtime) records. */
    dir_of(t, "budget-reopen", dir, sizeof(dir));
    d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    for (int i = 0; i < 4; i++) CHECK(put_i(d, (uint64_t)i, 1000) == DSV4_OK);
    dsv4_kv_disk_close(d);
    time_t order[4] = { 4000, 1000, 3000, 2000 }; /* most recent: 0, then 2 */
    for (int i = 0; i < 4; i++) set_mtime(t, dir, (uint64_t)i, order[i]);
    d = open_store(t, dir, 2 * rec, "model-a", NULL);
    if (!d) return;
    c = counters(d);
    CHECK(c.evictions == 2 && c.files == 2);
    CHECK(key_exists(dir, 0) && key_exists(dir, 2) && !key_exists(dir, 1) && !key_exists(dir, 3));
    /* A hit moves the file's mtime to now: it outlives the other at the next open. */
    CHECK(get_i(d, 2, 1000) == DSV4_OK);
    dsv4_kv_disk_close(d);
    d = open_store(t, dir, rec, "model-a", NULL);
    if (!d) return;
    CHECK(key_exists(dir, 2) && !key_exists(dir, 0) && counters(d).files == 1);
    dsv4_kv_disk_close(d);
}

/* ------------------------------------------------------------------ lock, directory */

static void test_lock(struct test_ctx *t)
{
    char dir[512], lockp[600];
    dir_of(t, "lock", dir, sizeof(dir));
    struct dsv4_kv_disk *a = open_store(t, dir, 1 << 20, "model-a", NULL), *b = NULL;
    if (!a) return;
    CHECK(put_i(a, 0, 100) == DSV4_OK);
    uint8_t         id[32];
    struct dsv4_err err;
    ident("model-a", id);
    int rc = dsv4_kv_disk_open(&b, dir, 1 << 20, id, NULL, &err);
    char pid[64];
    snprintf(pid, sizeof(pid), "pid %ld", (long)getpid());
    CHECKF(rc == DSV4_EIO && !b, "second open: %d", rc);
    CHECKF(strstr(err.msg, dir) && strstr(err.msg, pid) && strstr(err.msg, "in use"), "message: %s", err.msg);
    snprintf(lockp, sizeof(lockp), "%s/lock", dir);
    size_t n   = 0;
    char  *txt = test_read_file(lockp, &n);
    CHECK(txt && n > 0 && atol(txt) == (long)getpid());
    free(txt);
    CHECK(key_exists(dir, 0)); /* the refused open touched nothing */
    dsv4_kv_disk_close(a);
    b = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!b) return;
    CHECK(get_i(b, 0, 100) == DSV4_OK);
    dsv4_kv_disk_close(b);
}

static void test_unusable_dir(struct test_ctx *t)
{
    char file[512], dir[600];
    dir_of(t, "plain-file", file, sizeof(file));
    char parent[512];
    dir_of(t, "", parent, sizeof(parent));
    mkdir(parent, 0755);
    CHECK(test_write_file(file, "x", 1) == 0);
    snprintf(dir, sizeof(dir), "%s/cache", file);
    uint8_t              id[32];
    struct dsv4_err      err;
    struct dsv4_kv_disk *d = NULL;
    ident("model-a", id);
    int rc = dsv4_kv_disk_open(&d, dir, 1 << 20, id, NULL, &err);
    CHECKF(rc == DSV4_EIO && !d, "open under a file: %d", rc);
    CHECKF(strstr(err.msg, dir) && strstr(err.msg, strerror(ENOTDIR)), "message: %s", err.msg);
    /* Missing parents are created. */
    dir_of(t, "deep/er/store", dir, sizeof(dir));
    d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (d) CHECK(put_i(d, 0, 10) == DSV4_OK && key_exists(dir, 0));
    dsv4_kv_disk_close(d);
}

/* ------------------------------------------------------------------ a process killed mid-write */

/* The child: opens the store, says so on the pipe, then puts records until it is killed. */
_Noreturn static void crash_child(const char *dir, int wfd)
{
    uint8_t              id[32];
    struct dsv4_kv_disk *d = NULL;
    ident("model-a", id);
    if (dsv4_kv_disk_open(&d, dir, 1 << 20, id, NULL, NULL) != DSV4_OK) _exit(1);
    if (write(wfd, "o", 1) != 1) _exit(1);
    for (uint64_t i = 0;; i++) put_i(d, i % 400, 20000 + (size_t)(i % 7) * 1000); /* evictions too */
}

static void test_crash_restart(struct test_ctx *t)
{
    char dir[512];
    dir_of(t, "crash", dir, sizeof(dir));
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t pid = fork();
    if (pid == 0) crash_child(dir, pfd[1]);
    CHECK(pid > 0);
    if (pid <= 0) return;
    char c = 0;
    CHECK(read(pfd[0], &c, 1) == 1 && c == 'o');
    close(pfd[0]);
    close(pfd[1]);
    /* While it lives, the directory is its own: the error names its pid. */
    uint8_t              id[32];
    struct dsv4_err      err;
    struct dsv4_kv_disk *d = NULL;
    char                 who[64];
    ident("model-a", id);
    snprintf(who, sizeof(who), "pid %ld", (long)pid);
    CHECK(dsv4_kv_disk_open(&d, dir, 1 << 20, id, NULL, &err) == DSV4_EIO);
    CHECKF(strstr(err.msg, who), "message: %s (child %ld)", err.msg, (long)pid);
    usleep(TEST_SANITIZED ? 300000 : 100000);
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    /* The kernel dropped its lock; every record it finished is whole, and at most the one it
     * was writing is left as a temp file. */
    d = open_store(t, dir, 1 << 20, "model-a", NULL);
    if (!d) return;
    struct dsv4_kv_disk_counters cn = counters(d);
    CHECKF(cn.files > 0 && cn.corrupt_removed == 0 && cn.tmp_removed <= 1, "files %llu, removed %llu, tmp %llu",
           (unsigned long long)cn.files, (unsigned long long)cn.corrupt_removed, (unsigned long long)cn.tmp_removed);
    int ok = 0, bad = 0;
    for (uint64_t i = 0; i < 400; i++) {
        if (!key_exists(dir, i)) continue;
        size_t len = 0;
        char   path[1024];
        struct stat sb;
        path_of(dir, i, path, sizeof(path));
        if (stat(path, &sb) == 0) len = (size_t)sb.st_size - HDR;
        if (get_i(d, i, len) == DSV4_OK) ok++;
        else bad++;
    }
    CHECKF(ok == (int)cn.files && bad == 0, "%d records read back, %d bad, %llu indexed", ok, bad, (unsigned long long)cn.files);
    dsv4_kv_disk_close(d);
}

/* ------------------------------------------------------------------ threads */

enum { N_THREADS = 4, N_KEYS = 48 };

struct worker {
    struct dsv4_kv_disk *d;
    unsigned long long   seed;
    int                  rounds;
    int                  gets, bad, errors;
};

static size_t len_of(uint64_t i)
{
    return 200 + 53 * (size_t)i;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (int r = 0; r < w->rounds; r++) {
        uint64_t i = test_rand_u64(&w->seed) % N_KEYS;
        if (test_rand_u64(&w->seed) & 1) {
            int rc = put_i(w->d, i, len_of(i));
            if (rc != DSV4_OK && rc != DSV4_EFULL) w->errors++;
        } else {
            int rc = get_i(w->d, i, len_of(i));
            w->gets++;
            if (rc == -100) w->bad++;
            else if (rc != DSV4_OK && rc != DSV4_KV_DISK_MISS) w->errors++;
        }
    }
    return NULL;
}

static void test_threads(struct test_ctx *t)
{
    char dir[512];
    dir_of(t, "threads", dir, sizeof(dir));
    uint64_t total = 0;
    for (uint64_t i = 0; i < N_KEYS; i++) total += HDR + len_of(i);
    struct dsv4_kv_disk *d = open_store(t, dir, total / 3, "model-a", NULL); /* evictions all along */
    if (!d) return;
    struct worker w[N_THREADS];
    pthread_t     th[N_THREADS];
    for (int k = 0; k < N_THREADS; k++) {
        w[k] = (struct worker){ .d = d, .seed = 100 + (unsigned long long)k, .rounds = TEST_SANITIZED ? 150 : 400 };
        CHECK(pthread_create(&th[k], NULL, worker_main, &w[k]) == 0);
    }
    int gets = 0, bad = 0, errors = 0;
    for (int k = 0; k < N_THREADS; k++) {
        pthread_join(th[k], NULL);
        gets += w[k].gets, bad += w[k].bad, errors += w[k].errors;
    }
    struct dsv4_kv_disk_counters c = counters(d);
    CHECKF(bad == 0 && errors == 0, "%d wrong payloads, %d errors", bad, errors);
    CHECK(c.hits + c.misses == (uint64_t)gets && c.hits > 0 && c.evictions > 0);
    CHECK(c.corrupt_removed == 0 && c.write_errors == 0 && !c.writes_disabled);
    CHECK(c.bytes_used <= total / 3);
    int      n_kvc, n_tmp;
    uint64_t bytes;
    dir_stats(dir, &n_kvc, &bytes, &n_tmp);
    CHECKF((uint64_t)n_kvc == c.files && bytes == c.bytes_used && n_tmp == 0, "dir: %d files %llu bytes %d tmp; index %llu, %llu",
           n_kvc, (unsigned long long)bytes, n_tmp, (unsigned long long)c.files, (unsigned long long)c.bytes_used);
    dsv4_kv_disk_close(d);
}


/* ------------------------------------------------------------------ the prefix cache's tier */

/* kv_tier.h on host memory: a write read back into another page and snapshot is byte-equal;
 * a load with other token ids (a chain-hash collision) is a miss, counted; with one write
 * buffer, a burst of writes drops what finds the buffer taken, never blocks, and every
 * write is either on disk or counted as dropped. Reads of whole records are counted and
 * timed. */
static void test_tier(struct test_ctx *t)
{
    enum { PT = 16, PAGE = 1000, SNAP = 300, N = 1000 };
    char dir[512];
    dir_of(t, "tier", dir, sizeof(dir));
    uint8_t                    id[32], page[PAGE], snap[SNAP], page2[PAGE], snap2[SNAP];
    int32_t                    tok[PT], other[PT];
    struct dsv4_kv_tier_params tp = { .dir = dir, .budget = 1 << 30, .page_tokens = PT, .page_bytes = PAGE,
                                      .snap_bytes = SNAP, .n_buf = 1 };
    struct dsv4_kv_tier       *tr = NULL;
    struct dsv4_err            err;
    ident("tier", id);
    int rc = dsv4_kv_tier_open(&tr, &tp, id, NULL, NULL, &err);
    CHECKF(rc == DSV4_OK, "open: %s", err.msg);
    if (rc) return;
    fill(page, PAGE, 1);
    fill(snap, SNAP, 2);
    for (int i = 0; i < PT; i++) tok[i] = 1000 + i, other[i] = tok[i] + (i == 7);
    struct dsv4_kv_disk_meta meta = { 0, PT };
    dsv4_kv_tier_write(tr, key_of(0), &meta, tok, page, snap);
    dsv4_kv_tier_close(tr); /* finishes the write */
    CHECK(dsv4_kv_tier_open(&tr, &tp, id, NULL, NULL, &err) == DSV4_OK);
    if (!tr) return;
    CHECK(!dsv4_kv_tier_load(tr, key_of(0), other));
    CHECK(dsv4_kv_tier_load(tr, key_of(0), tok));
    dsv4_kv_tier_install(tr, page2, snap2);
    CHECK(!memcmp(page, page2, PAGE) && !memcmp(snap, snap2, SNAP));
    CHECK(!dsv4_kv_tier_load(tr, key_of(1), tok));
    struct dsv4_kv_tier_counters c;
    dsv4_kv_tier_counters(tr, &c);
    CHECKF(c.token_mismatch == 1 && c.disk.hits == 2 && c.disk.misses == 1, "mismatch %llu hits %llu misses %llu",
           (unsigned long long)c.token_mismatch, (unsigned long long)c.disk.hits, (unsigned long long)c.disk.misses);
    /* both reads of the record are timed loads (the mismatched one read it too); the miss is not */
    CHECKF(c.loads == 2 && c.load_s > 0, "%llu loads in %g s", (unsigned long long)c.loads, c.load_s);
    for (uint64_t i = 1; i <= N; i++) dsv4_kv_tier_write(tr, key_of(i), &meta, tok, page, snap);
    dsv4_kv_tier_counters(tr, &c); /* drops are final once the burst returns */
    uint64_t dropped = c.writes_dropped;
    dsv4_kv_tier_close(tr);
    CHECK(dsv4_kv_tier_open(&tr, &tp, id, NULL, NULL, &err) == DSV4_OK);
    if (!tr) return;
    dsv4_kv_tier_counters(tr, &c);
    CHECKF(dropped > 0 && c.disk.files == 1 + N - dropped, "one buffer, %d writes: %llu dropped, %llu files", N,
           (unsigned long long)dropped, (unsigned long long)c.disk.files);
    dsv4_kv_tier_close(tr);
}

/* ------------------------------------------------------------------ chains */

/* Page k of a chain as the tier writes it: the parent key is (page k - 1's chain, k - 1). */
static struct dsv4_kv_disk_key page_key(uint64_t chain_id, uint32_t k)
{
    return (struct dsv4_kv_disk_key){ .chain = 0xc4a1000000000000ull ^ (chain_id << 32) ^ (k * 0x9e37ull + 1), .depth = k };
}

static int put_page(struct dsv4_kv_disk *d, uint64_t chain_id, uint32_t k, size_t len)
{
    uint8_t                  p[256] = { (uint8_t)k };
    struct dsv4_kv_disk_meta meta   = { .parent_chain = k ? page_key(chain_id, k - 1).chain : 0, .n_tok = 64 * (k + 1) };
    struct dsv4_err          err;
    return dsv4_kv_disk_put(d, page_key(chain_id, k), &meta, p, len, &err);
}

/* Pages served from the root on, as a lookup walks them (and stops at the first miss). */
static uint32_t served(struct dsv4_kv_disk *d, uint64_t chain_id, uint32_t n)
{
    uint8_t                  buf[256];
    struct dsv4_kv_disk_meta meta;
    size_t                   len;
    struct dsv4_err          err;
    uint32_t                 k = 0;
    while (k < n && dsv4_kv_disk_get(d, page_key(chain_id, k), &meta, buf, sizeof(buf), &len, &err) == DSV4_OK) k++;
    return k;
}

static void set_page_mtime(struct test_ctx *t, const char *dir, struct dsv4_kv_disk_key key, time_t sec)
{
    char            name[40], path[600];
    struct timespec ts[2] = { { sec, 0 }, { sec, 0 } };
    dsv4_kv_disk_name(key, name, sizeof(name));
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0);
}

/* A chain is written and touched root first, so its root is the least recently used; the
 * budget takes its deepest page instead, which keeps the rest servable; after a restart the
 * parent links are rebuilt from the headers. */
static void test_chain_eviction(struct test_ctx *t)
{
    enum { N = 6, LEN = 100 };
    const uint64_t rec = HDR + LEN;
    char           dir[512];
    dir_of(t, "chain", dir, sizeof(dir));
    struct dsv4_kv_disk *d = open_store(t, dir, N * rec + 10, "model-a", NULL);
    if (!d) return;
    for (uint32_t k = 0; k < N; k++) CHECK(put_page(d, 1, k, LEN) == DSV4_OK);
    CHECK(served(d, 1, N) == N);
    CHECK(put_page(d, 2, 0, LEN) == DSV4_OK); /* unrelated: one page must go */
    struct dsv4_kv_disk_counters c = counters(d);
    CHECKF(c.evictions == 1 && served(d, 1, N) == N - 1, "evictions %llu, served %u", (unsigned long long)c.evictions,
           served(d, 1, N));
    dsv4_kv_disk_close(d);

    /* Restart with the root oldest and the unrelated record newest. */
    for (uint32_t k = 0; k < N - 1; k++) set_page_mtime(t, dir, page_key(1, k), 1000 + k);
    set_page_mtime(t, dir, page_key(2, 0), 2000);
    d = open_store(t, dir, N * rec + 10, "model-a", NULL);
    if (!d) return;
    CHECK(counters(d).files == N && counters(d).evictions == 0);
    CHECK(put_page(d, 3, 0, LEN) == DSV4_OK);
    uint8_t                  buf[256];
    struct dsv4_kv_disk_meta meta;
    size_t                   len;
    struct dsv4_err          err;
    CHECKF(served(d, 1, N) == N - 2, "after restart: served %u", served(d, 1, N));
    CHECK(dsv4_kv_disk_get(d, page_key(2, 0), &meta, buf, sizeof(buf), &len, &err) == DSV4_OK);
    dsv4_kv_disk_close(d);
}

/* A record of the right key but another payload length than the caller's (another build's
 * page size, say) is removed as a bad file by get_exact, shorter or longer. */
static void test_get_exact(struct test_ctx *t)
{
    char dir[512];
    dir_of(t, "exact", dir, sizeof(dir));
    struct logcap        lc;
    struct dsv4_logger   lg;
    logcap_init(&lc, &lg);
    struct dsv4_kv_disk *d = open_store(t, dir, 1 << 20, "model-a", &lg);
    if (!d) return;
    CHECK(put_page(d, 1, 0, 200) == DSV4_OK && put_page(d, 1, 1, 50) == DSV4_OK && put_page(d, 1, 2, 100) == DSV4_OK);
    uint8_t                  buf[256];
    struct dsv4_kv_disk_meta meta;
    size_t                   len = 7;
    struct dsv4_err          err;
    for (uint32_t k = 0; k < 2; k++) {
        CHECKF(dsv4_kv_disk_get_exact(d, page_key(1, k), &meta, buf, 100, &len, &err) == DSV4_KV_DISK_MISS, "page %u", k);
        CHECK(dsv4_kv_disk_get(d, page_key(1, k), &meta, buf, sizeof(buf), &len, &err) == DSV4_KV_DISK_MISS);
    }
    CHECK(dsv4_kv_disk_get_exact(d, page_key(1, 2), &meta, buf, 100, &len, &err) == DSV4_OK && len == 100);
    struct dsv4_kv_disk_counters c = counters(d);
    CHECKF(c.corrupt_removed == 2 && c.files == 1 && c.hits == 1, "removed %llu, files %llu",
           (unsigned long long)c.corrupt_removed, (unsigned long long)c.files);
    CHECKF(strstr(lc.all, "a payload of 200 bytes where 100 are expected") &&
               strstr(lc.all, "a payload of 50 bytes where 100 are expected"),
           "log: %s", lc.all);
    dsv4_kv_disk_close(d);
}

const struct test_case test_group_kvdisk[] = {
    { "checksums", test_checksums },
    { "round_trip", test_round_trip },
    { "restart", test_restart },
    { "bad_files_at_open", test_bad_files_at_open },
    { "bad_files_at_get", test_bad_files_at_get },
    { "disk_full", test_disk_full },
    { "budget_lru", test_budget_lru },
    { "chain_eviction", test_chain_eviction },
    { "get_exact", test_get_exact },
    { "lock", test_lock },
    { "unusable_dir", test_unusable_dir },
    { "crash_restart", test_crash_restart },
    { "threads", test_threads },
    { "tier", test_tier },
    { NULL, NULL },
};
