#version 450
// Elementwise ops on f32 vectors, one invocation per element (grid-stride).
//   OP_SWIGLU: out = silu(a) * b   (out may alias a)
//   OP_ADD:    a += b
//   OP_SCALE:  a *= s  (one f32 product per element, s a push constant)
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer A { float a[]; };
#ifndef OP_SCALE
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
#endif
#ifdef OP_SWIGLU
layout(std430, set = 0, binding = 2) buffer Out { float outv[]; };
#endif
#ifdef OP_SCALE
layout(push_constant) uniform Push { uint n; float s; } pc;
#else
layout(push_constant) uniform Push { uint n; } pc;
#endif

void main() {
    for (uint i = linear_invocation_id(); i < pc.n; i += total_invocations()) {
#ifdef OP_SWIGLU
        float g = a[i];
        outv[i] = g / (1.0 + exp(-g)) * b[i];
#elif defined(OP_SCALE)
        a[i] *= pc.s;
#else
        a[i] += b[i];
#endif
    }
}
