/*
 * vk_cmd.c - recording and submitting on the compute queue, and the memory half's
 * transfers: upload through the mapped staging area (recorded in order with the ops),
 * download (submits and waits), copy between buffers, sync.
 *
 * One command buffer is open at a time (vk.h): ops, uploads and copies append to it, each
 * followed by a barrier, so the queue runs them in the order the host issued them. It is
 * submitted when the host needs results (download, sync) or an area of the command buffer
 * (staging, metadata, descriptor sets) is full. Opening the next one waits for the previous
 * submission, so those areas are free to reuse from their start.
 *
 * The table's ops and transfers return nothing, so an error here (an address that is not
 * the backend's, a lost device) is recorded once in v->fault and logged; the op or transfer
 * does nothing, and the outputs the caller reads are then wrong, which the op checker shows.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk.h"

void dsv4_vk_fault(struct dsv4_vk *v, const char *fmt, ...)
{
    if (v->fault[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->fault, sizeof(v->fault), fmt, ap);
    va_end(ap);
    dsv4_log(v->lg, DSV4_LOG_ERROR, "vulkan: %s", v->fault);
}

static void wait_driver(struct dsv4_vk *v)
{
    if (!v->pending) return;
    if (vkWaitForFences(v->dev, 1, &v->fence, VK_TRUE, UINT64_MAX) != VK_SUCCESS)
        dsv4_vk_fault(v, "waiting for the queue failed (device lost?)");
    vkResetFences(v->dev, 1, &v->fence);
    v->pending = false;
    dsv4_vk_stamps_collect(v);
}

/* The driver's calls, its host allocations exempt from the token-evaluation guard (its own:
 * lavapipe allocates as it records and submits; dsv4's code stays guarded). */
void dsv4_vk_wait(struct dsv4_vk *v)
{
    dsv4_alloc_guard_exempt(true);
    wait_driver(v);
    dsv4_alloc_guard_exempt(false);
}

static void barrier_driver(struct dsv4_vk *v)
{
    VkMemoryBarrier mb = { .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT,
                           .dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT };
    vkCmdPipelineBarrier(v->cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0,
                         NULL, 0, NULL);
}

/* The driver's calls, its host allocations exempt from the token-evaluation guard (its own:
 * lavapipe allocates as it records and submits; dsv4's code stays guarded). */
void dsv4_vk_barrier(struct dsv4_vk *v)
{
    dsv4_alloc_guard_exempt(true);
    barrier_driver(v);
    dsv4_alloc_guard_exempt(false);
}

static bool record_driver(struct dsv4_vk *v)
{
    if (v->recording) return true;
    dsv4_vk_wait(v);
    VkCommandBufferBeginInfo bi = { .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                    .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT };
    bool pools_ok = true;
    for (int i = 0; i <= v->cur_pool && i < v->n_pools; i++)
        pools_ok &= vkResetDescriptorPool(v->dev, v->dpools[i], 0) == VK_SUCCESS;
    if (vkResetCommandBuffer(v->cmd, 0) != VK_SUCCESS || !pools_ok || vkBeginCommandBuffer(v->cmd, &bi) != VK_SUCCESS) {
        dsv4_vk_fault(v, "cannot record a command buffer");
        return false;
    }
    v->recording    = true;
    v->n_sets       = 0;
    v->cur_pool     = 0;
    v->staging.used = 0;
    for (int i = 0; i <= v->cur_meta && i < v->n_meta; i++) v->meta[i].used = 0;
    v->cur_meta = 0;
    /* after every earlier submission on the queue (it may overlap them otherwise) */
    dsv4_vk_barrier(v);
    dsv4_vk_stamp_open(v);
    return true;
}

/* The driver's calls, its host allocations exempt from the token-evaluation guard. */
bool dsv4_vk_record(struct dsv4_vk *v)
{
    dsv4_alloc_guard_exempt(true);
    bool ok = record_driver(v);
    dsv4_alloc_guard_exempt(false);
    return ok;
}

