/*
 * resp_store.c - the Responses API's store: the newest conversations, each under its
 * response id, so that a request with previous_response_id continues one (and GET/DELETE
 * /v1/responses/{id} read or drop it). Bounded twice, by count and by the bytes of their
 * JSON; the oldest go first. Thread-safe: one mutex guards the ring.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "server/api.h"

struct resp_entry {
    char    id[40];
    json_t *conv;     /* the chat messages (no instructions), the answer included */
    char   *response; /* the response object as answered (GET /v1/responses/{id}) */
    size_t  bytes;    /* their JSON sizes, for the byte bound */
};

struct srv_resp_store {
    pthread_mutex_t    mu;
    struct resp_entry *e; /* a ring, oldest at head */
    int                cap, head, n;
    size_t             bytes, max_bytes;
};

struct srv_resp_store *srv_resp_store_new(int cap, size_t max_bytes)
{
    struct srv_resp_store *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->cap       = cap > 0 ? cap : 1;
    s->max_bytes = max_bytes;
    s->e         = calloc((size_t)s->cap, sizeof(*s->e));
    if (!s->e) {
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

static void drop_oldest(struct srv_resp_store *s)
{
    struct resp_entry *x = &s->e[s->head];
    json_decref(x->conv);
    free(x->response);
    s->bytes -= x->bytes;
    memset(x, 0, sizeof(*x));
    s->head = (s->head + 1) % s->cap;
    s->n--;
}

void srv_resp_store_free(struct srv_resp_store *s)
{
    if (!s) return;
    while (s->n) drop_oldest(s);
    pthread_mutex_destroy(&s->mu);
    free(s->e);
    free(s);
}

/* Stores conv (consumed) and the response under id, dropping the oldest entries past the
 * bounds; a conversation larger than the whole byte bound is not kept. */
void srv_resp_store_put(struct srv_resp_store *s, const char *id, json_t *conv, json_t *response)
{
    char  *text  = json_dumps(conv, JSON_COMPACT);
    char  *resp  = response ? json_dumps(response, JSON_COMPACT) : NULL;
    size_t bytes = (text ? strlen(text) : 0) + (resp ? strlen(resp) : 0);
    free(text);
    if (!text || !resp || bytes > s->max_bytes) {
        json_decref(conv);
        free(resp);
        return;
    }
    pthread_mutex_lock(&s->mu);
    while (s->n && (s->n == s->cap || s->bytes + bytes > s->max_bytes)) drop_oldest(s);
    struct resp_entry *x = &s->e[(s->head + s->n) % s->cap];
    snprintf(x->id, sizeof(x->id), "%s", id);
    x->conv     = conv;
    x->response = resp;
    x->bytes    = bytes;
    s->bytes += bytes;
    s->n++;
    pthread_mutex_unlock(&s->mu);
}

/* A copy of the conversation stored under id, or NULL. */
json_t *srv_resp_store_get(struct srv_resp_store *s, const char *id)
{
    json_t *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n && !out; i++) {
        struct resp_entry *x = &s->e[(s->head + i) % s->cap];
        if (!strcmp(x->id, id)) out = json_deep_copy(x->conv);
    }
    pthread_mutex_unlock(&s->mu);
    return out;
}

char *srv_resp_store_response(struct srv_resp_store *s, const char *id)
{
    char *out = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n && !out; i++) {
        struct resp_entry *x = &s->e[(s->head + i) % s->cap];
        if (!strcmp(x->id, id)) out = strdup(x->response ? x->response : "{}");
    }
    pthread_mutex_unlock(&s->mu);
    return out;
}

bool srv_resp_store_delete(struct srv_resp_store *s, const char *id)
{
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n && !found; i++) {
        struct resp_entry *x = &s->e[(s->head + i) % s->cap];
        if (strcmp(x->id, id)) continue;
        found = true;
        /* the entry goes; the ones after it move up so the ring stays in order */
        json_decref(x->conv);
        free(x->response);
        s->bytes -= x->bytes;
        for (int j = i; j + 1 < s->n; j++) s->e[(s->head + j) % s->cap] = s->e[(s->head + j + 1) % s->cap];
        memset(&s->e[(s->head + s->n - 1) % s->cap], 0, sizeof(struct resp_entry));
        s->n--;
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

