/*
 * kv_disk.h - a crash-safe store of prefix-cache records in one directory (the disk tier
 * under the prefix cache, issue 39; internal). This is the foundation only: the store knows
 * records (a key, a little metadata and an opaque payload), not pages or snapshots; what a
 * payload holds and when records are written or read is for its caller.
 *
 * One file per record, DIR/<16 hex chain>-<8 hex depth>.kvc, with a 128-byte little-endian
 * header (docs/FORMAT.md, "Prefix cache files (kv-disk)"): magic, format version, the model's
 * identity (32 bytes the caller computes, dsv4_kv_disk_identity), key, parent key, token
 * count, payload length and CRC-32C, header CRC-32C. A record is written to DIR/tmp.PID.N,
 * fsynced, renamed to its name, and the directory fsynced: a crash leaves either the whole
 * record or a temp file, which the next open removes. Every read verifies everything; a file
 * that fails (truncated, corrupted, another model's, another version's) is removed with a log
 * line and counted, and reads as a miss.
 *
 * Keys: the prefix cache's chain hash of an entry (hash of the parent's chain hash and the
 * entry's page of token ids, kv_pool.c) and its depth (page index). A 64-bit hash can
 * collide: the caller must keep the token ids in the payload and compare them, as the RAM
 * cache does, before trusting a hit.
 *
 * The budget counts whole files (header included). Puts evict records until the new one
 * fits: the least recently used (a get or a put of a stored key makes it most recent) among
 * those no stored record names as parent, so a chain loses its deepest pages first and stays
 * servable from its root (a lookup walks from depth 0); only when every record has a child
 * being written is the least recently used of all taken. A record larger than the budget is
 * refused (counted in refused, logged once per process). The order survives restarts through the files' mtime
 * (set on every hit). After any write error (a full disk, EIO) the store stops writing for
 * the rest of the process (writes_disabled, with the reason) and keeps reading.
 *
 * A second process on the same directory is refused at open: DIR/lock is held with
 * flock(LOCK_EX | LOCK_NB) (the kernel drops it when the process dies, so a restarted server
 * takes the directory over) and holds the holder's pid for the error message.
 *
 * Threads: any number may call put and get at once. One mutex guards the index, the LRU
 * list and the counters; reading and writing file contents, fsync and the directory fsync
 * run outside it. Unlinks (eviction, removal of a bad file) run under it, so a file is never
 * removed after another thread has written a new record under the same name.
 */
#ifndef DSV4_KV_DISK_H
#define DSV4_KV_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

enum {
    DSV4_KV_DISK_VERSION  = 1,   /* file format version (docs/FORMAT.md) */
    DSV4_KV_DISK_HEADER   = 128, /* header bytes */
    DSV4_KV_DISK_ID_BYTES = 32,  /* identity bytes */
    DSV4_KV_DISK_MISS     = 1,   /* dsv4_kv_disk_get: no valid record for the key */
};

struct dsv4_kv_disk_key {
    uint64_t chain; /* the prefix cache's chain hash of the entry */
    uint32_t depth; /* its page index within the prefix */
};

/* What the header carries besides the key. */
struct dsv4_kv_disk_meta {
    uint64_t parent_chain; /* chain hash of the entry at depth - 1 (0 at depth 0) */
    uint64_t n_tok;        /* tokens of the prefix the record ends */
};

struct dsv4_kv_disk_counters {
    uint64_t hits, misses;       /* gets that returned a record, gets that did not */
    uint64_t bytes_read;         /* by hits and by the reads that found a bad file */
    uint64_t bytes_written;      /* whole files renamed into place */
    uint64_t puts;               /* records written */
    uint64_t evictions;          /* records removed for the budget */
    uint64_t corrupt_removed;    /* invalid files removed (at open and by gets) */
    uint64_t tmp_removed;        /* temp files of an interrupted write removed at open */
    uint64_t write_errors;       /* puts that failed on an I/O error */
    uint64_t refused;            /* puts refused for the budget (ERANGE: larger than all of it; EFULL) */
    uint64_t files, bytes_used;  /* records stored now and their bytes (with writes in flight) */
    bool     writes_disabled;    /* a write failed: no more puts in this process */
    char     disabled_why[512];  /* the error that disabled them */
};

struct dsv4_kv_disk;

/* The identity of a model: SHA-256 of bytes the caller chooses (later: the config, the
 * weights' headers and the KV format version). */
void dsv4_kv_disk_identity(const void *bytes, size_t n, uint8_t out[DSV4_KV_DISK_ID_BYTES]);

/* Opens (creating it and its parents if missing) the store in dir with a budget in bytes.
 * DSV4_EIO: the directory cannot be created or used, or another live process holds it (err
 * names the directory and that process's pid). Invalid files found are removed, one log line
 * each; then LRU records are evicted down to the budget. log may be NULL; it is called from
 * whichever thread finds a bad file, sometimes with the store's lock held, so it must be
 * thread-safe and must not call the store. */
int  dsv4_kv_disk_open(struct dsv4_kv_disk **out, const char *dir, uint64_t budget_bytes,
                       const uint8_t identity[DSV4_KV_DISK_ID_BYTES], const struct dsv4_logger *log,
                       struct dsv4_err *err);
/* Closes the store and releases the lock (the lock file stays). NULL is a no-op. */
void dsv4_kv_disk_close(struct dsv4_kv_disk *d);

/* Stores a record. A key already stored (or being written) is not rewritten: it becomes the
 * most recently used and this returns DSV4_OK. DSV4_ERANGE: the file would exceed the whole
 * budget. DSV4_EFULL: nothing more can be evicted now (the rest is being written). DSV4_EIO:
 * writes are disabled, or this write failed and disabled them (nothing is left behind). */
int dsv4_kv_disk_put(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, const struct dsv4_kv_disk_meta *meta,
                     const void *payload, size_t len, struct dsv4_err *err);

/* Reads the record of key into buf[0, cap): DSV4_OK with *meta and *len set, or
 * DSV4_KV_DISK_MISS (none, or a bad one, now removed), or DSV4_ERANGE when the payload is
 * longer than cap (the record stays). buf's contents are undefined after a miss. */
int dsv4_kv_disk_get(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, struct dsv4_kv_disk_meta *meta,
                     void *buf, size_t cap, size_t *len, struct dsv4_err *err);

/* dsv4_kv_disk_get for a caller whose records all hold exactly len payload bytes: a record
 * of another length (written by another build, say) is a bad file: removed, counted in
 * corrupt_removed, and a miss. */
int dsv4_kv_disk_get_exact(struct dsv4_kv_disk *d, struct dsv4_kv_disk_key key, struct dsv4_kv_disk_meta *meta,
                           void *buf, size_t len, size_t *got, struct dsv4_err *err);

void dsv4_kv_disk_counters(struct dsv4_kv_disk *d, struct dsv4_kv_disk_counters *c);

/* The file name of a key (at least 32 bytes). */
void dsv4_kv_disk_name(struct dsv4_kv_disk_key key, char *name, size_t cap);

/* Tests only: every later put's write fails with errno err_no once after_bytes bytes of its
 * file are written (as a full disk does mid-write); after_bytes < 0 turns it off. */
void dsv4_kv_disk_set_fault(struct dsv4_kv_disk *d, int64_t after_bytes, int err_no);

#endif