static void submit_driver(struct dsv4_vk *v)
{
    if (!v->recording) return;
    VkMemoryBarrier mb = { .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT,
                           .dstAccessMask = VK_ACCESS_HOST_READ_BIT };
    vkCmdPipelineBarrier(v->cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0,
                         NULL);
    v->recording = false;
    VkSubmitInfo si = { .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &v->cmd };
    if (vkEndCommandBuffer(v->cmd) != VK_SUCCESS || vkQueueSubmit(v->queue, 1, &si, v->fence) != VK_SUCCESS) {
        dsv4_vk_fault(v, "cannot submit to the compute queue");
        return;
    }
    v->pending = true;
}

/* The driver's calls, its host allocations exempt from the token-evaluation guard (its own:
 * lavapipe allocates as it records and submits; dsv4's code stays guarded). */
void dsv4_vk_submit(struct dsv4_vk *v)
{
    dsv4_alloc_guard_exempt(true);
    submit_driver(v);
    dsv4_alloc_guard_exempt(false);
}

void dsv4_vk_finish(struct dsv4_vk *v)
{
    dsv4_vk_submit(v);
    dsv4_vk_wait(v);
}

/* n bytes of a host-visible area (staging, metadata) in the open command buffer, aligned
 * to align; when they do not fit, the command buffer is submitted and waited for, and a new
 * one starts with the area empty. Returns the offset, or -1 (and a fault) when n exceeds
 * the area. */
static int64_t area_take(struct dsv4_vk *v, struct vk_hostbuf *h, size_t n, VkDeviceSize align, const char *what)
{
    if (n > h->bytes) {
        dsv4_vk_fault(v, "%zu bytes of %s in one piece: more than its %llu", n, what, (unsigned long long)h->bytes);
        return -1;
    }
    if (!dsv4_vk_record(v)) return -1;
    VkDeviceSize at = (h->used + align - 1) / align * align;
    if (at + n > h->bytes) {
        dsv4_vk_finish(v);
        if (!dsv4_vk_record(v)) return -1;
        at = 0;
    }
    h->used = at + n;
    return (int64_t)at;
}

bool dsv4_vk_meta_room(struct dsv4_vk *v, size_t bytes)
{
    if (!dsv4_vk_record(v)) return false;
    const struct vk_hostbuf *h = &v->meta[v->cur_meta];
    if (h->used + bytes + 64 * 8 <= h->bytes || v->cur_meta + 1 < VKB_MAX_META) return true;
    dsv4_vk_finish(v); /* every area taken: before the op takes any */
    return dsv4_vk_record(v);
}

/* The metadata area with room for n bytes: the current one, else the next (made now, the first
 * time a command buffer needs that many), else (all taken) a new command buffer. */
static struct vk_hostbuf *meta_area(struct dsv4_vk *v, size_t n, VkDeviceSize align)
{
    struct vk_hostbuf *h = &v->meta[v->cur_meta];
    if ((h->used + align - 1) / align * align + n <= h->bytes) return h;
    if (v->cur_meta + 1 == VKB_MAX_META) return h; /* area_take submits and starts over */
    if (v->cur_meta + 1 == v->n_meta) {
        if (dsv4_vk_hostbuf(v, &v->meta[v->n_meta], v->meta[0].bytes, VK_BUFFER_USAGE_STORAGE_BUFFER_BIT)) return h;
        dsv4_log(v->lg, DSV4_LOG_INFO, "vulkan: metadata area %d of a command buffer", v->n_meta + 1);
        v->n_meta++;
    }
    h       = &v->meta[++v->cur_meta];
    h->used = 0;
    return h;
}

void *dsv4_vk_meta(struct dsv4_vk *v, size_t bytes, struct vk_bind *b, VkDeviceAddress *a)
{
    VkDeviceSize align = v->sb_align > 16 ? v->sb_align : 16;
    size_t       n     = bytes ? bytes : 4;
    if (!dsv4_vk_record(v)) return NULL;
    struct vk_hostbuf *h  = meta_area(v, n, align);
    int64_t            at = area_take(v, h, n, align, "host metadata");
    if (at < 0) return NULL;
    h  = &v->meta[v->cur_meta]; /* area_take may have started over at the first */
    *b = (struct vk_bind){ h->buf, (VkDeviceSize)at, n };
    if (a) *a = h->dva + (VkDeviceSize)at;
    return (uint8_t *)h->map + at;
}

