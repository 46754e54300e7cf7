/*
 * kv_tier.h - the disk tier under the prefix cache (issue 39; internal): prefix-cache
 * entries written to a kv_disk store as they are published, and read back when a lookup's
 * RAM chain ends, so that a prefix outlives eviction and restarts.
 *
 * The payload of one entry (docs/FORMAT.md, "Prefix cache payload"), in this order:
 *   tokens   [page_tokens] int32 little-endian: the page's token ids (a hit compares them;
 *            the key itself is a SHA-256 chain, kv_pool.c chain_hash)
 *   page     [page_bytes]  the pool page as it lies in KV memory (kv.h: every layer's
 *            compressed rows and indexer keys)
 *   snapshot [snap_bytes]  the snapshot at the page's end, as the RAM cache keeps it (kv.h:
 *            rings, previous compressor blocks, the MTP streams)
 * Its length is fixed by the model and the pool, and the identity (dsv4_model_kv_identity)
 * covers everything that shapes it, so a payload of another length is refused as corrupt.
 *
 * Writes are write-behind: the stepping thread downloads the page and the snapshot from KV
 * memory (the backend's download: this is the one copy on the step thread, page_bytes +
 * snap_bytes per published page) into one of n_buf host buffers allocated at open, and
 * queues it; a writer thread puts it to the store. No free buffer: the write is dropped and
 * counted, decode never waits for the disk.
 *
 * Reads are prefetched: the scheduler hands a waiting request's chain (the keys past its RAM
 * chain) to a reader thread, which reads and checks the records in order into n_prefetch
 * host buffers allocated at open (the longest chain: one sequence's pages), while other
 * sequences step. A load then finds its record among the prefetched ones and only the
 * upload (install) runs on the stepping thread; a record not prefetched (another chain,
 * or dropped) is read synchronously there as before. One chain is prefetched at a time.
 *
 * Threads: write, load, install and the prefetch calls belong to the stepping thread; the
 * counters may be read from any thread.
 */
#ifndef DSV4_KV_TIER_H
#define DSV4_KV_TIER_H

#include "kv/kv.h"
#include "kv/kv_disk.h"

struct dsv4_kv_tier_params {
    const char *dir;
    uint64_t    budget;      /* bytes of files */
    int         page_tokens;
    size_t      page_bytes, snap_bytes;
    int         n_buf;       /* write buffers (the queue's bound); 0 = 8 */
    int         n_prefetch;  /* read buffers: the longest chain prefetched; 0 = 1 */
};

struct dsv4_kv_tier_counters {
    struct dsv4_kv_disk_counters disk;
    uint64_t writes_dropped;  /* queue full */
    uint64_t token_mismatch;  /* records whose token ids were not the lookup's (hash collision) */
    int      queue_depth;     /* writes queued or being written now */
    uint64_t prefetched;      /* records read by the reader thread */
    uint64_t loads;           /* records read whole, by the reader or the stepping thread */
    double   load_s;          /* their reads' wall time, seconds */
};

struct dsv4_kv_tier;

/* Opens the store (dsv4_kv_disk_open's errors: another live process on dir, ...) and starts
 * the writer thread. mem: where pages and snapshots live. */
int  dsv4_kv_tier_open(struct dsv4_kv_tier **out, const struct dsv4_kv_tier_params *p,
                       const uint8_t identity[DSV4_KV_DISK_ID_BYTES], const struct dsv4_kv_mem *mem,
                       const struct dsv4_logger *log, struct dsv4_err *err);
/* Finishes the queued writes, stops the writer and closes the store. NULL is a no-op. */
void dsv4_kv_tier_close(struct dsv4_kv_tier *t);

/* Queues the entry key (tokens: its page of ids; page and snap in KV memory) for writing,
 * or drops it when every buffer is taken. */
void dsv4_kv_tier_write(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const struct dsv4_kv_disk_meta *meta,
                        const int32_t *tokens, const void *page, const void *snap);
/* Reads the record of key into a read buffer: true when it exists, is whole and holds
 * exactly these token ids; it is then the last successful load (a failed load leaves the
 * previous one in place, so a chain's deepest snapshot can be installed after its end is
 * found). */
bool dsv4_kv_tier_load(struct dsv4_kv_tier *t, struct dsv4_kv_disk_key key, const int32_t *tokens);
/* Queues keys[0..n) (tokens: their pages of ids, back to back) for the reader; false when
 * a prefetch is already queued, running or done and not dropped. Past n_prefetch records
 * the chain is left to synchronous loads. */
bool dsv4_kv_tier_prefetch(struct dsv4_kv_tier *t, const struct dsv4_kv_disk_key *keys, const int32_t *tokens, int n);
/* True while the queued prefetch is being read. */
bool dsv4_kv_tier_prefetch_busy(struct dsv4_kv_tier *t);
/* Waits up to timeout_s for the prefetch being read to complete. */
void dsv4_kv_tier_prefetch_wait(struct dsv4_kv_tier *t, double timeout_s);
/* Lets go of the prefetched records (a prefetch being read is discarded when it ends). */
void dsv4_kv_tier_prefetch_drop(struct dsv4_kv_tier *t);
/* Test hook, for every tier of the process: while held, readers do not report a prefetch
 * complete. */
void dsv4_kv_tier_test_hold(bool hold);
/* Uploads the page and the snapshot of the last successful load into KV memory; either
 * may be NULL (a page in the middle of a chain needs no snapshot). */
void dsv4_kv_tier_install(struct dsv4_kv_tier *t, void *page, void *snap);
/* One snapshot's room in KV memory (snap_bytes) for the stepping thread: the snapshot of a
 * page written to disk without a RAM cache entry, or restored from one loaded so. */
void *dsv4_kv_tier_scratch_snap(struct dsv4_kv_tier *t);

void dsv4_kv_tier_counters(struct dsv4_kv_tier *t, struct dsv4_kv_tier_counters *c);

#endif
