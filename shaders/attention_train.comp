#version 450
// Causal grouped-query attention for training, over T packed rows: row t
// attends keys start[t]..t (start[t] > t reads as t), query head h reads KV
// head h / (n_heads / n_kv_heads), scores scaled by 1/sqrt(head_dim). Four
// kernels (variants by define), FlashAttention-2 style:
//   ATTN_FORWARD:  one workgroup per (block of BQ query rows, head): out and
//                  the softmax statistics m = max score, l = sum exp(s - m)
//                  per (row, head) (vks_ref_attention_forward's row_max/row_sum).
//   ATTN_BWD_DELTA: stats[t, h] = (m, l, delta), delta = dout[t, h, :] . out[t, h, :]
//                  (= sum_j P_j dP_j), so that the two kernels below read one
//                  binding for all three (they stay within 8 storage bindings).
//   ATTN_BWD_DQ:   one workgroup per (query block, head): dq (+)= scale dS K,
//                  over the key tiles in order.
//   ATTN_BWD_DKDV: one workgroup per (block of BK keys, KV head): dv (+)= P^T dO
//                  and dk (+)= scale dS^T Q, over the group's query heads and
//                  the query tiles in order.
// P = exp(s - m) / l is recomputed from the statistics; dS = P (dP - delta)
// with dP = dout . v. Every sum runs in a fixed order (no atomics), so the
// results are bit-identical run to run.
//
// Tiles sit in shared memory as vec4 rows (head_dim <= MAX_HD, padded to a
// whole vec4 with zeros; row stride S4 = MAX_HD/4 + 1 vec4s to spread banks):
// at most 26 KiB, within lavapipe's 32 KiB. Each invocation computes 4x4
// blocks of scores (4 rows x 4 keys) and updates outputs for 4 rows (or 4
// keys) at two vec4s of head_dim, so that every shared load feeds several
// multiply-adds: a CPU driver's cost is its number of load instructions (a
// vec4 load costs about what a scalar one does). Every sum keeps the order of
// the 2x2-block kernels before (bit-identical results).
#include "common.glsl"
layout(local_size_x_id = 0) in;

// head_dim rounded up to a whole vec4 (at most 128): the tiles' row length.
// A specialization constant, so the per-invocation output arrays below hold
// only the units a workgroup needs for the model's head_dim (with 128 for
// head_dim 32 they were 4x longer than used, dynamically indexed, and spilled
// to memory on CPU drivers).
layout(constant_id = 1) const uint MAX_HD = 128u;
const uint MAX_HD4 = MAX_HD / 4u;
const uint S4 = MAX_HD4 + 1u;
// head_dim % 4 == 0 and every q, k, v, dout binding 16-byte aligned: tile
// rows are read as vec4s (one load instead of four).
layout(constant_id = 2) const bool VEC4 = false;
const float NEG_INF = -1.0 / 0.0;

layout(push_constant) uniform Push {
    uint T, n_heads, n_kv_heads, head_dim;
    float scale;
    // 1: accumulate into the outputs; 2: start[] never decreases (the host
    // promises it), so a tile's first row has its smallest start
    uint flags;
} pc;

uint hd4() { return (pc.head_dim + 3u) / 4u; }
// Output units of the update loops: 4 query rows (forward, dq) or 4 keys
// (dk/dv) x a pair of vec4s of head_dim (the second is the first again past
// head_dim, never stored), so that each vector load feeds several vec4
// multiply-adds.
const uint HD4P = (MAX_HD4 + 1u) / 2u;
uint hd4p() { return (hd4() + 1u) / 2u; }
uint q_stride() { return pc.n_heads * pc.head_dim; }
uint kv_stride() { return pc.n_kv_heads * pc.head_dim; }
uint kv_head_of(uint h) { return h / (pc.n_heads / pc.n_kv_heads); }

// Elements d0..d0+3 of a row of buf starting at base, zeros past head_dim.
#define GATHER4(buf, base, d0)                                                  \
    vec4(buf[(base) + (d0)], (d0) + 1u < pc.head_dim ? buf[(base) + (d0) + 1u] : 0.0, \
         (d0) + 2u < pc.head_dim ? buf[(base) + (d0) + 2u] : 0.0,               \
         (d0) + 3u < pc.head_dim ? buf[(base) + (d0) + 3u] : 0.0)

