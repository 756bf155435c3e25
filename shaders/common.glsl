// common.glsl: helpers shared by every kernel (included by glslc).

// Workgroup size x: the same specialization constant (id 0) as the
// shader's local_size_x_id = 0. Use this, never gl_WorkGroupSize.x: glslang's
// optimizer folds gl_WorkGroupSize.x to its default value (1).
layout(constant_id = 0) const uint WG_SIZE = 64;
// Grids larger than maxComputeWorkGroupCount[0] are folded into y and z by
// the ops layer; kernels always work with the linear workgroup index and
// bounds-check it, so surplus workgroups simply do nothing.
uint linear_group_id() {
    return gl_WorkGroupID.x +
           gl_NumWorkGroups.x * (gl_WorkGroupID.y + gl_NumWorkGroups.y * gl_WorkGroupID.z);
}

uint linear_invocation_id() {
    return linear_group_id() * WG_SIZE + gl_LocalInvocationID.x;
}

// Total invocations of the dispatch, for grid-stride loops.
uint total_invocations() {
    return gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_NumWorkGroups.z * WG_SIZE;
}
