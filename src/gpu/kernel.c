/* Compute pipelines from embedded SPIR-V plus specialization constants, cached
 * per (name, specialization values). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu_internal.h"
#include "gpu/spirv_table.h"

static const vks_spirv_blob *find_blob(const char *name) {
    for (const vks_spirv_blob *b = vks_spirv_table; b->name; b++)
        if (strcmp(b->name, name) == 0) return b;
    return NULL;
}

static struct vks_kernel *find_cached(vks_gpu *g, const char *name, const uint32_t *spec, int n_spec) {
    for (struct vks_kernel *k = g->kernels; k; k = k->next)
        if (k->n_spec == n_spec && strcmp(k->name, name) == 0 &&
            (n_spec == 0 || memcmp(k->spec, spec, sizeof(uint32_t) * (size_t)n_spec) == 0))
            return k;
    return NULL;
}

static int create_layouts(vks_gpu *g, struct vks_kernel *k) {
    VkDescriptorSetLayoutBinding binds[VKS_MAX_BINDINGS];
    for (int i = 0; i < k->n_bindings; i++)
        binds[i] = (VkDescriptorSetLayoutBinding){.binding = (uint32_t)i,
                                                  .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                  .descriptorCount = 1,
                                                  .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = (uint32_t)k->n_bindings, .pBindings = binds};
    VkResult r = vkCreateDescriptorSetLayout(g->dev, &dci, NULL, &k->set_layout);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateDescriptorSetLayout");
    VkPushConstantRange pcr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .offset = 0, .size = k->push_bytes};
    VkPipelineLayoutCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .setLayoutCount = 1, .pSetLayouts = &k->set_layout,
                                      .pushConstantRangeCount = k->push_bytes ? 1 : 0, .pPushConstantRanges = &pcr};
    r = vkCreatePipelineLayout(g->dev, &pci, NULL, &k->layout);
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkCreatePipelineLayout");
}

/* Where the device allows it (subgroup_required), the kernel runs with the
 * subgroup size it was sized for, and with full subgroups when its workgroup
 * (specialization constant 0, WG_SIZE, default 64) is a whole number of
 * them; a workgroup of more subgroups than the device allows keeps the
 * driver's choice. Returns the stage flags; *required the size or 0. */
static VkPipelineShaderStageCreateFlags subgroup_requirement(const vks_gpu *g, const struct vks_kernel *k,
                                                             uint32_t *required) {
    const vks_device_info *d = &g->info;
    uint32_t s = d->subgroup_required, wg = k->n_spec ? k->spec[0] : 64;
    *required = 0;
    if (!s || (d->max_workgroup_subgroups && wg > s * d->max_workgroup_subgroups)) return 0;
    *required = s;
    return d->full_subgroups && wg % s == 0 ? VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT : 0;
}

static int create_pipeline(vks_gpu *g, struct vks_kernel *k, const vks_spirv_blob *blob) {
    VkShaderModuleCreateInfo mci = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                    .codeSize = blob->bytes, .pCode = blob->code};
    VkResult r = vkCreateShaderModule(g->dev, &mci, NULL, &k->module);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateShaderModule");
    VkSpecializationMapEntry entries[VKS_MAX_SPEC];
    for (int i = 0; i < k->n_spec; i++)
        entries[i] = (VkSpecializationMapEntry){.constantID = (uint32_t)i, .offset = (uint32_t)(4 * i), .size = 4};
    VkSpecializationInfo si = {.mapEntryCount = (uint32_t)k->n_spec, .pMapEntries = entries,
                               .dataSize = 4 * (size_t)k->n_spec, .pData = k->spec};
    uint32_t required;
    VkPipelineShaderStageCreateFlags flags = subgroup_requirement(g, k, &required);
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT rsi = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT,
        .requiredSubgroupSize = required};
    k->subgroup_required = required;
    k->full_subgroups = flags != 0;
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .pNext = required ? &rsi : NULL,
                  .flags = flags, .stage = VK_SHADER_STAGE_COMPUTE_BIT, .module = k->module, .pName = "main",
                  .pSpecializationInfo = k->n_spec ? &si : NULL},
        .layout = k->layout};
    r = vkCreateComputePipelines(g->dev, VK_NULL_HANDLE, 1, &ci, NULL, &k->pipeline);
    return r == VK_SUCCESS ? VKS_OK : vks_vk_error(r, "vkCreateComputePipelines");
}

/* The bindings a module may write: every binding but those whose variables
 * are all NonWritable (GLSL `readonly`), on the variable or on every member
 * of its block. A binding with no variable is neither read nor written; it
 * counts as read. Reads the decorations, variables and pointer/struct types. */
enum { OP_TYPE_STRUCT = 30, OP_TYPE_POINTER = 32, OP_VARIABLE = 59, OP_DECORATE = 71, OP_MEMBER_DECORATE = 72,
       DEC_NON_WRITABLE = 24, DEC_BINDING = 33 };