// Copies n rows (row r at buf[first + r * stride]; buf4 is buf's vec4 view)
// into tile (zeros from row n up to `rows`), each element times `mul`.
#define LOAD_TILE(tile, rows, buf, buf4, first, stride, n, mul)                 \
    for (uint e = gl_LocalInvocationID.x; e < (rows) * hd4(); e += WG_SIZE) {  \
        uint r_ = e / hd4(), d4_ = e - r_ * hd4(), at_ = (first) + r_ * (stride); \
        if (r_ >= (n)) tile[r_ * S4 + d4_] = vec4(0.0);                         \
        else if (VEC4) tile[r_ * S4 + d4_] = buf4[(at_ >> 2) + d4_] * (mul);    \
        else tile[r_ * S4 + d4_] = GATHER4(buf, at_, 4u * d4_) * (mul);         \
    }

// Stores an accumulated vec4 of head_dim (elements d0..d0+3) into buf at base,
// adding to what is there when pc.accumulate is set.
#define STORE4(buf, base, d0, val)                                              \
    for (uint k_ = 0u; k_ < 4u && (d0) + k_ < pc.head_dim; k_++) {              \
        uint at_ = (base) + (d0) + k_;                                          \
        buf[at_] = (pc.flags & 1u) != 0u ? buf[at_] + val[k_] : val[k_];          \
    }

