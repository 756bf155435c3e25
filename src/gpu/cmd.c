/* Command recording: one command buffer per forward pass, many dispatches,
 * one submit. Descriptor sets come from per-command pools freed at submit.
 * A recording that fills its pools is submitted and continues in a fresh
 * command buffer (flush_and_continue), so the number of dispatches of one
 * vks_cmd has no limit; a reusable recording (kept for vks_cmd_run) grows
 * its pool list instead. With profiling on, each dispatch is bracketed by
 * timestamp queries. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gpu/gpu_internal.h"

static int begin_reusable_cb(vks_gpu *g, VkCommandBuffer *out) {
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = g->pool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                      .commandBufferCount = 1};
    VkResult r = vkAllocateCommandBuffers(g->dev, &ai, out);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(*out, &bi);
    return VKS_OK;
}

static int cmd_begin(vks_gpu *g, bool reusable, vks_cmd **out) {
    if (!g || !out) return vks_set_error(VKS_ERR_ARG, "vks_cmd_begin: NULL argument");
    vks_cmd *c = calloc(1, sizeof *c);
    if (!c) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    c->gpu = g;
    c->reusable = reusable;
    int rc = reusable ? begin_reusable_cb(g, &c->cb) : vks_gpu_oneshot_begin(g, &c->cb);
    if (rc) { free(c); return rc; }
    if (g->profile) vkCmdResetQueryPool(c->cb, g->query_pool, 0, VKS_MAX_TIMESTAMPS);
    *out = c;
    return VKS_OK;
}

int vks_cmd_begin(vks_gpu *g, vks_cmd **out) { return cmd_begin(g, false, out); }
int vks_cmd_begin_reusable(vks_gpu *g, vks_cmd **out) { return cmd_begin(g, true, out); }

static int new_descriptor_pool(vks_cmd *c) {
    if (c->n_pools == c->cap_pools) {
        int cap = c->cap_pools ? 2 * c->cap_pools : 4;
        VkDescriptorPool *p = realloc(c->pools, sizeof *p * (size_t)cap);
        if (!p) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        c->pools = p;
        c->cap_pools = cap;
    }
    VkDescriptorPoolSize size = {.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                 .descriptorCount = VKS_SETS_PER_POOL * VKS_MAX_BINDINGS};
    VkDescriptorPoolCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                     .maxSets = VKS_SETS_PER_POOL, .poolSizeCount = 1, .pPoolSizes = &size};
    VkResult r = vkCreateDescriptorPool(c->gpu->dev, &ci, NULL, &c->pools[c->n_pools]);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkCreateDescriptorPool");
    c->n_pools++;
    c->sets_in_pool = 0;
    return VKS_OK;
}

static void collect_profile(vks_cmd *c);

static void destroy_pools(vks_cmd *c) {
    for (int i = 0; i < c->n_pools; i++) vkDestroyDescriptorPool(c->gpu->dev, c->pools[i], NULL);
    c->n_pools = 0;
    c->sets_in_pool = 0;
}

static void free_cmd(vks_cmd *c) {
    destroy_pools(c);
    free(c->pools);
    free(c);
}

/* Submits what is recorded so far, waits for it and continues in a fresh
 * command buffer with empty pools. The barrier that precedes the next
 * dispatch (n_dispatches stays > 0) orders it after the submitted work. On
 * failure c->cb is VK_NULL_HANDLE and the recording can only be discarded. */
/* The work of a submitted recording is counted as executed. */
static void count_submitted(vks_cmd *c) {
    c->gpu->counters.dispatches += c->unsubmitted.dispatches;
    c->gpu->counters.barriers += c->unsubmitted.barriers;
    c->unsubmitted = (vks_cmd_counts){0};
}

static int flush_and_continue(vks_cmd *c) {
    vks_gpu *g = c->gpu;
    int rc = vks_gpu_oneshot_end(g, c->cb);
    count_submitted(c);
    c->cb = VK_NULL_HANDLE;
    if (rc == VKS_OK) collect_profile(c);
    destroy_pools(c);
    c->n_queries = 0;
    c->n_pending = 0;
    c->after_flush = true; /* the next command's barrier orders it after the submitted work */
    if (rc == VKS_OK) rc = vks_gpu_oneshot_begin(g, &c->cb);
    if (rc) {
        c->cb = VK_NULL_HANDLE;
        return vks_error_prefix(rc, "continuing a full command buffer");
    }
    if (g->profile) vkCmdResetQueryPool(c->cb, g->query_pool, 0, VKS_MAX_TIMESTAMPS);
    return VKS_OK;
}