typedef struct { int32_t binding; uint32_t pointee, type, members, nw_members; bool nw, is_var; } spirv_id;

static uint32_t written_bindings(const uint32_t *code, size_t words) {
    uint32_t all = (1u << VKS_MAX_BINDINGS) - 1;
    if (words < 5 || code[3] == 0 || code[3] > (1u << 22)) return all;
    uint32_t bound = code[3];
    spirv_id *ids = calloc(bound, sizeof *ids);
    if (!ids) return all;
    for (uint32_t i = 0; i < bound; i++) ids[i].binding = -1;
    for (size_t at = 5; at < words;) {
        uint32_t n = code[at] >> 16, op = code[at] & 0xffff;
        if (n == 0 || at + n > words) { free(ids); return all; }
        const uint32_t *w = code + at + 1;
        if (op == OP_DECORATE && n >= 3 && w[0] < bound) {
            if (w[1] == DEC_NON_WRITABLE) ids[w[0]].nw = true;
            if (w[1] == DEC_BINDING && n >= 4) ids[w[0]].binding = (int32_t)w[2];
        } else if (op == OP_MEMBER_DECORATE && n >= 4 && w[0] < bound && w[2] == DEC_NON_WRITABLE) {
            ids[w[0]].nw_members++;
        } else if (op == OP_TYPE_STRUCT && n >= 2 && w[0] < bound) {
            ids[w[0]].members = n - 2;
        } else if (op == OP_TYPE_POINTER && n >= 4 && w[0] < bound) {
            ids[w[0]].pointee = w[2];
        } else if (op == OP_VARIABLE && n >= 4 && w[1] < bound) {
            ids[w[1]].type = w[0];
            ids[w[1]].is_var = true;
        }
        at += n;
    }
    uint32_t written = 0;
    for (uint32_t i = 0; i < bound; i++) {
        const spirv_id *v = &ids[i];
        if (!v->is_var || v->binding < 0) continue;
        if (v->binding >= VKS_MAX_BINDINGS) { written = all; break; }
        uint32_t ptr = v->type < bound ? v->type : 0, block = ids[ptr].pointee < bound ? ids[ptr].pointee : 0;
        bool readonly = v->nw || (block && ids[block].members > 0 && ids[block].nw_members >= ids[block].members);
        if (!readonly) written |= 1u << v->binding;
    }
    free(ids);
    return written;
}

static void destroy_kernel(vks_gpu *g, struct vks_kernel *k) {
    if (k->pipeline) vkDestroyPipeline(g->dev, k->pipeline, NULL);
    if (k->layout) vkDestroyPipelineLayout(g->dev, k->layout, NULL);
    if (k->set_layout) vkDestroyDescriptorSetLayout(g->dev, k->set_layout, NULL);
    if (k->module) vkDestroyShaderModule(g->dev, k->module, NULL);
    free(k);
}

int vks_kernel_get(vks_gpu *g, const char *name, const uint32_t *spec, int n_spec, int n_bindings,
                   uint32_t push_bytes, vks_kernel **out) {
    if (!g || !name || !out || n_spec < 0 || n_spec > VKS_MAX_SPEC || (n_spec && !spec) || n_bindings < 1 ||
        n_bindings > VKS_MAX_BINDINGS || push_bytes > 128 || push_bytes % 4)
        return vks_set_error(VKS_ERR_ARG, "vks_kernel_get(%s): bad arguments", name ? name : "NULL");
    struct vks_kernel *k = find_cached(g, name, spec, n_spec);
    if (k) {
        if (k->n_bindings != n_bindings || k->push_bytes != push_bytes)
            return vks_set_error(VKS_ERR_ARG, "kernel %s requested with a different interface", name);
        *out = k;
        return VKS_OK;
    }
    const vks_spirv_blob *blob = find_blob(name);
    if (!blob) return vks_set_error(VKS_ERR_ARG, "no embedded kernel named %s", name);
    k = calloc(1, sizeof *k);
    if (!k) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    snprintf(k->name, sizeof k->name, "%s", name);
    if (n_spec) memcpy(k->spec, spec, sizeof(uint32_t) * (size_t)n_spec);
    k->n_spec = n_spec;
    k->n_bindings = n_bindings;
    k->push_bytes = push_bytes;
    k->written = written_bindings(blob->code, blob->bytes / 4);
    int rc = create_layouts(g, k);
    if (!rc) rc = create_pipeline(g, k, blob);
    if (rc) { destroy_kernel(g, k); return rc; }
    k->next = g->kernels;
    g->kernels = k;
    *out = k;
    return VKS_OK;
}

uint32_t vks_kernel_subgroup_required(const vks_kernel *k, bool *full) {
    if (full) *full = k && k->full_subgroups;
    return k ? k->subgroup_required : 0;
}

void vks_kernel_cache_destroy(vks_gpu *g) {
    while (g->kernels) {
        struct vks_kernel *k = g->kernels;
        g->kernels = k->next;
        destroy_kernel(g, k);
    }
}
