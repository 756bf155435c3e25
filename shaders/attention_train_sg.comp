#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_ballot : require
// The training attention of attention_train.comp (same bindings, push
// constants, statistics and results within rounding) for CPU drivers:
// barrier-free, one subgroup per workgroup, every lane owning PER query rows
// (forward, dq) or PER keys (dk/dv) whose vectors stay in registers, while
// the other side's rows (keys for the forward and dq, query rows for dk/dv)
// are walked one at a time and reach every lane by subgroup broadcast:
// lanes 0..7 each load a vec4 of the row (quads l, l + 8, ...) and
// subgroupBroadcast with constant lane numbers hands all of them to every
// lane. On lavapipe a load whose address differs per lane is a loop over the
// lanes and a barrier is a coroutine switch; here each walked row costs one
// or two such loads per 32 values of head_dim, feeding 2-4 x head_dim
// multiply-adds in every lane (the tile kernels: ~7-10 per load, 3-4
// barriers per tile).
//   SG_FORWARD: lane = query row; online softmax over the keys in order.
//   SG_DQ:      lane = query row; dq (+)= scale dS K over the keys in order.
//   SG_DKDV:    lane = key; dv (+)= P^T dO and dk (+)= scale dS^T Q over the
//               group's query heads and the rows in order.
// Every sum runs in a fixed order: bit-identical results run to run.
// Needs subgroups of >= 8 lanes and as many as the workgroup (WG_SIZE): the
// ops layer picks these kernels only there; a driver that runs fewer lanes
// gets NaN outputs, never partial ones.
#include "common.glsl"
layout(local_size_x_id = 0) in;
// ceil(head_dim / 4): the register rows' length in vec4s
layout(constant_id = 1) const uint HD4 = 8u;
// head_dim % 4 == 0 and every q, k, v, dout binding 16-byte aligned
layout(constant_id = 2) const bool VEC4 = false;
// query rows (forward, dq) or keys (dk/dv) per lane: 1 or 2
layout(constant_id = 3) const uint PER = 1u;
// vec4s of a broadcast row each of lanes 0..7 loads
const uint QPL = (HD4 + 7u) / 8u;
const float NEG_INF = -1.0 / 0.0;
#define NAN uintBitsToFloat(0x7fc00000u)

layout(push_constant) uniform Push {
    uint T, n_heads, n_kv_heads, head_dim;
    float scale;
    uint flags;  // 1: accumulate into the outputs; 2: starts never decrease
} pc;

uint q_stride() { return pc.n_heads * pc.head_dim; }
uint kv_stride() { return pc.n_kv_heads * pc.head_dim; }

// Elements 4 d4 .. 4 d4 + 3 of the head_dim-long row at base (zeros past it).
#define QUAD(buf, buf4, base, d4)                                                        \
    (4u * (d4) >= pc.head_dim ? vec4(0.0)                                                \
     : VEC4 ? buf4[((base) >> 2) + (d4)]                                                 \
     : vec4(buf[(base) + 4u * (d4)],                                                     \
            4u * (d4) + 1u < pc.head_dim ? buf[(base) + 4u * (d4) + 1u] : 0.0,          \
            4u * (d4) + 2u < pc.head_dim ? buf[(base) + 4u * (d4) + 2u] : 0.0,          \
            4u * (d4) + 3u < pc.head_dim ? buf[(base) + 4u * (d4) + 3u] : 0.0))

