#version 450
// Test kernel (test_gpu): what each invocation sees of its subgroup, to check
// that a pipeline created with a required subgroup size runs at that size.
// out[4 i ..]: gl_SubgroupSize, real lanes (subgroupAdd(1u)), gl_NumSubgroups,
// gl_SubgroupID.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) writeonly buffer Out { uint outv[]; };

void main() {
    uint i = linear_invocation_id();
    uint lanes = subgroupAdd(1u);
    outv[4 * i + 0] = gl_SubgroupSize;
    outv[4 * i + 1] = lanes;
    outv[4 * i + 2] = gl_NumSubgroups;
    outv[4 * i + 3] = gl_SubgroupID;
}