#if defined(ATTN_FORWARD) || defined(ATTN_BWD_DQ)
// ---- kernels over a block of query rows
const uint BQ = 16u;
#ifdef ATTN_FORWARD
const uint BK = 16u;
#else
const uint BK = 8u;
#endif

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer K4 { vec4 k4[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer V4 { vec4 v4[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };

shared vec4 q_s[BQ * S4];
shared vec4 k_s[BK * S4];
shared uint start_s[BQ];

// Loads the query block (times scale) and the rows' starts; returns the first key any row reads.
uint load_query_block(uint q0, uint nq, uint h) {
    LOAD_TILE(q_s, BQ, q, q4, q0 * q_stride() + h * pc.head_dim, q_stride(), nq, pc.scale)
    uint t = gl_LocalInvocationID.x;
    if (t < BQ) start_s[t] = t < nq ? min(start[q0 + t], q0 + t) : 0xffffffffu;
    barrier();
    if ((pc.flags & 2u) != 0u) return start_s[0];  // starts never decrease
    uint lo = q0 + nq - 1u;
    for (uint i = 0u; i < nq; i++) lo = min(lo, start_s[i]);
    return lo;
}

#endif

#ifdef ATTN_FORWARD
layout(std430, set = 0, binding = 4) writeonly buffer Out { float outv[]; };
layout(std430, set = 0, binding = 5) writeonly buffer RowMax { float row_max[]; };
layout(std430, set = 0, binding = 6) writeonly buffer RowSum { float row_sum[]; };

const uint BQ4 = BQ / 4u, BK4 = BK / 4u;
const uint UNITS = (BQ4 * HD4P + WG_SIZE - 1u) / WG_SIZE;
shared vec4 s_s[BQ * BK4];  // s_s[i * BK4 + jq]: row i's scores at keys 4jq..4jq+3, then exp(s - m)
shared float m_s[BQ], l_s[BQ], corr_s[BQ];

// Row i of the score tile becomes exp(s - m_new); updates m, l and the correction factor.
void softmax_update(uint i) {
    vec4 sv[BK4];
    for (uint jq = 0u; jq < BK4; jq++) sv[jq] = s_s[i * BK4 + jq];
    float m_old = m_s[i], m_new = m_old;
    for (uint j = 0u; j < BK; j++) m_new = max(m_new, sv[j / 4u][j % 4u]);
    float sum = 0.0;
    for (uint j = 0u; j < BK; j++) {
        float s = sv[j / 4u][j % 4u];
        float p = s == NEG_INF ? 0.0 : exp(s - m_new);
        sv[j / 4u][j % 4u] = p;
        sum += p;
    }
    for (uint jq = 0u; jq < BK4; jq++) s_s[i * BK4 + jq] = sv[jq];
    float corr = m_old == m_new ? 1.0 : (m_old == NEG_INF ? 0.0 : exp(m_old - m_new));
    l_s[i] = l_s[i] * corr + sum;
    m_s[i] = m_new;
    corr_s[i] = corr;
}

// Scores in blocks of 4 rows x 4 keys: per vec4 of head_dim, 8 vector loads
// feed 16 dot products (the 2x2 blocks before: 4 for 4), each entry summed
// over the vec4s in order as before.
void scores_to_tile(uint q0, uint nq, uint k0, uint nk) {
    for (uint b = gl_LocalInvocationID.x; b < BQ4 * BK4; b += WG_SIZE) {
        uint iq = b / BK4, jq = b - iq * BK4;
        vec4 s[4];
        for (uint a = 0u; a < 4u; a++) s[a] = vec4(0.0);
        for (uint d4 = 0u; d4 < hd4(); d4++) {
            vec4 kb[4];
            for (uint b2 = 0u; b2 < 4u; b2++) kb[b2] = k_s[(4u * jq + b2) * S4 + d4];
            for (uint a = 0u; a < 4u; a++) {
                vec4 qa = q_s[(4u * iq + a) * S4 + d4];
                s[a] += vec4(dot(qa, kb[0]), dot(qa, kb[1]), dot(qa, kb[2]), dot(qa, kb[3]));
            }
        }
        for (uint a = 0u; a < 4u; a++) {
            uint i = 4u * iq + a, first = start_s[i];
            vec4 r;
            for (uint b2 = 0u; b2 < 4u; b2++) {
                uint j = 4u * jq + b2, key = k0 + j;
                r[b2] = i < nq && j < nk && key >= first && key <= q0 + i ? s[a][b2] : NEG_INF;
            }
            s_s[i * BK4 + jq] = r;
        }
    }
}

void main() {
    uint n_qb = (pc.T + BQ - 1u) / BQ, id = linear_group_id();
    if (id >= n_qb * pc.n_heads) return;  // uniform over the workgroup
    uint h = id / n_qb, q0 = (id - h * n_qb) * BQ, nq = min(BQ, pc.T - q0);
    uint t = gl_LocalInvocationID.x, kvh = kv_head_of(h), units = BQ4 * hd4p();
    if (t < BQ) { m_s[t] = NEG_INF; l_s[t] = 0.0; }
    uint lo = load_query_block(q0, nq, h), hi = q0 + nq;
    vec4 acc[UNITS * 8u];  // unit c: rows 4iq + a at vec4 d4 (acc[8c + a]) and d4 + 1 (acc[8c + 4 + a])
    for (uint c = 0u; c < UNITS * 8u; c++) acc[c] = vec4(0.0);

    for (uint k0 = lo; k0 < hi; k0 += BK) {
        uint nk = min(BK, hi - k0), kv0 = k0 * kv_stride() + kvh * pc.head_dim;
        barrier();  // the previous tile's V is no longer read
        LOAD_TILE(k_s, BK, k, k4, kv0, kv_stride(), nk, 1.0)
        barrier();
        scores_to_tile(q0, nq, k0, nk);
        barrier();  // K no longer read: V takes its place
        if (t < BQ) softmax_update(t);
        LOAD_TILE(k_s, BK, v, v4, kv0, kv_stride(), nk, 1.0)
        barrier();
        // Keys past nk (up to the next 4) add 0 * 0: P is 0 there and V's rows are zeros.
        for (uint c = 0u; c < UNITS; c++) {
            uint u = t + c * WG_SIZE, iq = u / hd4p(), d4 = 2u * (u - iq * hd4p()), d4b = min(d4 + 1u, hd4() - 1u);
            if (u >= units) break;
            vec4 ra[4], rb[4];
            for (uint a = 0u; a < 4u; a++) {
                float corr = corr_s[4u * iq + a];
                ra[a] = acc[8u * c + a] * corr;
                rb[a] = acc[8u * c + 4u + a] * corr;
            }
            for (uint jq = 0u; 4u * jq < nk; jq++) {
                vec4 pa[4];
                for (uint a = 0u; a < 4u; a++) pa[a] = s_s[(4u * iq + a) * BK4 + jq];
                for (uint b2 = 0u; b2 < 4u; b2++) {
                    uint j = 4u * jq + b2;
                    vec4 va = k_s[j * S4 + d4], vb = k_s[j * S4 + d4b];
                    for (uint a = 0u; a < 4u; a++) {
                        ra[a] += pa[a][b2] * va;
                        rb[a] += pa[a][b2] * vb;
                    }
                }
            }
            for (uint a = 0u; a < 4u; a++) { acc[8u * c + a] = ra[a]; acc[8u * c + 4u + a] = rb[a]; }
        }
    }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, iq = u / hd4p(), d4 = 2u * (u - iq * hd4p());
        if (u >= units) break;
        for (uint a = 0u; a < 4u; a++) {
            uint i = 4u * iq + a, base = (q0 + i) * q_stride() + h * pc.head_dim + 4u * d4;
            if (i >= nq) break;
            vec4 ra = acc[8u * c + a], rb = acc[8u * c + 4u + a];
            for (uint e = 0u; e < 4u && 4u * d4 + e < pc.head_dim; e++) outv[base + e] = ra[e] / l_s[i];
            for (uint e = 4u; e < 8u && 4u * d4 + e < pc.head_dim; e++) outv[base + e] = rb[e - 4u] / l_s[i];
        }
    }
    if (t < nq) {
        row_max[(q0 + t) * pc.n_heads + h] = m_s[t];
        row_sum[(q0 + t) * pc.n_heads + h] = l_s[t];
    }
}
#endif

#ifdef ATTN_BWD_DELTA
layout(std430, set = 0, binding = 0) readonly buffer Out { float outv[]; };
layout(std430, set = 0, binding = 1) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 2) readonly buffer RowMax { float row_max[]; };
layout(std430, set = 0, binding = 3) readonly buffer RowSum { float row_sum[]; };
layout(std430, set = 0, binding = 4) writeonly buffer Stats { float stats[]; };

void main() {
    uint id = linear_invocation_id();  // t * n_heads + h
    if (id >= pc.T * pc.n_heads) return;
    uint base = id * pc.head_dim;
    float acc = 0.0;
    for (uint d = 0u; d < pc.head_dim; d++) acc += dout[base + d] * outv[base + d];
    stats[3u * id] = row_max[id];
    stats[3u * id + 1u] = row_sum[id];
    stats[3u * id + 2u] = acc;
}
#endif

#if defined(ATTN_BWD_DQ) || defined(ATTN_BWD_DKDV)
// ---- the backward's score blocks
// Both kernels hold query tiles q_s (times scale), do_s and key tiles k_s,
// v_s, and compute scores and dP in blocks of 4 query rows x 4 keys: per vec4
// of head_dim, 16 vector loads feed 32 dot products (the 2x2 blocks before
// took 8 loads for 8). Each entry sums dot(vec4, vec4) over the vec4s in
// order, as before: the same bits.
#define DEFINE_BLOCK4X4(ROWS_A, ROWS_B)                                         \
    void block4x4(uint i0, uint j0, out vec4 s[4], out vec4 dp[4]) {            \
        for (uint a = 0u; a < 4u; a++) { s[a] = vec4(0.0); dp[a] = vec4(0.0); } \
        for (uint d4 = 0u; d4 < hd4(); d4++) {                                  \
            vec4 kb[4], vb[4];                                                  \
            for (uint b = 0u; b < 4u; b++) {                                    \
                kb[b] = k_s[(j0 + b) * S4 + d4];                                \
                vb[b] = v_s[(j0 + b) * S4 + d4];                                \
            }                                                                   \
            for (uint a = 0u; a < 4u; a++) {                                    \
                vec4 qa = q_s[(i0 + a) * S4 + d4], oa = do_s[(i0 + a) * S4 + d4]; \
                s[a] += vec4(dot(qa, kb[0]), dot(qa, kb[1]), dot(qa, kb[2]), dot(qa, kb[3])); \
                dp[a] += vec4(dot(oa, vb[0]), dot(oa, vb[1]), dot(oa, vb[2]), dot(oa, vb[3])); \
            }                                                                   \
        }                                                                       \
    }
// Update units (see hd4p): per key, 3 (dq) or 6 (dk/dv) vector loads feed 8
// or 16 vec4 multiply-adds.
layout(std430, set = 0, binding = 5) readonly buffer Stats { float stats[]; };  // (m, l, delta) per (row, head)
// (m, l, delta, first visible key) of a query row
vec4 row_stats(uint t, uint h, uint first) {
    uint th = t * pc.n_heads + h;
    return vec4(stats[3u * th], stats[3u * th + 1u], stats[3u * th + 2u], float(first));
}
#endif

#ifdef ATTN_BWD_DQ
layout(std430, set = 0, binding = 4) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 4) readonly buffer DOut4 { vec4 dout4[]; };
layout(std430, set = 0, binding = 6) buffer DQ { float dq[]; };

