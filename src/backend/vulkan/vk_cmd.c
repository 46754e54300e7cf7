/*
 * vk_cmd.c - recording and submitting on the compute queue, and the memory half's
 * transfers: upload and download through the mapped staging buffer, copy between buffers,
 * sync on the fence.
 *
 * At most one submission is in flight (vk.h): begin waits for it, so everything a
 * submission reads (command buffer, descriptor sets, staging and metadata buffers) is free
 * to reuse once begin returns. Each command buffer opens with a global barrier (every
 * earlier command's writes before any of this one's reads and writes: the queue may overlap
 * submissions otherwise) and ends with one that makes device writes visible to the host.
 *
 * The table's ops and transfers return nothing, so an error here (an address that is not
 * the backend's, a lost device) is recorded once in v->fault and logged; the op or transfer
 * does nothing, and the outputs the caller reads are then wrong, which the op checker shows.
 */
#include <stdarg.h>
#include <stdio.h>
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

void dsv4_vk_wait(struct dsv4_vk *v)
{
    if (!v->pending) return;
    if (vkWaitForFences(v->dev, 1, &v->fence, VK_TRUE, UINT64_MAX) != VK_SUCCESS)
        dsv4_vk_fault(v, "waiting for the queue failed (device lost?)");
    vkResetFences(v->dev, 1, &v->fence);
    v->pending = false;
}

static void barrier(struct dsv4_vk *v, VkPipelineStageFlags dst_stage, VkAccessFlags dst_access)
{
    VkMemoryBarrier mb = { .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT,
                           .dstAccessMask = dst_access };
    vkCmdPipelineBarrier(v->cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, dst_stage, 0, 1, &mb, 0, NULL, 0, NULL);
}

bool dsv4_vk_begin(struct dsv4_vk *v)
{
    dsv4_vk_wait(v);
    VkCommandBufferBeginInfo bi = { .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                    .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT };
    if (vkResetCommandBuffer(v->cmd, 0) != VK_SUCCESS || vkBeginCommandBuffer(v->cmd, &bi) != VK_SUCCESS) {
        dsv4_vk_fault(v, "cannot record a command buffer");
        return false;
    }
    v->recording = true;
    barrier(v, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT);
    return true;
}

void dsv4_vk_submit(struct dsv4_vk *v)
{
    if (!v->recording) return;
    barrier(v, VK_PIPELINE_STAGE_HOST_BIT, VK_ACCESS_HOST_READ_BIT);
    v->recording = false;
    VkSubmitInfo si = { .sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &v->cmd };
    if (vkEndCommandBuffer(v->cmd) != VK_SUCCESS || vkQueueSubmit(v->queue, 1, &si, v->fence) != VK_SUCCESS) {
        dsv4_vk_fault(v, "cannot submit to the compute queue");
        return;
    }
    v->pending = true;
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

/* Moves bytes between host memory and [off, off + bytes) of block b, through the staging
 * buffer a chunk at a time: to the device (upload, not waited for) or from it (download,
 * waited for, then copied out). */
static void transfer(struct dsv4_vk *v, const struct vk_block *b, VkDeviceSize off, uint8_t *host, size_t bytes,
                     bool to_device)
{
    for (size_t done = 0; done < bytes;) {
        size_t n = bytes - done < v->staging.bytes ? bytes - done : (size_t)v->staging.bytes;
        if (!dsv4_vk_begin(v)) return; /* waits: the staging buffer is free */
        if (to_device) memcpy(v->staging.map, host + done, n);
        VkBufferCopy c = { to_device ? 0 : off + done, to_device ? off + done : 0, n };
        vkCmdCopyBuffer(v->cmd, to_device ? v->staging.buf : b->buf, to_device ? b->buf : v->staging.buf, 1, &c);
        dsv4_vk_submit(v);
        if (!to_device) {
            dsv4_vk_wait(v);
            memcpy(host + done, v->staging.map, n);
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
    if (d && s && !overlap && dsv4_vk_begin(v)) {
        VkBufferCopy c = { soff, doff, bytes };
        vkCmdCopyBuffer(v->cmd, s->buf, d->buf, 1, &c);
        dsv4_vk_submit(v);
    }
    pthread_mutex_unlock(&v->mu);
}

void dsv4_vk_sync(void *impl)
{
    struct dsv4_vk *v = impl;
    pthread_mutex_lock(&v->mu);
    dsv4_vk_wait(v);
    pthread_mutex_unlock(&v->mu);
}