static int allocate_set(vks_cmd *c, vks_kernel *k, VkDescriptorSet *set) {
    if (!c->reusable && c->n_pools == VKS_MAX_POOLS && c->sets_in_pool == VKS_SETS_PER_POOL) {
        int rc = flush_and_continue(c);
        if (rc) return rc;
    }
    if (c->n_pools == 0 || c->sets_in_pool == VKS_SETS_PER_POOL) {
        int rc = new_descriptor_pool(c);
        if (rc) return rc;
    }
    VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                      .descriptorPool = c->pools[c->n_pools - 1], .descriptorSetCount = 1,
                                      .pSetLayouts = &k->set_layout};
    VkResult r = vkAllocateDescriptorSets(c->gpu->dev, &ai, set);
    if (r != VK_SUCCESS) return vks_vk_error(r, "vkAllocateDescriptorSets");
    c->sets_in_pool++;
    return VKS_OK;
}

static int check_binding(const vks_gpu *g, const vks_binding *b, int i, const char *label) {
    size_t range = b->range ? b->range : (b->buf ? b->buf->size - (b->offset < b->buf->size ? b->offset : b->buf->size) : 0);
    size_t end;
    if (!b->buf || b->offset >= b->buf->size || !vks_add_size(b->offset, range, &end) || end > b->buf->size ||
        range == 0 || range > g->info.max_storage_range || b->offset % g->info.min_storage_align)
        return vks_set_error(VKS_ERR_ARG, "%s: binding %d out of range (offset %zu, range %zu, buffer %zu)",
                             label, i, b->offset, range, b->buf ? b->buf->size : 0);
    return VKS_OK;
}

void vks_cmd_barrier(vks_cmd *c) {
    if (!c || !c->cb || c->ended) return;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                                           VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT,
                          .dstAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT |
                                           VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT};
    VkPipelineStageFlags stages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    vkCmdPipelineBarrier(c->cb, stages, stages, 0, 1, &mb, 0, NULL, 0, NULL);
    c->counts.barriers++;
    c->unsubmitted.barriers++;
    c->n_pending = 0;
    c->after_flush = false;
}

typedef struct { VkBuffer buf; size_t lo, hi; bool written; } access;

static access binding_access(const vks_binding *b, bool written) {
    size_t range = b->range ? b->range : b->buf->size - b->offset;
    return (access){b->buf->buf, b->offset, b->offset + range, written};
}

/* Records a barrier when one of the accesses depends on a pending one
 * (read after write, write after read or write), then makes them pending. */
static void order_accesses(vks_cmd *c, const access *a, int n) {
    bool wait = c->after_flush || c->n_pending + n > VKS_MAX_PENDING;
    for (int i = 0; i < n && !wait; i++)
        for (int j = 0; j < c->n_pending && !wait; j++)
            wait = c->pending[j].buf == a[i].buf && a[i].lo < c->pending[j].hi && c->pending[j].lo < a[i].hi &&
                   (a[i].written || c->pending[j].written);
    if (wait) vks_cmd_barrier(c);
    for (int i = 0; i < n; i++) {
        c->pending[c->n_pending].buf = a[i].buf;
        c->pending[c->n_pending].lo = a[i].lo;
        c->pending[c->n_pending].hi = a[i].hi;
        c->pending[c->n_pending].written = a[i].written;
        c->n_pending++;
    }
}

/* Makes the downloads recorded so far visible to the host after the wait. */
static void host_barrier(vks_cmd *c) {
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    vkCmdPipelineBarrier(c->cb, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0,
                         NULL);
    c->counts.barriers++;
    c->unsubmitted.barriers++;
    c->host_reads = false;
}

static void write_descriptors(vks_cmd *c, VkDescriptorSet set, const vks_binding *b, int n) {
    VkDescriptorBufferInfo infos[VKS_MAX_BINDINGS];
    VkWriteDescriptorSet writes[VKS_MAX_BINDINGS];
    for (int i = 0; i < n; i++) {
        infos[i] = (VkDescriptorBufferInfo){.buffer = b[i].buf->buf, .offset = b[i].offset,
                                            .range = b[i].range ? b[i].range : VK_WHOLE_SIZE};
        writes[i] = (VkWriteDescriptorSet){.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, .dstSet = set,
                                           .dstBinding = (uint32_t)i, .descriptorCount = 1,
                                           .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           .pBufferInfo = &infos[i]};
    }
    vkUpdateDescriptorSets(c->gpu->dev, (uint32_t)n, writes, 0, NULL);
    c->counts.descriptor_writes += (uint64_t)n;
    c->gpu->counters.descriptor_writes += (uint64_t)n;
}

