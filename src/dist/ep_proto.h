/*
 * ep_proto.h - the messages of expert parallelism between rank 0 (ep.c) and the expert
 * ranks (ep_serve.c), and what both compute the same way (ep.h has the design).
 */
#ifndef DSV4_EP_PROTO_H
#define DSV4_EP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dsv4_model;
struct dsv4_backend_kind;

#if DSV4_HAVE_MPI
#include <mpi.h>
#endif

enum ep_op {
    EP_OPEN    = 1, /* arg: bytes of the options blob that follows (Bcast); then a status Gather */
    EP_RESERVE = 2, /* arg: the most rows of a step to come; then a status Gather */
    EP_EXPERTS = 3, /* a MoE layer: layer, rows, dispatch; payload per dispatch (ep.c) */
    EP_CLOSE   = 4, /* free the loaded part */
    EP_QUIT    = 5, /* leave dsv4_mpi_serve */
    EP_BANDWIDTH = 6, /* arg: bytes, rows: reps; every rank measures its read bandwidth (Gather) */
};

/* The read bandwidth of m's backend over a buffer of `bytes` (best of reps), GB/s; -1 when
 * the backend has no such measurement or the buffer cannot be had. */
double ep_read_bandwidth(const struct dsv4_model *m, size_t bytes, int reps);

/* The command header every rank receives (Bcast, raw bytes: all ranks run one binary). */
struct ep_cmd {
    int32_t op;
    int32_t layer;    /* EP_EXPERTS: the layer (n_layer = the MTP block) */
    int32_t rows;     /* EP_EXPERTS: the step's rows R */
    int32_t dispatch; /* EP_EXPERTS: enum dsv4_ep_dispatch */
    int64_t arg;
};

/* The ints of a group table (backend.h: moe_dispatch): count, ids[n_exp], off[n_exp + 1]. */
static inline int ep_table_ints(int n_exp)
{
    return 2 * n_exp + 2;
}

/* Every command travels as one broadcast of the header and one int32 per rank (EXPERTS with
 * ROWS dispatch: the pairs each rank gets, so that one Scatterv carries its table, weights
 * and rows; 0 otherwise): the message a rank of `ranks` receives is ep_msg_bytes(ranks). */
static inline size_t ep_msg_bytes(int ranks)
{
    return sizeof(struct ep_cmd) + sizeof(int32_t) * (size_t)ranks;
}

/* The bytes of a rank's ROWS payload for n pairs: its group table, the n routing weights
 * (f32) and the n rows (bf16), in that order. */
static inline size_t ep_rows_bytes(int n_exp, int n, int d)
{
    return sizeof(int32_t) * (size_t)ep_table_ints(n_exp) + sizeof(float) * (size_t)n + 2 * (size_t)n * (size_t)d;
}

/* A rank's answer to OPEN and RESERVE (Gather, raw bytes). */
struct ep_status {
    int32_t rc;
    int32_t exp_lo, exp_hi; /* OPEN: the experts this rank holds */
    int64_t held_bytes;     /* OPEN: checkpoint bytes of the tensors it holds */
    int64_t rss_bytes;      /* OPEN: its resident memory once loaded */
    char    msg[480];
};

/* A MoE layer's buffers as MPI sees them (ep_stage.c): on a backend the host can read they
 * are the step's own buffers; on one it cannot (staged), host copies of them, moved with
 * ep_pull (backend -> host, waits) and ep_push (host -> backend). */
struct ep_stage {
    const struct dsv4_backend_kind *kind;
    void                           *impl;
    bool                            staged;
    int                             n_exp, d, k, rows; /* rows: the largest step reserved */
    float                          *host;              /* one allocation: the copies below */
    float                          *xe, *ye, *row_w, *u, *rw;
    int                            *ids, *grp;
    uint8_t                        *wire;              /* what MPI carries: packed rows (bf16), tables, weights */
    size_t                          wire_bytes;
    int                            *table_dev;         /* a group table in backend memory */
};

struct dsv4_err;
void        ep_stage_init(struct ep_stage *st, const struct dsv4_model *m);
void        ep_stage_free(struct ep_stage *st);
int         ep_stage_reserve(struct ep_stage *st, int rows, int ranks, struct dsv4_err *err);
/* dev's bytes where the host reads them: dev itself, or host after a download */
const void *ep_pull(const struct ep_stage *st, void *host, const void *dev, size_t bytes);
/* host's bytes into dev (nothing when they are the same memory) */
void        ep_push(const struct ep_stage *st, void *dev, const void *host, size_t bytes);
/* where MPI writes what is bound for dev: host (staged) or dev */
void       *ep_host(const struct ep_stage *st, void *host, void *dev);
/* table uploaded into st's group table in backend memory (what `experts` reads) */
int        *ep_table_dev(const struct ep_stage *st, const int *table);

/* Rows travel as bf16: the MoE input is the RMSNorm's bf16 output and an expert's output is
 * rounded to bf16 (backend.h: rmsnorm, expert), so the top half of each float is all of it
 * and the copy is exact; the tests check the logits bit for bit. */
static inline void ep_to_wire(uint16_t *dst, const float *src, size_t n)
{
    const uint32_t *s = (const uint32_t *)(const void *)src;
    for (size_t i = 0; i < n; i++) dst[i] = (uint16_t)(s[i] >> 16);
}

static inline void ep_from_wire(float *dst, const uint16_t *src, size_t n)
{
    uint32_t *d = (uint32_t *)(void *)dst;
    for (size_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}

/* This process's resident memory in bytes (0 when /proc cannot tell). */
int64_t ep_rss_bytes(void);
/* The checkpoint bytes of the tensors m holds. */
int64_t ep_held_bytes(const struct dsv4_model *m);

/* The options blob of OPEN: these fixed fields, then the checkpoint directory, the backend
 * name and the backend options, each NUL-terminated. */
struct ep_open_fixed {
    int32_t revision, n_threads, ranks, pad;
};


/* The groups of the dispatch table grp whose experts lie in [lo, hi): written to part as a
 * table of its own with offsets from the first of their pairs, which are grp's pairs
 * [*a, *b) (groups ascend by expert id, so a rank's groups are one contiguous range). */
static inline void ep_part_of(const int *grp, int n_exp, int lo, int hi, int *part, int *a, int *b)
{
    int        n = grp[0];
    const int *ids = grp + 1, *off = grp + 1 + n_exp;
    int        g0 = 0;
    while (g0 < n && ids[g0] < lo) g0++;
    int g1 = g0;
    while (g1 < n && ids[g1] < hi) g1++;
    *a = off[g0];
    *b = off[g1];
    part[0] = g1 - g0;
    for (int g = 0; g < n_exp; g++) part[1 + g] = g < g1 - g0 ? ids[g0 + g] : -1;
    for (int g = 0; g <= n_exp; g++) part[1 + n_exp + g] = (g < g1 - g0 ? off[g0 + g] : off[g1]) - off[g0];
}

#endif
