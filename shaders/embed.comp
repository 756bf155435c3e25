#version 450
// Embedding lookup: out[r, :] = table[tokens[r] - row0, :] for tokens inside
// this table chunk [row0, row0 + table_rows); other rows are not touched.
// One invocation per output element.
#define WEIGHT_COUNT (pc.table_rows * pc.D)  // elements of the table (block types)
#include "common.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Tokens { uint tokens[]; };
layout(std430, set = 0, binding = 1) readonly buffer Table { uint table[]; };
layout(std430, set = 0, binding = 2) buffer Out { float outv[]; };
layout(push_constant) uniform Push { uint row0, table_rows, D, R; } pc;

uint table_word(uint i) { return table[i]; }

void main() {
    uint count = pc.R * pc.D;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint r = i / pc.D, d = i - r * pc.D;
        uint tok = tokens[r];
        if (tok < pc.row0 || tok - pc.row0 >= pc.table_rows) continue;
        uint e = (tok - pc.row0) * pc.D + d;
        outv[i] = DECODE_ELEMENT(table_word, e);
    }
}