const uint BQ4 = BQ / 4u;
const uint UNITS = (BQ4 * HD4P + WG_SIZE - 1u) / WG_SIZE;
shared vec4 do_s[BQ * S4];
shared vec4 v_s[BK * S4];
shared vec4 st_s[BQ];          // row_stats of the block's rows
shared vec4 ds_s[BK * BQ4];    // ds_s[j * BQ4 + iq] = dS of rows 4iq..4iq+3 at key j

DEFINE_BLOCK4X4(BQ, BK)

void main() {
    uint n_qb = (pc.T + BQ - 1u) / BQ, id = linear_group_id();
    if (id >= n_qb * pc.n_heads) return;  // uniform over the workgroup
    uint h = id / n_qb, q0 = (id - h * n_qb) * BQ, nq = min(BQ, pc.T - q0);
    uint t = gl_LocalInvocationID.x, kvh = kv_head_of(h), units = BQ4 * hd4p();
    uint qbase = q0 * q_stride() + h * pc.head_dim;
    LOAD_TILE(do_s, BQ, dout, dout4, qbase, q_stride(), nq, 1.0)
    if (t < BQ) {
        uint r = min(t, nq - 1u);
        st_s[t] = row_stats(q0 + r, h, min(start[q0 + r], q0 + r));
    }
    uint lo = load_query_block(q0, nq, h), hi = q0 + nq;  // its barrier publishes the above
    vec4 acc[UNITS * 8u];  // unit c: rows 4iq + a at vec4 d4 (acc[8c + a]) and d4 + 1 (acc[8c + 4 + a])
    for (uint c = 0u; c < UNITS * 8u; c++) acc[c] = vec4(0.0);

    for (uint k0 = lo; k0 < hi; k0 += BK) {
        uint nk = min(BK, hi - k0), kv0 = k0 * kv_stride() + kvh * pc.head_dim;
        barrier();  // the previous tile is no longer read
        LOAD_TILE(k_s, BK, k, k4, kv0, kv_stride(), nk, 1.0)
        LOAD_TILE(v_s, BK, v, v4, kv0, kv_stride(), nk, 1.0)
        barrier();
        for (uint b = t; b < BQ4 * (BK / 4u); b += WG_SIZE) {
            uint iq = b / (BK / 4u), jq = b - iq * (BK / 4u);
            vec4 s[4], dp[4], dsk[4];  // dsk[b2][a]: dS of row 4iq + a at key 4jq + b2
            block4x4(4u * iq, 4u * jq, s, dp);
            for (uint a = 0u; a < 4u; a++) {
                uint i = 4u * iq + a;
                vec4 st = st_s[i];
                for (uint b2 = 0u; b2 < 4u; b2++) {
                    uint j = 4u * jq + b2, key = k0 + j;
                    bool vis = i < nq && j < nk && float(key) >= st.w && key <= q0 + i;
                    dsk[b2][a] = vis ? exp(s[a][b2] - st.x) / st.y * (dp[a][b2] - st.z) : 0.0;
                }
            }
            for (uint b2 = 0u; b2 < 4u; b2++) ds_s[(4u * jq + b2) * BQ4 + iq] = dsk[b2];
        }
        barrier();
        for (uint c = 0u; c < UNITS; c++) {
            uint u = t + c * WG_SIZE, iq = u / hd4p(), d4 = 2u * (u - iq * hd4p()), d4b = min(d4 + 1u, hd4() - 1u);
            if (u >= units) break;
            vec4 ra[4], rb[4];
            for (uint a = 0u; a < 4u; a++) { ra[a] = acc[8u * c + a]; rb[a] = acc[8u * c + 4u + a]; }
            for (uint j = 0u; j < nk; j++) {
                vec4 dsv = ds_s[j * BQ4 + iq], ka = k_s[j * S4 + d4], kb = k_s[j * S4 + d4b];
                for (uint a = 0u; a < 4u; a++) {
                    ra[a] += dsv[a] * ka;
                    rb[a] += dsv[a] * kb;
                }
            }
            for (uint a = 0u; a < 4u; a++) { acc[8u * c + a] = ra[a]; acc[8u * c + 4u + a] = rb[a]; }
        }
    }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, iq = u / hd4p(), d4 = 2u * (u - iq * hd4p());
        if (u >= units) break;
        for (uint a = 0u; a < 4u; a++) {
            uint i = 4u * iq + a;
            if (i >= nq) break;
            vec4 ga = pc.scale * acc[8u * c + a], gb = pc.scale * acc[8u * c + 4u + a];
            STORE4(dq, qbase + i * q_stride(), 4u * d4, ga)
            if (d4 + 1u < hd4()) STORE4(dq, qbase + i * q_stride(), 4u * d4 + 4u, gb)
        }
    }
}
#endif

