/*
 * vk_ops.c - the Vulkan backend's op table: the ops written so far as compute shaders
 * (shaders/NAME.comp; none yet), the others NULL. A NULL entry is an op this backend does not run: the op
 * checker reports it `missing` and engine open refuses the backend, naming it (no op falls
 * back to the CPU).
 *
 * Each op resolves its addresses to (buffer, offset) in the block table (vk_mem.c), binds
 * each buffer from its offset rounded down to minStorageBufferOffsetAlignment and passes the
 * rest as an element index in the push constants; host metadata (token ids) goes through
 * the mapped metadata buffer. Then one dispatch, submitted without waiting: sync or the next
 * download waits.
 */
#include "backend/vulkan/vk.h"

const struct dsv4_backend_ops dsv4_vk_ops = {
    .name = "vulkan",
};
