/*
 * dsv4.h - the only public header of libdsv4, an inference engine for DeepSeek-V4.
 *
 * Two opaque handles:
 *   dsv4_engine   loaded weights and config; immutable after open, shareable across threads.
 *   dsv4_session  one token timeline (sliding-window ring, compressor frontiers, compressed
 *                 KV rows, indexer keys, logits); used by one thread at a time.
 *
 * Conventions:
 *   - Functions named as actions return int: 0 (DSV4_OK) or a negative enum dsv4_status code.
 *   - They take an optional `struct dsv4_err *err` last; on failure it receives one human
 *     sentence naming the object at fault. err may be NULL. The struct is caller-owned, so
 *     concurrent requests never share error state.
 *   - Nothing in the library calls exit(); memory is allocated only when opening or creating.
 */
#ifndef DSV4_H
#define DSV4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSV4_VERSION_STRING "0.1.0"

enum dsv4_status {
    DSV4_OK           = 0,
    DSV4_EINVAL       = -1,  /* bad argument or option */
    DSV4_ENOMEM       = -2,  /* allocation failed (only at open/create) */
    DSV4_EIO          = -3,  /* file could not be opened, read or mapped */
    DSV4_EFORMAT      = -4,  /* malformed file (checkpoint, JSON, tokenizer) */
    DSV4_ECHECKPOINT  = -5,  /* well-formed files but the wrong tensors for the config */
    DSV4_ERANGE       = -6,  /* value out of range (token id, position past context) */
    DSV4_EUNSUPPORTED = -7,  /* a feature this build or model does not support */
    DSV4_EFULL        = -8,  /* a fixed-size resource is exhausted (queue, pages) */
    DSV4_ECANCELED    = -9,  /* the operation was cancelled */
    DSV4_EINTERNAL    = -10, /* invariant broken inside the library (a bug) */
};

/* Static string for a status code ("invalid argument", ...). Never NULL. */
const char *dsv4_status_str(int status);

#define DSV4_ERR_MSG_MAX 1024

/* Caller-owned error report: the status and one sentence that names the object at fault. */
struct dsv4_err {
    int  code;
    char msg[DSV4_ERR_MSG_MAX];
};

/* Log levels for the optional log callback. */
enum dsv4_log_level {
    DSV4_LOG_ERROR = 0,
    DSV4_LOG_WARN  = 1,
    DSV4_LOG_INFO  = 2,
    DSV4_LOG_DEBUG = 3,
};

typedef void (*dsv4_log_fn)(void *ud, enum dsv4_log_level level, const char *msg);

typedef struct dsv4_engine  dsv4_engine;
typedef struct dsv4_session dsv4_session;

/* Which revision of the official demo to reproduce (docs/MODEL.md, "Revisions"). */
enum dsv4_revision {
    DSV4_REVISION_CURRENT = 0, /* shared-expert clamp, true e4m3 rounding of cached KV */
    DSV4_REVISION_INITIAL = 1, /* first release: no shared clamp, KV FP8 simulation a no-op */
};

struct dsv4_engine_params {
    dsv4_log_fn        log;       /* optional; every checkpoint problem is logged here */
    void              *log_ud;
    enum dsv4_revision revision;
    int                n_threads; /* 0 = all online CPUs */
};

/* Fills params with defaults (no logging, current revision, all CPUs). */
void dsv4_engine_params_default(struct dsv4_engine_params *params);

/*
 * Opens a checkpoint directory (official Hugging Face layout: config.json, *.safetensors,
 * optional model.safetensors.index.json). Every tensor is checked against the config before
 * this returns; on DSV4_ECHECKPOINT every problem has been passed to params->log and err
 * holds the count and the first one.
 */
int  dsv4_engine_open(dsv4_engine **out, const char *dir, const struct dsv4_engine_params *params,
                      struct dsv4_err *err);
void dsv4_engine_close(dsv4_engine *engine);

struct dsv4_model_info {
    int  vocab_size;
    int  d_model;
    int  n_layer;
    int  n_head;
    int  n_exp;
    int  n_exp_used;
    int  max_ctx;      /* max_position_embeddings */
    bool has_mtp;      /* the checkpoint carries a usable MTP block */
    int  bos_id;
    int  eos_id;
};

void dsv4_engine_info(const dsv4_engine *engine, struct dsv4_model_info *info);

#ifdef __cplusplus
}
#endif
#endif /* DSV4_H */
