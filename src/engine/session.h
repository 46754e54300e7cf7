/*
 * session.h - the engine and session handles of include/dsv4.h, shared by engine.c (open,
 * sessions, eval) and session_spec.c (speculative decoding).
 */
#ifndef DSV4_SESSION_H
#define DSV4_SESSION_H

#include "model/runtime.h"

struct dsv4_engine {
    struct dsv4_model  model;
    struct dsv4_logger lg;
};

struct dsv4_session {
    dsv4_engine          *engine;
    struct dsv4_seq_state st;
    struct dsv4_step      step;
    int                   max_chunk;
    float                *logits;     /* [vocab] after the last token */
    bool                  has_logits;
    /* speculative decoding (session_spec.c; spec_draft > 0 only) */
    int                   spec_draft;    /* most draft tokens a step */
    struct dsv4_spec_undo undo;
    float                *draft_logits;  /* [spec_draft, vocab] the MTP block's; V4.1: [max(spec_draft,
                                            dspark_block), vocab] the DSpark block's */
    float                *verify_logits; /* [spec_draft + 1, vocab] the model's on next + drafts */
};

#endif
