/*
 * prof_xfer.h - the profiler's transfer counts (prof.c): the model layer reports every
 * upload, download, copy and host synchronisation it asks of the backend's memory half
 * during a step, so that `--profile` prints them per step and a test holds a decode step to
 * its count (the one download of a decode step is the logits). A transfer between steps (a
 * KV snapshot, a frontier reset: src/kv/kv_state.c) is not a step's and is not counted.
 */
#ifndef DSV4_PROF_XFER_H
#define DSV4_PROF_XFER_H

#include <stddef.h>
#include <stdint.h>

struct dsv4_prof;

enum dsv4_xfer { DSV4_XFER_UPLOAD, DSV4_XFER_DOWNLOAD, DSV4_XFER_COPY, DSV4_XFER_SYNC, DSV4_XFER_COUNT };

/* One transfer of `bytes` (0 for a synchronisation); p NULL (no profiler): nothing. */
void dsv4_prof_xfer(struct dsv4_prof *p, enum dsv4_xfer x, size_t bytes);
/* The transfers counted so far, by kind; zeros when p is NULL. */
void dsv4_prof_xfers(const struct dsv4_prof *p, uint64_t counts[DSV4_XFER_COUNT]);

#endif
