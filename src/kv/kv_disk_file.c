/*
 * kv_disk_file.c - the file side of the kv-disk store: the record header, encoded field by
 * field in little-endian order (never a struct dump: the format must not depend on the
 * compiler's padding or the host's byte order), file names, the directory lock, and reads
 * and writes that finish what they start (short transfers and EINTR are retried).
 *
 * Header layout (docs/FORMAT.md is the reference; offsets in bytes):
 *     0   8  magic "DSV4KVC\0"        64   8  parent chain hash
 *     8   4  format version (1)       72   8  token count
 *    12   4  header bytes (128)       80   8  payload bytes
 *    16  32  model identity           88   4  payload CRC-32C
 *    48   8  key: chain hash          92  32  reserved, zero
 *    56   4  key: depth              124   4  CRC-32C of bytes 0..123
 *    60   4  flags, zero
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv/kv_disk_file.h"

static const uint8_t MAGIC[8] = { 'D', 'S', 'V', '4', 'K', 'V', 'C', 0 };

/* ------------------------------------------------------------------ little-endian fields */

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ------------------------------------------------------------------ header */

void kvd_header_encode(const struct kvd_header *h, uint8_t out[DSV4_KV_DISK_HEADER])
{
    memset(out, 0, DSV4_KV_DISK_HEADER);
    memcpy(out, MAGIC, 8);
    put_le(out + 8, DSV4_KV_DISK_VERSION, 4);
    put_le(out + 12, DSV4_KV_DISK_HEADER, 4);
    memcpy(out + 16, h->identity, DSV4_KV_DISK_ID_BYTES);
    put_le(out + 48, h->key.chain, 8);
    put_le(out + 56, h->key.depth, 4);
    put_le(out + 64, h->meta.parent_chain, 8);
    put_le(out + 72, h->meta.n_tok, 8);
    put_le(out + 80, h->payload_len, 8);
    put_le(out + 88, h->payload_crc, 4);
    put_le(out + 124, dsv4_crc32c(0, out, 124), 4);
}

static bool is_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return false;
    return true;
}

/* The checks in the order that gives the most useful reason: a file of another version may
 * have another header, so the version comes before its checksum; identity and sizes are only
 * read from a header whose checksum holds. */
bool kvd_header_is_valid(const uint8_t *raw, size_t have, uint64_t file_size, const uint8_t *identity,
                         struct dsv4_kv_disk_key name_key, struct kvd_header *h, char *why, size_t cap)
{
    if (have < DSV4_KV_DISK_HEADER) {
        snprintf(why, cap, "truncated: %zu bytes, shorter than the %d-byte header", have, DSV4_KV_DISK_HEADER);
        return false;
    }
    if (memcmp(raw, MAGIC, 8)) return snprintf(why, cap, "bad magic"), false;
    uint32_t version = (uint32_t)get_le(raw + 8, 4);
    if (version != DSV4_KV_DISK_VERSION) {
        snprintf(why, cap, "format version %" PRIu32 ", this build reads %d", version, DSV4_KV_DISK_VERSION);
        return false;
    }
    if ((uint32_t)get_le(raw + 124, 4) != dsv4_crc32c(0, raw, 124))
        return snprintf(why, cap, "header checksum mismatch"), false;
    if (get_le(raw + 12, 4) != DSV4_KV_DISK_HEADER || get_le(raw + 60, 4) != 0 || !is_zero(raw + 92, 32))
        return snprintf(why, cap, "header size, flags or reserved bytes not as version 1 writes them"), false;
    if (memcmp(raw + 16, identity, DSV4_KV_DISK_ID_BYTES)) return snprintf(why, cap, "another model's identity"), false;
    memcpy(h->identity, raw + 16, DSV4_KV_DISK_ID_BYTES);
    h->key.chain         = get_le(raw + 48, 8);
    h->key.depth         = (uint32_t)get_le(raw + 56, 4);
    h->meta.parent_chain = get_le(raw + 64, 8);
    h->meta.n_tok        = get_le(raw + 72, 8);
    h->payload_len       = get_le(raw + 80, 8);
    h->payload_crc       = (uint32_t)get_le(raw + 88, 4);
    if (h->key.chain != name_key.chain || h->key.depth != name_key.depth)
        return snprintf(why, cap, "its key does not match its file name"), false;
    if (h->payload_len > UINT64_MAX - DSV4_KV_DISK_HEADER || file_size != DSV4_KV_DISK_HEADER + h->payload_len) {
        snprintf(why, cap, "%" PRIu64 " bytes, the header says %" PRIu64, file_size,
                 (uint64_t)DSV4_KV_DISK_HEADER + h->payload_len);
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ names */

void dsv4_kv_disk_name(struct dsv4_kv_disk_key key, char *name, size_t cap)
{
    snprintf(name, cap, "%016" PRIx64 "-%08" PRIx32 ".kvc", key.chain, key.depth);
}

static bool parse_hex(const char *s, int n, uint64_t *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        int c = s[i], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return false;
        *v = *v << 4 | (uint64_t)d;
    }
    return true;
}

bool kvd_name_parse(const char *name, struct dsv4_kv_disk_key *key)
{
    uint64_t chain, depth;
    if (strlen(name) != 29 || name[16] != '-' || strcmp(name + 25, ".kvc")) return false;
    if (!parse_hex(name, 16, &chain) || !parse_hex(name + 17, 8, &depth)) return false;
    key->chain = chain;
    key->depth = (uint32_t)depth;
    return true;
}

/* ------------------------------------------------------------------ directory and lock */

int kvd_mkdir_p(const char *dir)
{
    char path[4096];
    if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path)) return errno = ENAMETOOLONG, -1;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) return -1;
    return 0;
}