/* The buffer and offset of [p, p + bytes), which must lie in one block; NULL (and a fault)
 * otherwise. */
static const struct vk_block *span(struct dsv4_vk *v, const void *p, size_t bytes, VkDeviceSize *off,
                                   const char *what)
{
    const struct vk_block *b = dsv4_vk_resolve(v, p, off);
    if (!b || *off + bytes > b->len) {
        dsv4_vk_fault(v, "%s of %zu bytes at %p: not inside one of its buffers", what, bytes, p);
        return NULL;
    }
    return b;
}

/* Moves bytes between host memory and [off, off + bytes) of block b through the staging
 * area, a piece at a time: to the device (recorded in the open command buffer, in order with
 * the ops) or from it (submitted and waited for, then copied out). */
static void transfer(struct dsv4_vk *v, const struct vk_block *b, VkDeviceSize off, uint8_t *host, size_t bytes,
                     bool to_device)
{
    for (size_t done = 0; done < bytes;) {
        size_t left = bytes - done, room = (size_t)(v->staging.bytes - v->staging.used);
        if (!v->recording || room < 64) room = (size_t)v->staging.bytes;
        size_t  n  = left < room ? left : room;
        int64_t at = area_take(v, &v->staging, n, 16, "staging");
        if (at < 0) return;
        if (to_device) memcpy((uint8_t *)v->staging.map + at, host + done, n);
        VkBufferCopy c = { to_device ? (VkDeviceSize)at : off + done, to_device ? off + done : (VkDeviceSize)at, n };
        dsv4_alloc_guard_exempt(true);
        vkCmdCopyBuffer(v->cmd, to_device ? v->staging.buf : b->buf, to_device ? b->buf : v->staging.buf, 1, &c);
        dsv4_alloc_guard_exempt(false);
        dsv4_vk_barrier(v);
        dsv4_vk_stamp(v, to_device ? "upload" : "download");
        if (!to_device) {
            dsv4_vk_finish(v);
            memcpy(host + done, (uint8_t *)v->staging.map + at, n);
        }
        done += n;
    }
}

/* upload and download: the block behind the device address, then transfer */
static void host_move(void *impl, const void *dev, uint8_t *host, size_t bytes, bool to_device)
{
    struct dsv4_vk *v = impl;
    if (!bytes) return;
    pthread_mutex_lock(&v->mu);
    VkDeviceSize           off;
    const struct vk_block *b = span(v, dev, bytes, &off, to_device ? "upload" : "download");
    if (b) transfer(v, b, off, host, bytes, to_device);
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_upload(void *impl, void *dst, const void *src, size_t bytes)
{
    host_move(impl, dst, (uint8_t *)src, bytes, true); /* src is only read */
}

void dsv4_vk_download(void *impl, void *dst, const void *src, size_t bytes)
{
    host_move(impl, src, dst, bytes, false);
}

void dsv4_vk_copy(void *impl, void *dst, const void *src, size_t bytes)
{
    struct dsv4_vk *v = impl;
    if (!bytes || dst == src) return;
    pthread_mutex_lock(&v->mu);
    VkDeviceSize           doff, soff;
    const struct vk_block *d = span(v, dst, bytes, &doff, "copy to"), *s = span(v, src, bytes, &soff, "copy from");
    bool overlap = d && s && d->buf == s->buf && doff < soff + bytes && soff < doff + bytes;
    if (overlap) dsv4_vk_fault(v, "copy of %zu bytes between overlapping ranges of one buffer", bytes);
    if (d && s && !overlap && dsv4_vk_record(v)) {
        VkBufferCopy c = { soff, doff, bytes };
        dsv4_alloc_guard_exempt(true);
        vkCmdCopyBuffer(v->cmd, s->buf, d->buf, 1, &c);
        dsv4_alloc_guard_exempt(false);
        dsv4_vk_barrier(v);
        dsv4_vk_stamp(v, "copy");
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_sync(void *impl)
{
    struct dsv4_vk *v = impl;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_finish(v);
    pthread_mutex_unlock(&v->mu);
}
