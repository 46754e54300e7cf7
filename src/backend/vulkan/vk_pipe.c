/*
 * vk_pipe.c - one compute pipeline per shader, found by the shader's name and made at its
 * first dispatch from the SPIR-V the build embedded (vk_shaders.c), with a descriptor set
 * layout of n storage buffers (the op's bindings) and push constants for the scalars (at
 * most VKB_PC_BYTES).
 *
 * Each dispatch takes a fresh descriptor set from the pool, which is reset when a command
 * buffer opens (vk_cmd.c): a set written for one dispatch stays as it was while the command
 * buffer runs. When the pool is used up, the command buffer is submitted and a new one
 * opened. Made lazily, so a backend created only to list devices or to move memory compiles
 * none.
 */
#include <string.h>

#include "backend/vulkan/vk.h"

static const struct dsv4_vk_spirv *find_shader(const char *name)
{
    for (const struct dsv4_vk_spirv *s = dsv4_vk_shaders; s->name; s++)
        if (!strcmp(s->name, name)) return s;
    return NULL;
}

static bool make_layouts(struct dsv4_vk *v, struct vk_pipe *p, int n_bind)
{
    VkDescriptorSetLayoutBinding b[VKB_MAX_BINDINGS];
    for (int i = 0; i < n_bind; i++)
        b[i] = (VkDescriptorSetLayoutBinding){ .binding = (uint32_t)i, .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                               .descriptorCount = 1, .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT };
    VkDescriptorSetLayoutCreateInfo dci = { .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                            .bindingCount = (uint32_t)n_bind, .pBindings = b };
    if (vkCreateDescriptorSetLayout(v->dev, &dci, NULL, &p->dsl) != VK_SUCCESS) return false;
    VkPushConstantRange        pcr = { VK_SHADER_STAGE_COMPUTE_BIT, 0, VKB_PC_BYTES };
    VkPipelineLayoutCreateInfo lci = { .sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, .setLayoutCount = 1,
                                       .pSetLayouts = &p->dsl, .pushConstantRangeCount = 1, .pPushConstantRanges = &pcr };
    return vkCreatePipelineLayout(v->dev, &lci, NULL, &p->layout) == VK_SUCCESS;
}

static bool make_pipe(struct dsv4_vk *v, struct vk_pipe *p)
{
    const struct dsv4_vk_spirv *s = find_shader(p->shader);
    if (!s) {
        dsv4_vk_fault(v, "the build embeds no shader '%s'", p->shader);
        return false;
    }
    if (!make_layouts(v, p, p->n_bind)) {
        dsv4_vk_fault(v, "cannot make the layouts of shader '%s'", s->name);
        return false;
    }
    VkShaderModuleCreateInfo mci = { .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = s->bytes,
                                     .pCode = s->code };
    VkShaderModule           mod;
    if (vkCreateShaderModule(v->dev, &mci, NULL, &mod) != VK_SUCCESS) {
        dsv4_vk_fault(v, "the device refuses shader '%s'", s->name);
        return false;
    }
    /* constant 0: the invocations a projection's row is split over (lin_gemm.glsl); a shader
     * that declares no such constant ignores it */
    VkSpecializationMapEntry    me  = { 0, 0, sizeof(uint32_t) };
    VkSpecializationInfo        si  = { 1, &me, sizeof(uint32_t), &v->lin_nt };
    VkComputePipelineCreateInfo pci = {
        .sType  = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage  = { .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                    .module = mod, .pName = "main", .pSpecializationInfo = &si },
        .layout = p->layout,
    };
    VkResult r = vkCreateComputePipelines(v->dev, VK_NULL_HANDLE, 1, &pci, NULL, &p->pipe);
    vkDestroyShaderModule(v->dev, mod, NULL);
    if (r != VK_SUCCESS) {
        p->pipe = VK_NULL_HANDLE;
        dsv4_vk_fault(v, "cannot make the pipeline of shader '%s' (%d)", s->name, (int)r);
        return false;
    }
    return true;
}

/* The pipeline of shader (made now if this is its first use), or NULL (and a fault). */
static struct vk_pipe *pipe_of(struct dsv4_vk *v, const char *shader, int n_bind)
{
    for (int i = 0; i < v->n_pipes; i++)
        if (!strcmp(v->pipes[i].shader, shader)) {
            if (v->pipes[i].n_bind != n_bind) {
                dsv4_vk_fault(v, "shader '%s' dispatched with %d bindings, made with %d", shader, n_bind,
                              v->pipes[i].n_bind);
                return NULL;
            }
            return v->pipes[i].pipe ? &v->pipes[i] : NULL;
        }
    if (v->n_pipes == VKB_MAX_PIPES) {
        dsv4_vk_fault(v, "more than %d shaders", VKB_MAX_PIPES);
        return NULL;
    }
    struct vk_pipe *p = &v->pipes[v->n_pipes++];
    *p                = (struct vk_pipe){ .shader = shader, .n_bind = n_bind };
    return make_pipe(v, p) ? p : NULL;
}

