#version 450
// Embedding backward, deterministic (no atomics): for each distinct token u of
// the batch and column d,
//   dtable[tok - row0, d] += dout[row_0, d]; += dout[row_1, d]; ...
// adding its rows one by one in increasing row order (exactly a sequential
// f32 loop over r = 0..R-1), for tokens inside this table chunk
// [row0, row0 + table_rows); other table rows are not touched.
// The host builds the index (vks_op_embed_backward_index), 3R + 1 words:
//   [0, R)          tok[u]    distinct tokens, increasing (u < U)
//   [R, 2R + 1)     start[u]  rows of token u are row[start[u] .. start[u+1])
//   [2R + 1, 3R + 1) row[i]   dout rows, grouped by token, increasing within
// One invocation per (u, d); out-of-range entries are skipped, never followed.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Index { uint idx[]; };
layout(std430, set = 0, binding = 1) readonly buffer Dout { float dout[]; };
layout(std430, set = 0, binding = 2) buffer Table { float dtable[]; };
layout(push_constant) uniform Push { uint U, R, D, row0, table_rows; } pc;

void main() {
    uint count = pc.U * pc.D;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint u = i / pc.D, d = i - u * pc.D;
        uint tok = idx[u];
        if (tok < pc.row0 || tok - pc.row0 >= pc.table_rows) continue;
        uint first = idx[pc.R + u], last = min(idx[pc.R + u + 1u], pc.R);
        uint o = (tok - pc.row0) * pc.D + d;
        float acc = dtable[o];
        for (uint k = first; k < last; k++) {
            uint r = idx[2u * pc.R + 1u + k];
            if (r < pc.R) acc += dout[r * pc.D + d];
        }
        dtable[o] = acc;
    }
}
