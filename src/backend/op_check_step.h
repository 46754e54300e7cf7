/*
 * op_check_step.h - the op checker's steps for the whole-step ops (backend.h: struct
 * dsv4_step_desc): several sequences of different lengths and positions in one call, each
 * with its own slot and its own shuffled page table into one shared pool of pages, all in
 * one arena of garbage (0xa5), so an op that reads or writes a byte it should not is seen.
 * The cases of attention and the indexer are in op_check_kv.c, those of compress,
 * store_rows and step_begin in op_check_store.c.
 */
#ifndef DSV4_OP_CHECK_STEP_H
#define DSV4_OP_CHECK_STEP_H

#include "backend/op_check_int.h"

enum { CHK_STEP_MAX_SEQS = 4 };

struct chk_step {
    struct dsv4_step_seq  seq[CHK_STEP_MAX_SEQS];
    struct dsv4_step_desc desc;
    int                  *pos, *tok; /* [n_rows] */
    /* the arena: a slot of slot_bytes per sequence, then the pool of pages */
    size_t                bytes, slot_off[CHK_STEP_MAX_SEQS], pool_off;
    uint8_t              *arena;
};

/* A step of n_seqs sequences, sequence s at positions pn[s][0] .. + pn[s][1] - 1 (rows in
 * order), pages of page_tokens positions and page_bytes, as many as each sequence's
 * positions need, in a random order. */
void chk_step_make(struct chk *h, struct chk_step *f, int n_seqs, const int (*pn)[2], size_t slot_bytes,
                   int page_tokens, size_t page_bytes);
/* Points the descriptor at a copy of the arena (an output slot of the run). */
void chk_step_rebase(struct chk_step *f, uint8_t *arena);

/* The cases of op_check_store.c. */
void chk_run_compress(struct chk *h);
void chk_run_store_rows(struct chk *h);
void chk_run_step_begin(struct chk *h);

#endif /* DSV4_OP_CHECK_STEP_H */
