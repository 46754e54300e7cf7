/*
 * session_file.h - a session's state as one kv-disk payload (session_file.c; docs/FORMAT.md
 * "Saved sessions"), shared by the single-file save and load (dsv4_session_save/load) and
 * the prompt cache's records (session_cache.c).
 */
#ifndef DSV4_SESSION_FILE_H
#define DSV4_SESSION_FILE_H

#include "engine/session.h"
#include "kv/kv_disk.h"

/* The identity of the session's state layout (dsv4_model_kv_identity: model, revision,
 * compute, MTP state, page and snapshot bytes); DSV4_ENOMEM or DSV4_OK. */
int    dsv4_session_identity(const dsv4_session *s, uint8_t id[DSV4_KV_DISK_ID_BYTES]);
/* Bytes of the payload of n_tok tokens (with the logits row or without). */
size_t dsv4_session_payload_bytes(const dsv4_session *s, int n_tok, bool logits);
/* The payload of the session at its position into a malloc'd *buf of *len bytes.
 * DSV4_EINVAL: n_tokens is not the position; DSV4_ENOMEM. */
int    dsv4_session_encode(const dsv4_session *s, const int32_t *tokens, int n_tokens, uint8_t **buf, size_t *len,
                           struct dsv4_err *err);
/* Resets s and loads a payload whose bytes are verified already (len bytes, n_tok from its
 * header). expect (or NULL): the ids it must hold, compared before anything is loaded;
 * tokens (or NULL) receives its ids, cap the most the caller takes. DSV4_EFORMAT (with why)
 * when it does not fit this session, cap or expect; s stays reset then. */
int    dsv4_session_decode(dsv4_session *s, const uint8_t *buf, uint64_t len, uint64_t n_tok, const int32_t *expect,
                           int32_t *tokens, int cap, char *why, size_t wcap);

/* The prompt cache's key of the record after the first k pages of tokens (session_cache.c;
 * docs/FORMAT.md "Session-cache records"). */
struct dsv4_kv_disk_key dsv4_prompt_cache_key(int page_tokens, const int32_t *tokens, int k);

#endif