// dst[HD4] = the row at base in every lane (times mul): lane l < 8 loads
// quads l + 8c, constant-lane broadcasts spread them.
#define BROADCAST_ROW(dst, buf, buf4, base, mul)                                         \
    {                                                                                    \
        uint l_ = gl_SubgroupInvocationID;                                               \
        [[unroll]] for (uint c_ = 0u; c_ < QPL; c_++) {                                  \
            vec4 mine_ = l_ < 8u ? QUAD(buf, buf4, base, l_ + 8u * c_) * (mul) : vec4(0.0); \
            vec4 b_[8];                                                                  \
            b_[0] = subgroupBroadcast(mine_, 0u); b_[1] = subgroupBroadcast(mine_, 1u);  \
            b_[2] = subgroupBroadcast(mine_, 2u); b_[3] = subgroupBroadcast(mine_, 3u);  \
            b_[4] = subgroupBroadcast(mine_, 4u); b_[5] = subgroupBroadcast(mine_, 5u);  \
            b_[6] = subgroupBroadcast(mine_, 6u); b_[7] = subgroupBroadcast(mine_, 7u);  \
            [[unroll]] for (uint i_ = 0u; i_ < 8u; i_++)                                 \
                if (8u * c_ + i_ < HD4) dst[8u * c_ + i_] = b_[i_];                      \
        }                                                                                \
    }

// This lane's own row at base into dst[off .. off + HD4) (times mul; zeros when !valid).
#define OWN_ROW(dst, off, buf, buf4, base, valid, mul)                                   \
    [[unroll]] for (uint d4_ = 0u; d4_ < HD4; d4_++)                                     \
        dst[(off) + d4_] = (valid) ? QUAD(buf, buf4, base, d4_) * (mul) : vec4(0.0);

// Stores a register row into buf at base (adding to it when accumulating).
#define STORE_ROW(buf, base, src, off, mul)                                              \
    [[unroll]] for (uint d4_ = 0u; d4_ < HD4; d4_++)                                     \
        [[unroll]] for (uint e_ = 0u; e_ < 4u; e_++) {                                   \
            uint d_ = 4u * d4_ + e_, at_ = (base) + d_;                                  \
            if (d_ < pc.head_dim)                                                        \
                buf[at_] = ((pc.flags & 1u) != 0u ? buf[at_] : 0.0) + (mul) * src[(off) + d4_][e_]; \
        }

// Whether this workgroup runs as one subgroup of >= 8 lanes (else: NaN outputs).
bool lanes_ok() { return subgroupAdd(1u) == WG_SIZE && WG_SIZE >= 8u; }

