/*
 * kv_disk_file.h - the file side of the kv-disk store (kv_disk_file.c): the record header
 * byte for byte, file names, the directory lock and whole-buffer reads and writes. Used by
 * kv_disk.c and by saved sessions (engine/session_file.c).
 */
#ifndef DSV4_KV_DISK_FILE_H
#define DSV4_KV_DISK_FILE_H

#include <sys/types.h>

#include "kv/kv_disk.h"

/* A decoded header (docs/FORMAT.md, "Prefix cache files (kv-disk)"). */
struct kvd_header {
    uint8_t                  identity[DSV4_KV_DISK_ID_BYTES];
    struct dsv4_kv_disk_key  key;
    struct dsv4_kv_disk_meta meta;
    uint64_t                 payload_len;
    uint32_t                 payload_crc;
};

void kvd_header_encode(const struct kvd_header *h, uint8_t out[DSV4_KV_DISK_HEADER]);
/* Whether raw[0, have) is a valid header of this identity for a file of file_size bytes
 * named for key name_key; false with the reason in why. */
bool kvd_header_is_valid(const uint8_t *raw, size_t have, uint64_t file_size, const uint8_t *identity,
                         struct dsv4_kv_disk_key name_key, struct kvd_header *h, char *why, size_t cap);
/* Whether name is a record's file name; its key into *key. */
bool kvd_name_parse(const char *name, struct dsv4_kv_disk_key *key);

/* mkdir -p (mode 0755); 0 or -1 with errno. */
int kvd_mkdir_p(const char *dir);
/* Opens and locks DIR/lock (fd in *fd), writing this pid into it; DSV4_EIO with err naming
 * the directory (and the holder's pid when another process has it). */
int kvd_lock(int dir_fd, const char *dir, int *fd, struct dsv4_err *err);

/* Writes all of p[0, n) at fd; fails with fail_errno once limit bytes are written (limit < 0:
 * never). 0, or -1 with errno. */
int kvd_write_all(int fd, const void *p, size_t n, int64_t limit, int fail_errno);
/* Reads up to n bytes (fewer only at end of file); the count, or -1 with errno. */
ssize_t kvd_read_full(int fd, void *p, size_t n);

/* Writes header and payload to path crash-safely (path.tmp.PID, fsync, rename, fsync of the
 * directory): afterwards path holds the old file or the whole new one. 0, or -1 with why. */
int kvd_write_file(const char *path, const uint8_t hdr[DSV4_KV_DISK_HEADER], const void *payload, size_t len,
                   char *why, size_t cap);

#endif