#ifdef ATTN_BWD_DKDV
// ---- one workgroup per block of keys: K and V tiles stay, query tiles pass
const uint BK = 16u, BQ = 8u, BK4 = BK / 4u;
const uint UNITS = (BK4 * HD4P + WG_SIZE - 1u) / WG_SIZE;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 0) readonly buffer Q4 { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer K4 { vec4 k4[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) readonly buffer V4 { vec4 v4[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };
layout(std430, set = 0, binding = 4) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 4) readonly buffer DOut4 { vec4 dout4[]; };
layout(std430, set = 0, binding = 6) buffer DK { float dk[]; };
layout(std430, set = 0, binding = 7) buffer DV { float dv[]; };

shared vec4 k_s[BK * S4], v_s[BK * S4];
shared vec4 q_s[BQ * S4], do_s[BQ * S4];
shared vec4 p_s[BQ * BK4], ds_s[BQ * BK4];  // [i * BK4 + jq]: P, dS of row i at keys 4jq..4jq+3
shared vec4 st_s[BQ];                       // row_stats of the tile's rows

DEFINE_BLOCK4X4(BQ, BK)

// The first key any row of query tile q0..q0+nq-1 sees.
uint query_tile_lo(uint q0, uint nq) {
    if ((pc.flags & 2u) != 0u) return min(start[q0], q0);  // starts never decrease
    uint lo = 0xffffffffu;
    for (uint i = 0u; i < nq; i++) lo = min(lo, min(start[q0 + i], q0 + i));
    return lo;
}

// Loads query tile q0..q0+nq-1 of head h: q times scale, dout and the rows' statistics.
void load_query_tile(uint q0, uint nq, uint h) {
    uint t = gl_LocalInvocationID.x, qbase = q0 * q_stride() + h * pc.head_dim;
    barrier();  // the previous tile is no longer read
    LOAD_TILE(q_s, BQ, q, q4, qbase, q_stride(), nq, pc.scale)
    LOAD_TILE(do_s, BQ, dout, dout4, qbase, q_stride(), nq, 1.0)
    if (t < BQ) {
        uint r = min(t, nq - 1u);
        st_s[t] = row_stats(q0 + r, h, min(start[q0 + r], q0 + r));
    }
    barrier();
}

void main() {
    uint n_kb = (pc.T + BK - 1u) / BK, id = linear_group_id();
    if (id >= n_kb * pc.n_kv_heads) return;  // uniform over the workgroup
    uint kvh = id / n_kb, k0 = (id - kvh * n_kb) * BK, nk = min(BK, pc.T - k0);
    uint t = gl_LocalInvocationID.x, group = pc.n_heads / pc.n_kv_heads, units = BK4 * hd4p();
    uint kv0 = k0 * kv_stride() + kvh * pc.head_dim;
    LOAD_TILE(k_s, BK, k, k4, kv0, kv_stride(), nk, 1.0)
    LOAD_TILE(v_s, BK, v, v4, kv0, kv_stride(), nk, 1.0)
    // unit c: keys 4jq + kk at vec4s d4 and d4 + 1: dk in acc_k[8c + kk], acc_k[8c + 4 + kk], dv alike
    vec4 acc_k[UNITS * 8u], acc_v[UNITS * 8u];
    for (uint c = 0u; c < UNITS * 8u; c++) { acc_k[c] = vec4(0.0); acc_v[c] = vec4(0.0); }

    for (uint h = kvh * group; h < (kvh + 1u) * group; h++)
        for (uint q0 = k0; q0 < pc.T; q0 += BQ) {  // rows before k0 see none of these keys
            uint nq = min(BQ, pc.T - q0);
            // Tiles where nobody sees these keys are skipped without a barrier
            // (every invocation reads the same starts); with sorted starts no
            // later tile sees them either.
            if (query_tile_lo(q0, nq) >= k0 + nk) {  // uniform
                if ((pc.flags & 2u) != 0u) break;
                continue;
            }
            load_query_tile(q0, nq, h);
            for (uint b = t; b < (BQ / 4u) * BK4; b += WG_SIZE) {
                uint iq = b / BK4, jq = b - iq * BK4;
                vec4 s[4], dp[4];
                block4x4(4u * iq, 4u * jq, s, dp);
                for (uint a = 0u; a < 4u; a++) {
                    uint i = 4u * iq + a;
                    vec4 st = st_s[i], p = vec4(0.0);
                    for (uint b2 = 0u; b2 < 4u; b2++) {
                        uint j = 4u * jq + b2, key = k0 + j;
                        if (i < nq && j < nk && float(key) >= st.w && key <= q0 + i) p[b2] = exp(s[a][b2] - st.x) / st.y;
                    }
                    p_s[i * BK4 + jq] = p;
                    ds_s[i * BK4 + jq] = p * (dp[a] - st.z);
                }
            }
            barrier();
            for (uint c = 0u; c < UNITS; c++) {
                uint u = t + c * WG_SIZE, jq = u / hd4p(), d4 = 2u * (u - jq * hd4p()), d4b = min(d4 + 1u, hd4() - 1u);
                if (u >= units) break;
                vec4 ka[4], kb[4], va[4], vb[4];
                for (uint kk = 0u; kk < 4u; kk++) {
                    ka[kk] = acc_k[8u * c + kk]; kb[kk] = acc_k[8u * c + 4u + kk];
                    va[kk] = acc_v[8u * c + kk]; vb[kk] = acc_v[8u * c + 4u + kk];
                }
                for (uint i = 0u; i < nq; i++) {
                    vec4 pv = p_s[i * BK4 + jq], dsv = ds_s[i * BK4 + jq];
                    vec4 qa = q_s[i * S4 + d4], qb = q_s[i * S4 + d4b], oa = do_s[i * S4 + d4], ob = do_s[i * S4 + d4b];
                    for (uint kk = 0u; kk < 4u; kk++) {
                        va[kk] += pv[kk] * oa;
                        vb[kk] += pv[kk] * ob;
                        ka[kk] += dsv[kk] * qa;
                        kb[kk] += dsv[kk] * qb;
                    }
                }
                for (uint kk = 0u; kk < 4u; kk++) {
                    acc_k[8u * c + kk] = ka[kk]; acc_k[8u * c + 4u + kk] = kb[kk];
                    acc_v[8u * c + kk] = va[kk]; acc_v[8u * c + 4u + kk] = vb[kk];
                }
            }
        }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, jq = u / hd4p(), d4 = 2u * (u - jq * hd4p());
        if (u >= units) break;
        for (uint kk = 0u; kk < 4u; kk++) {
            uint j = 4u * jq + kk, at = kv0 + j * kv_stride();
            if (j >= nk) break;
            STORE4(dk, at, 4u * d4, acc_k[8u * c + kk])
            STORE4(dv, at, 4u * d4, acc_v[8u * c + kk])
            if (d4 + 1u < hd4()) {
                STORE4(dk, at, 4u * d4 + 4u, acc_k[8u * c + 4u + kk])
                STORE4(dv, at, 4u * d4 + 4u, acc_v[8u * c + 4u + kk])
            }
        }
    }
}
#endif