int vks_cmd_dispatch(vks_cmd *c, vks_kernel *k, const vks_binding *b, int n_bindings, const void *push,
                     uint32_t push_bytes, uint32_t gx, uint32_t gy, uint32_t gz, const char *label) {
    if (!c || !k || !b || n_bindings != k->n_bindings || push_bytes != k->push_bytes || (push_bytes && !push))
        return vks_set_error(VKS_ERR_ARG, "vks_cmd_dispatch(%s): interface mismatch", k ? k->name : "NULL");
    const vks_device_info *info = &c->gpu->info;
    if (gx == 0 || gy == 0 || gz == 0 || gx > info->max_workgroup_count_x || gy > 65535 || gz > 65535)
        return vks_set_error(VKS_ERR_ARG, "%s: bad dispatch size %ux%ux%u", k->name, gx, gy, gz);
    for (int i = 0; i < n_bindings; i++) {
        int rc = check_binding(c->gpu, &b[i], i, k->name);
        if (rc) return rc;
    }
    if (c->ended || !c->cb) return vks_set_error(VKS_ERR_ARG, "vks_cmd_dispatch(%s): the recording is closed", k->name);
    VkDescriptorSet set;
    int rc = allocate_set(c, k, &set);
    if (rc) return rc;
    write_descriptors(c, set, b, n_bindings);
    access acc[VKS_MAX_BINDINGS];
    for (int i = 0; i < n_bindings; i++) acc[i] = binding_access(&b[i], (k->written >> i) & 1);
    order_accesses(c, acc, n_bindings);
    vkCmdBindPipeline(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->pipeline);
    vkCmdBindDescriptorSets(c->cb, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0, 1, &set, 0, NULL);
    if (push_bytes) vkCmdPushConstants(c->cb, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes, push);
    bool timed = c->gpu->profile && c->n_queries + 2 <= VKS_MAX_TIMESTAMPS;
    if (timed) vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, c->gpu->query_pool, c->n_queries);
    vkCmdDispatch(c->cb, gx, gy, gz);
    if (timed) {
        vkCmdWriteTimestamp(c->cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, c->gpu->query_pool, c->n_queries + 1);
        c->labels[c->n_queries / 2] = label ? label : k->name;
        c->n_queries += 2;
    }
    c->n_dispatches++;
    c->counts.dispatches++;
    c->unsubmitted.dispatches++;
    return VKS_OK;
}

int vks_cmd_copy(vks_cmd *c, vks_buffer *src, size_t src_off, vks_buffer *dst, size_t dst_off, size_t bytes) {
    size_t se, de;
    if (!c || !c->cb || c->ended || !src || !dst || bytes == 0 || !vks_add_size(src_off, bytes, &se) || se > src->size ||
        !vks_add_size(dst_off, bytes, &de) || de > dst->size)
        return vks_set_error(VKS_ERR_ARG, "vks_cmd_copy: out of range");
    vks_cmd_barrier(c);
    VkBufferCopy region = {.srcOffset = src_off, .dstOffset = dst_off, .size = bytes};
    vkCmdCopyBuffer(c->cb, src->buf, dst->buf, 1, &region);
    vks_cmd_barrier(c);
    return VKS_OK;
}

static int check_host_copy(const vks_cmd *c, const vks_host_buffer *h, size_t h_off, const vks_buffer *b,
                           size_t b_off, size_t bytes) {
    size_t he, be;
    if (!c || !c->cb || !h || !b || bytes == 0 || c->ended || !vks_add_size(h_off, bytes, &he) || he > h->s.size ||
        !vks_add_size(b_off, bytes, &be) || be > b->size)
        return vks_set_error(VKS_ERR_ARG, "host copy out of range (%zu bytes at %zu / %zu)", bytes, h_off, b_off);
    return VKS_OK;
}

/* The host's writes before the submit are visible to the copy (the submit
 * orders them); order_accesses puts a barrier between it and the commands
 * it depends on or that depend on it. */
int vks_cmd_upload(vks_cmd *c, vks_host_buffer *src, size_t src_off, vks_buffer *dst, size_t dst_off, size_t bytes) {
    int rc = check_host_copy(c, src, src_off, dst, dst_off, bytes);
    if (rc) return rc;
    order_accesses(c, &(access){dst->buf, dst_off, dst_off + bytes, true}, 1);
    VkBufferCopy region = {.srcOffset = src_off, .dstOffset = dst_off, .size = bytes};
    vkCmdCopyBuffer(c->cb, src->s.buf, dst->buf, 1, &region);
    return VKS_OK;
}

/* Ordered after the commands that write src; the host barrier recorded at
 * the end of the recording makes dst readable after the wait. */