/* A descriptor set of p's layout from the open command buffer's pools: the next pool (made
 * the first time a command buffer needs it) when one is used up, and only past
 * VKB_MAX_POOLS a new command buffer (an op's metadata must not move under it: vk.h). */
static VkDescriptorSet take_set(struct dsv4_vk *v, const struct vk_pipe *p)
{
    if (!dsv4_vk_record(v)) return VK_NULL_HANDLE;
    if (v->n_sets == VKB_MAX_SETS) {
        if (v->cur_pool + 1 == v->n_pools && dsv4_vk_pool_add(v) == DSV4_OK)
            dsv4_log(v->lg, DSV4_LOG_INFO, "vulkan: descriptor pool %d of a command buffer", v->n_pools);
        if (v->cur_pool + 1 < v->n_pools) {
            v->cur_pool++;
        } else {
            dsv4_vk_finish(v);
            if (!dsv4_vk_record(v)) return VK_NULL_HANDLE;
        }
        v->n_sets = 0;
    }
    VkDescriptorSetAllocateInfo ai = { .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                       .descriptorPool = v->dpools[v->cur_pool], .descriptorSetCount = 1,
                                       .pSetLayouts = &p->dsl };
    VkDescriptorSet set = VK_NULL_HANDLE;
    if (vkAllocateDescriptorSets(v->dev, &ai, &set) != VK_SUCCESS) {
        dsv4_vk_fault(v, "cannot allocate a descriptor set");
        return VK_NULL_HANDLE;
    }
    v->n_sets++;
    return set;
}

static bool dispatch_driver(struct dsv4_vk *v, const char *shader, const struct vk_bind *b, int n_bind, const void *pc,
                      uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz)
{
    DSV4_ASSERT(n_bind >= 0 && n_bind <= VKB_MAX_BINDINGS && pc_bytes <= VKB_PC_BYTES);
    struct vk_pipe *p = pipe_of(v, shader, n_bind);
    if (!p) return false;
    VkDescriptorSet set = take_set(v, p);
    if (!set) return false;
    VkDescriptorBufferInfo bi[VKB_MAX_BINDINGS];
    VkWriteDescriptorSet   w[VKB_MAX_BINDINGS];
    for (int i = 0; i < n_bind; i++) {
        bi[i] = (VkDescriptorBufferInfo){ b[i].buf, b[i].off, b[i].range ? b[i].range : VK_WHOLE_SIZE };
        w[i]  = (VkWriteDescriptorSet){ .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set,
                                        .dstBinding = (uint32_t)i, .descriptorCount = 1,
                                        .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i] };
    }
    if (n_bind) vkUpdateDescriptorSets(v->dev, (uint32_t)n_bind, w, 0, NULL);
    vkCmdBindPipeline(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    if (n_bind) vkCmdBindDescriptorSets(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &set, 0, NULL);
    if (pc_bytes) vkCmdPushConstants(v->cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_bytes, pc);
    vkCmdDispatch(v->cmd, gx ? gx : 1, gy ? gy : 1, gz ? gz : 1);
    dsv4_vk_barrier(v);
    dsv4_vk_stamp(v, p->shader);
    return true;
}

/* The driver's calls, its host allocations exempt from the token-evaluation guard. */
bool dsv4_vk_dispatch(struct dsv4_vk *v, const char *shader, const struct vk_bind *b, int n_bind, const void *pc,
                      uint32_t pc_bytes, uint32_t gx, uint32_t gy, uint32_t gz)
{
    dsv4_alloc_guard_exempt(true);
    bool ok = dispatch_driver(v, shader, b, n_bind, pc, pc_bytes, gx, gy, gz);
    dsv4_alloc_guard_exempt(false);
    return ok;
}

void dsv4_vk_pipes_free(struct dsv4_vk *v)
{
    for (int i = 0; i < v->n_pipes; i++) {
        struct vk_pipe *p = &v->pipes[i];
        if (p->pipe) vkDestroyPipeline(v->dev, p->pipe, NULL);
        if (p->layout) vkDestroyPipelineLayout(v->dev, p->layout, NULL);
        if (p->dsl) vkDestroyDescriptorSetLayout(v->dev, p->dsl, NULL);
        memset(p, 0, sizeof(*p)); /* the sets go with the pool */
    }
    v->n_pipes = 0;
}