#if defined(SG_FORWARD) || defined(SG_DQ)
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer K4 { vec4 k4[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer V4 { vec4 v4[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };

// The block of rows this workgroup owns: row of (lane, p) = q0 + p * WG + lane.
struct Block { uint h, q0, lo, hi; };

// The first key any row of the block sees and its last row + 1 (uniform).
Block query_block(uint id) {
    uint rows = WG_SIZE * PER, n_qb = (pc.T + rows - 1u) / rows;
    Block b;
    b.h = id / n_qb;
    b.q0 = (id - b.h * n_qb) * rows;
    b.hi = min(b.q0 + rows, pc.T);
    uint first = b.hi;
    for (uint p = 0u; p < PER; p++) {
        uint t = b.q0 + p * WG_SIZE + gl_SubgroupInvocationID;
        if (t < pc.T) first = min(first, min(start[t], t));
    }
    b.lo = subgroupMin(first);
    return b;
}
#endif

#ifdef SG_FORWARD
layout(std430, set = 0, binding = 4) writeonly buffer Out { float outv[]; };
layout(std430, set = 0, binding = 5) writeonly buffer RowMax { float row_max[]; };
layout(std430, set = 0, binding = 6) writeonly buffer RowSum { float row_sum[]; };

void main() {
    uint rows = WG_SIZE * PER, id = linear_group_id();
    if (id >= (pc.T + rows - 1u) / rows * pc.n_heads || gl_SubgroupID != 0u) return;
    Block b = query_block(id);
    uint kvh = b.h / (pc.n_heads / pc.n_kv_heads), lane = gl_SubgroupInvocationID;
    bool ok = lanes_ok();
    vec4 qi[PER * HD4], acc[PER * HD4];
    uint t[PER], first[PER];
    float m[PER], l[PER];
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        t[p] = b.q0 + p * WG_SIZE + lane;
        bool valid = t[p] < pc.T;
        first[p] = valid ? min(start[t[p]], t[p]) : 0xffffffffu;
        OWN_ROW(qi, p * HD4, q, q4, t[p] * q_stride() + b.h * pc.head_dim, valid, pc.scale)
        [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) acc[p * HD4 + d4] = vec4(0.0);
        m[p] = NEG_INF;
        l[p] = 0.0;
    }
    for (uint j = b.lo; ok && j < b.hi; j++) {
        uint kv = j * kv_stride() + kvh * pc.head_dim;
        vec4 kr[HD4], vr[HD4];
        BROADCAST_ROW(kr, k, k4, kv, 1.0)
        BROADCAST_ROW(vr, v, v4, kv, 1.0)
        [[unroll]] for (uint p = 0u; p < PER; p++) {
            if (j < first[p] || j > t[p]) continue;
            float s = 0.0;
            [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) s += dot(qi[p * HD4 + d4], kr[d4]);
            float m_new = max(m[p], s);
            float corr = exp(m[p] - m_new), e = exp(s - m_new);  // exp(-inf) = 0 at the first key
            l[p] = l[p] * corr + e;
            [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) acc[p * HD4 + d4] = acc[p * HD4 + d4] * corr + e * vr[d4];
            m[p] = m_new;
        }
    }
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        if (t[p] >= pc.T) continue;
        uint base = t[p] * q_stride() + b.h * pc.head_dim;
        [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++)
            [[unroll]] for (uint e = 0u; e < 4u; e++)
                if (4u * d4 + e < pc.head_dim) outv[base + 4u * d4 + e] = ok ? acc[p * HD4 + d4][e] / l[p] : NAN;
        row_max[t[p] * pc.n_heads + b.h] = ok ? m[p] : NAN;
        row_sum[t[p] * pc.n_heads + b.h] = ok ? l[p] : NAN;
    }
}
#endif

#if defined(SG_DQ) || defined(SG_DKDV)
layout(std430, set = 0, binding = 4) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 4) readonly buffer DOut4 { vec4 dout4[]; };
layout(std430, set = 0, binding = 5) readonly buffer Stats { float stats[]; };  // (m, l, delta) per (row, head)
#endif

#ifdef SG_DQ
layout(std430, set = 0, binding = 6) buffer DQ { float dq[]; };

void main() {
    uint rows = WG_SIZE * PER, id = linear_group_id();
    if (id >= (pc.T + rows - 1u) / rows * pc.n_heads || gl_SubgroupID != 0u) return;
    Block b = query_block(id);
    uint kvh = b.h / (pc.n_heads / pc.n_kv_heads), lane = gl_SubgroupInvocationID;
    bool ok = lanes_ok();
    vec4 qi[PER * HD4], doi[PER * HD4], acc[PER * HD4];
    uint t[PER], first[PER];
    vec3 st[PER];
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        t[p] = b.q0 + p * WG_SIZE + lane;
        bool valid = t[p] < pc.T;
        first[p] = valid ? min(start[t[p]], t[p]) : 0xffffffffu;
        uint base = t[p] * q_stride() + b.h * pc.head_dim, th = t[p] * pc.n_heads + b.h;
        OWN_ROW(qi, p * HD4, q, q4, base, valid, pc.scale)
        OWN_ROW(doi, p * HD4, dout, dout4, base, valid, 1.0)
        st[p] = valid ? vec3(stats[3u * th], stats[3u * th + 1u], stats[3u * th + 2u]) : vec3(0.0, 1.0, 0.0);
        [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) acc[p * HD4 + d4] = vec4(0.0);
    }
    for (uint j = b.lo; ok && j < b.hi; j++) {
        uint kv = j * kv_stride() + kvh * pc.head_dim;
        vec4 kr[HD4], vr[HD4];
        BROADCAST_ROW(kr, k, k4, kv, 1.0)
        BROADCAST_ROW(vr, v, v4, kv, 1.0)
        [[unroll]] for (uint p = 0u; p < PER; p++) {
            if (j < first[p] || j > t[p]) continue;
            float s = 0.0, dp = 0.0;
            [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) {
                s += dot(qi[p * HD4 + d4], kr[d4]);
                dp += dot(doi[p * HD4 + d4], vr[d4]);
            }
            float ds = exp(s - st[p].x) / st[p].y * (dp - st[p].z);
            [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) acc[p * HD4 + d4] += ds * kr[d4];
        }
    }
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        if (t[p] >= pc.T) continue;
        STORE_ROW(dq, t[p] * q_stride() + b.h * pc.head_dim, acc, p * HD4, ok ? pc.scale : NAN)
    }
}
#endif

