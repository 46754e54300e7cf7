/*
 * vk_pipe.c - one compute pipeline per shader: made at its first dispatch from the SPIR-V
 * the build embedded (vk_shaders.c), with a descriptor set of storage buffers (one per
 * address the op takes) and push constants for the scalars (at most VKB_PC_BYTES).
 *
 * Each pipeline has one descriptor set, rewritten before each dispatch: at most one
 * submission is in flight and recording waits for it (vk.h), so no set is in use then.
 * Made lazily, so a backend created only to list devices or to move memory compiles none.
 */
#include <string.h>

#include "backend/vulkan/vk.h"

enum { VKB_PC_BYTES = 64 };

static const struct {
    const char *shader;
    int         n_bind;
} PIPES[VKB_PIPE_COUNT] = {
    [VKB_PIPE_SCALE] = { "scale", 1 },
    [VKB_PIPE_ADD_STREAMS] = { "add_streams", 2 },
    [VKB_PIPE_EMBED] = { "embed", 3 },
    [VKB_PIPE_RMSNORM] = { "rmsnorm", 3 },
};

const char *dsv4_vk_pipe_shader(enum vk_pipe_id id)
{
    return PIPES[id].shader;
}

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
    if (vkCreatePipelineLayout(v->dev, &lci, NULL, &p->layout) != VK_SUCCESS) return false;
    VkDescriptorSetAllocateInfo ai = { .sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                       .descriptorPool = v->dpool, .descriptorSetCount = 1, .pSetLayouts = &p->dsl };
    return vkAllocateDescriptorSets(v->dev, &ai, &p->set) == VK_SUCCESS;
}

static bool make_pipe(struct dsv4_vk *v, enum vk_pipe_id id)
{
    struct vk_pipe             *p = &v->pipes[id];
    const struct dsv4_vk_spirv *s = find_shader(PIPES[id].shader);
    if (!s) {
        dsv4_vk_fault(v, "the build embeds no shader '%s'", PIPES[id].shader);
        return false;
    }
    if (!make_layouts(v, p, PIPES[id].n_bind)) {
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
    VkComputePipelineCreateInfo pci = {
        .sType  = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage  = { .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                    .module = mod, .pName = "main" },
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

bool dsv4_vk_dispatch(struct dsv4_vk *v, enum vk_pipe_id id, const struct vk_bind *b, int n_bind, const void *pc,
                      uint32_t pc_bytes, uint32_t groups)
{
    struct vk_pipe *p = &v->pipes[id];
    if (!p->pipe && !make_pipe(v, id)) return false;
    DSV4_ASSERT(n_bind == PIPES[id].n_bind && pc_bytes <= VKB_PC_BYTES);
    VkDescriptorBufferInfo bi[VKB_MAX_BINDINGS];
    VkWriteDescriptorSet   w[VKB_MAX_BINDINGS];
    for (int i = 0; i < n_bind; i++) {
        bi[i] = (VkDescriptorBufferInfo){ b[i].buf, b[i].off, VK_WHOLE_SIZE };
        w[i]  = (VkWriteDescriptorSet){ .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = p->set,
                                        .dstBinding = (uint32_t)i, .descriptorCount = 1,
                                        .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, .pBufferInfo = &bi[i] };
    }
    vkUpdateDescriptorSets(v->dev, (uint32_t)n_bind, w, 0, NULL);
    vkCmdBindPipeline(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipe);
    vkCmdBindDescriptorSets(v->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1, &p->set, 0, NULL);
    vkCmdPushConstants(v->cmd, p->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pc_bytes, pc);
    vkCmdDispatch(v->cmd, groups, 1, 1);
    return true;
}

void dsv4_vk_pipes_free(struct dsv4_vk *v)
{
    for (int i = 0; i < VKB_PIPE_COUNT; i++) {
        struct vk_pipe *p = &v->pipes[i];
        if (p->pipe) vkDestroyPipeline(v->dev, p->pipe, NULL);
        if (p->layout) vkDestroyPipelineLayout(v->dev, p->layout, NULL);
        if (p->dsl) vkDestroyDescriptorSetLayout(v->dev, p->dsl, NULL);
        memset(p, 0, sizeof(*p)); /* the sets go with the pool */
    }
}