int vks_cmd_download(vks_cmd *c, vks_buffer *src, size_t src_off, vks_host_buffer *dst, size_t dst_off, size_t bytes) {
    int rc = check_host_copy(c, dst, dst_off, src, src_off, bytes);
    if (rc) return rc;
    order_accesses(c, &(access){src->buf, src_off, src_off + bytes, false}, 1);
    VkBufferCopy region = {.srcOffset = src_off, .dstOffset = dst_off, .size = bytes};
    vkCmdCopyBuffer(c->cb, src->buf, dst->s.buf, 1, &region);
    c->host_reads = true;
    return VKS_OK;
}

static void add_profile_sample(vks_gpu *g, const char *label, double ms) {
    for (int i = 0; i < g->n_profile_entries; i++) {
        if (strcmp(g->profile_entries[i].label, label) == 0) {
            g->profile_entries[i].ms += ms;
            g->profile_entries[i].calls++;
            return;
        }
    }
    if (g->n_profile_entries == VKS_MAX_PROFILE_LABELS) return;
    vks_profile_entry *e = &g->profile_entries[g->n_profile_entries++];
    snprintf(e->label, sizeof e->label, "%s", label);
    e->ms = ms;
    e->calls = 1;
}

static void collect_profile(vks_cmd *c) {
    vks_gpu *g = c->gpu;
    if (!g->profile || c->n_queries == 0) return;
    uint64_t *ts = malloc(sizeof(uint64_t) * c->n_queries);
    if (!ts) return;
    VkResult r = vkGetQueryPoolResults(g->dev, g->query_pool, 0, c->n_queries, sizeof(uint64_t) * c->n_queries,
                                       ts, sizeof(uint64_t), VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r == VK_SUCCESS)
        for (uint32_t i = 0; i + 1 < c->n_queries; i += 2) {
            double ms = (double)(ts[i + 1] - ts[i]) * g->info.timestamp_period_ns * 1e-6;
            add_profile_sample(g, c->labels[i / 2], ms);
            g->counters.kernel_ms += ms;
        }
    free(ts);
}

int vks_cmd_submit(vks_cmd *c) {
    if (!c) return vks_set_error(VKS_ERR_ARG, "vks_cmd_submit: NULL");
    if (!c->cb || c->reusable) { /* a failed flush_and_continue already reported why */
        bool reusable = c->reusable;
        vks_cmd_discard(c);
        return vks_set_error(VKS_ERR_ARG, reusable ? "vks_cmd_submit: a reusable recording runs with vks_cmd_run"
                                                   : "vks_cmd_submit: the recording failed earlier");
    }
    if (c->host_reads) host_barrier(c);
    int rc = vks_gpu_oneshot_end(c->gpu, c->cb);
    count_submitted(c);
    if (rc == VKS_OK) collect_profile(c);
    free_cmd(c);
    return rc;
}

/* Closes a reusable recording at its first run; every run counts its work. */
int vks_cmd_run(vks_cmd *c) {
    if (!c || !c->reusable || !c->cb) return vks_set_error(VKS_ERR_ARG, "vks_cmd_run: not a reusable recording");
    if (!c->ended) {
        if (c->host_reads) host_barrier(c);
        VkResult r = vkEndCommandBuffer(c->cb);
        if (r != VK_SUCCESS) return vks_vk_error(r, "vkEndCommandBuffer");
        c->ended = true;
    }
    int rc = vks_gpu_submit_wait(c->gpu, c->cb);
    c->gpu->counters.dispatches += c->counts.dispatches;
    c->gpu->counters.barriers += c->counts.barriers;
    if (rc == VKS_OK) collect_profile(c);
    return rc;
}

void vks_cmd_discard(vks_cmd *c) {
    if (!c) return;
    vks_gpu *g = c->gpu;
    if (c->cb) {
        if (!c->ended) vkEndCommandBuffer(c->cb);
        vkFreeCommandBuffers(g->dev, g->pool, 1, &c->cb);
    }
    free_cmd(c);
}

int vks_gpu_profile(const vks_gpu *g, vks_profile_entry *out, int max) {
    if (!g || !out) return 0;
    int n = g->n_profile_entries < max ? g->n_profile_entries : max;
    memcpy(out, g->profile_entries, sizeof(vks_profile_entry) * (size_t)n);
    return n;
}

void vks_cmd_counts_get(const vks_cmd *c, vks_cmd_counts *out) {
    if (out) *out = c ? c->counts : (vks_cmd_counts){0};
}

void vks_gpu_counters_get(const vks_gpu *g, vks_gpu_counters *out) {
    if (out) *out = g ? g->counters : (vks_gpu_counters){0};
}

void vks_gpu_profile_reset(vks_gpu *g) {
    if (g) g->n_profile_entries = 0;
}