#ifdef SG_DKDV
layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer K4 { vec4 k4[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer V4 { vec4 v4[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };
layout(std430, set = 0, binding = 6) buffer DK { float dk[]; };
layout(std430, set = 0, binding = 7) buffer DV { float dv[]; };

void main() {
    uint keys = WG_SIZE * PER, n_kb = (pc.T + keys - 1u) / keys, id = linear_group_id();
    if (id >= n_kb * pc.n_kv_heads || gl_SubgroupID != 0u) return;
    uint kvh = id / n_kb, k0 = (id - kvh * n_kb) * keys, last = min(k0 + keys, pc.T) - 1u;
    uint group = pc.n_heads / pc.n_kv_heads, lane = gl_SubgroupInvocationID;
    bool ok = lanes_ok();
    vec4 kj[PER * HD4], vj[PER * HD4], acc_k[PER * HD4], acc_v[PER * HD4];
    uint key[PER];
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        key[p] = k0 + p * WG_SIZE + lane;
        bool valid = key[p] < pc.T;
        uint kv = key[p] * kv_stride() + kvh * pc.head_dim;
        OWN_ROW(kj, p * HD4, k, k4, kv, valid, 1.0)
        OWN_ROW(vj, p * HD4, v, v4, kv, valid, 1.0)
        [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) {
            acc_k[p * HD4 + d4] = vec4(0.0);
            acc_v[p * HD4 + d4] = vec4(0.0);
        }
    }
    for (uint h = kvh * group; ok && h < (kvh + 1u) * group; h++)
        for (uint i = k0; i < pc.T; i++) {  // rows before k0 see none of these keys
            uint first = min(start[i], i);  // the same for every lane
            if (first > last) {             // the row sees none of them
                if ((pc.flags & 2u) != 0u) break;  // nor does any later row
                continue;
            }
            uint th = i * pc.n_heads + h, base = i * q_stride() + h * pc.head_dim;
            float sv = lane < 3u ? stats[3u * th + lane] : 0.0;
            float m = subgroupBroadcast(sv, 0u), l = subgroupBroadcast(sv, 1u), delta = subgroupBroadcast(sv, 2u);
            vec4 qr[HD4], dor[HD4];
            BROADCAST_ROW(qr, q, q4, base, pc.scale)
            BROADCAST_ROW(dor, dout, dout4, base, 1.0)
            [[unroll]] for (uint p = 0u; p < PER; p++) {
                if (key[p] < first || key[p] > i) continue;
                float s = 0.0, dp = 0.0;
                [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) {
                    s += dot(qr[d4], kj[p * HD4 + d4]);
                    dp += dot(dor[d4], vj[p * HD4 + d4]);
                }
                float pr = exp(s - m) / l, ds = pr * (dp - delta);
                [[unroll]] for (uint d4 = 0u; d4 < HD4; d4++) {
                    acc_v[p * HD4 + d4] += pr * dor[d4];
                    acc_k[p * HD4 + d4] += ds * qr[d4];
                }
            }
        }
    [[unroll]] for (uint p = 0u; p < PER; p++) {
        if (key[p] >= pc.T) continue;
        uint kv = key[p] * kv_stride() + kvh * pc.head_dim;
        STORE_ROW(dk, kv, acc_k, p * HD4, ok ? 1.0 : NAN)
        STORE_ROW(dv, kv, acc_v, p * HD4, ok ? 1.0 : NAN)
    }
}
#endif