int kvd_lock(int dir_fd, const char *dir, int *fd, struct dsv4_err *err)
{
    *fd = openat(dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (*fd < 0) return dsv4_err_set(err, DSV4_EIO, "kv-disk directory %s: cannot open its lock file: %s", dir, strerror(errno));
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        int  e        = errno;
        char pid[32]  = { 0 };
        ssize_t got   = pread(*fd, pid, sizeof(pid) - 1, 0);
        pid[got > 0 ? got : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK)
            return dsv4_err_set(err, DSV4_EIO, "kv-disk directory %s is in use by another process (pid %s, in %s/lock)",
                                dir, pid[0] ? pid : "unknown", dir);
        return dsv4_err_set(err, DSV4_EIO, "kv-disk directory %s: cannot lock %s/lock: %s", dir, dir, strerror(e));
    }
    char line[32];
    int  n = snprintf(line, sizeof(line), "%ld\n", (long)getpid());
    /* The pid is only for the message above: failing to write it does not stop the store. */
    bool pid_written = ftruncate(*fd, 0) == 0 && pwrite(*fd, line, (size_t)n, 0) == n;
    (void)pid_written;
    return DSV4_OK;
}

/* ------------------------------------------------------------------ reads and writes */

int kvd_write_all(int fd, const void *p, size_t n, int64_t limit, int fail_errno)
{
    const uint8_t *s    = p;
    size_t         done = 0;
    while (done < n) {
        size_t want = n - done;
        if (limit >= 0) {
            if ((uint64_t)limit <= done) return errno = fail_errno, -1;
            if (want > (uint64_t)limit - done) want = (size_t)((uint64_t)limit - done);
        }
        ssize_t w = write(fd, s + done, want);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) return errno = EIO, -1;
        done += (size_t)w;
    }
    return 0;
}

ssize_t kvd_read_full(int fd, void *p, size_t n)
{
    uint8_t *s    = p;
    size_t   done = 0;
    while (done < n) {
        ssize_t r = read(fd, s + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

/* One file outside a store (a saved session): the same crash-safe protocol as a store's
 * records, with the temp file beside path. */
int kvd_write_file(const char *path, const uint8_t hdr[DSV4_KV_DISK_HEADER], const void *payload, size_t len,
                   char *why, size_t cap)
{
    char dir[4096], tmp[4200];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof(dir), ".");
    else if (slash == path) snprintf(dir, sizeof(dir), "/");
    else snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return snprintf(why, cap, "cannot create %s: %s", tmp, strerror(errno)), -1;
    const char *step = NULL;
    if (kvd_write_all(fd, hdr, DSV4_KV_DISK_HEADER, -1, 0) != 0 || kvd_write_all(fd, payload, len, -1, 0) != 0)
        step = "write";
    else if (fsync(fd) != 0)
        step = "fsync";
    int e = errno;
    if (close(fd) != 0 && !step) step = "close", e = errno;
    if (!step && rename(tmp, path) != 0) step = "rename", e = errno;
    if (step) {
        snprintf(why, cap, "%s %s: %s", step, tmp, strerror(e));
        unlink(tmp);
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        snprintf(why, cap, "fsync of directory %s: %s", dir, strerror(errno));
        if (dfd >= 0) close(dfd);
        return -1;
    }
    close(dfd);
    return 0;
}
