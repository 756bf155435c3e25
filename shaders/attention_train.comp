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
// at most 26 KiB, within lavapipe's 32 KiB. Each invocation computes 2x2
// blocks of scores (rows i, i + half; keys j, j + half) and updates outputs
// for a pair of rows at one vec4 of head_dim, so that every shared load feeds
// several multiply-adds (loads are what costs on CPU drivers).
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
const float NEG_INF = -1.0 / 0.0;

layout(push_constant) uniform Push {
    uint T, n_heads, n_kv_heads, head_dim;
    float scale;
    uint accumulate;
} pc;

uint hd4() { return (pc.head_dim + 3u) / 4u; }
uint q_stride() { return pc.n_heads * pc.head_dim; }
uint kv_stride() { return pc.n_kv_heads * pc.head_dim; }
uint kv_head_of(uint h) { return h / (pc.n_heads / pc.n_kv_heads); }

// Elements d0..d0+3 of a row of buf starting at base, zeros past head_dim.
#define GATHER4(buf, base, d0)                                                  \
    vec4(buf[(base) + (d0)], (d0) + 1u < pc.head_dim ? buf[(base) + (d0) + 1u] : 0.0, \
         (d0) + 2u < pc.head_dim ? buf[(base) + (d0) + 2u] : 0.0,               \
         (d0) + 3u < pc.head_dim ? buf[(base) + (d0) + 3u] : 0.0)

// Copies n rows (row r at buf[first + r * stride]) into tile (zeros from row
// n up to `rows`), each element times `mul`.
#define LOAD_TILE(tile, rows, buf, first, stride, n, mul)                       \
    for (uint e = gl_LocalInvocationID.x; e < (rows) * hd4(); e += WG_SIZE) {  \
        uint r_ = e / hd4(), d4_ = e - r_ * hd4();                              \
        tile[r_ * S4 + d4_] = r_ < (n) ? GATHER4(buf, (first) + r_ * (stride), 4u * d4_) * (mul) : vec4(0.0); \
    }

// Dot products of rows (i, i + ROWS/2) of A with rows (j, j + COLS/2) of B:
// (a0.b0, a0.b1, a1.b0, a1.b1), summed over the vec4s in order.
#define DEFINE_DOT_BLOCK(NAME, A, B, ROWS, COLS)                                \
    vec4 NAME(uint i, uint j) {                                                 \
        vec4 acc = vec4(0.0);                                                   \
        uint i1 = i + (ROWS) / 2u, j1 = j + (COLS) / 2u;                        \
        for (uint d4 = 0u; d4 < hd4(); d4++) {                                  \
            vec4 a0 = A[i * S4 + d4], a1 = A[i1 * S4 + d4];                     \
            vec4 b0 = B[j * S4 + d4], b1 = B[j1 * S4 + d4];                     \
            acc += vec4(dot(a0, b0), dot(a0, b1), dot(a1, b0), dot(a1, b1));    \
        }                                                                       \
        return acc;                                                             \
    }

// Stores an accumulated vec4 of head_dim (elements d0..d0+3) into buf at base,
// adding to what is there when pc.accumulate is set.
#define STORE4(buf, base, d0, val)                                              \
    for (uint k_ = 0u; k_ < 4u && (d0) + k_ < pc.head_dim; k_++) {              \
        uint at_ = (base) + (d0) + k_;                                          \
        buf[at_] = pc.accumulate != 0u ? buf[at_] + val[k_] : val[k_];          \
    }

#if defined(ATTN_FORWARD) || defined(ATTN_BWD_DQ)
// ---- kernels over a block of query rows
const uint BQ = 16u;
#ifdef ATTN_FORWARD
const uint BK = 16u;
#else
const uint BK = 8u;
#endif
// (row pair, vec4 of head_dim) units of the output each invocation updates
const uint UNITS = ((BQ / 2u) * MAX_HD4 + WG_SIZE - 1u) / WG_SIZE;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };

shared vec4 q_s[BQ * S4];
shared vec4 k_s[BK * S4];
shared float s_s[BQ * BK];
shared uint start_s[BQ];

// Loads the query block (times scale) and the rows' starts; returns the first key any row reads.
uint load_query_block(uint q0, uint nq, uint h) {
    LOAD_TILE(q_s, BQ, q, q0 * q_stride() + h * pc.head_dim, q_stride(), nq, pc.scale)
    uint t = gl_LocalInvocationID.x;
    if (t < BQ) start_s[t] = t < nq ? min(start[q0 + t], q0 + t) : 0xffffffffu;
    barrier();
    uint lo = q0 + nq - 1u;
    for (uint i = 0u; i < nq; i++) lo = min(lo, start_s[i]);
    return lo;
}

DEFINE_DOT_BLOCK(score_block, q_s, k_s, BQ, BK)

bool visible(uint q0, uint nq, uint i, uint key, uint j, uint nk) {
    return i < nq && j < nk && key >= start_s[i] && key <= q0 + i;
}
#endif

#ifdef ATTN_FORWARD
layout(std430, set = 0, binding = 4) writeonly buffer Out { float outv[]; };
layout(std430, set = 0, binding = 5) writeonly buffer RowMax { float row_max[]; };
layout(std430, set = 0, binding = 6) writeonly buffer RowSum { float row_sum[]; };

shared float m_s[BQ], l_s[BQ], corr_s[BQ];

// Row i of the score tile becomes exp(s - m_new); updates m, l and the correction factor.
void softmax_update(uint i) {
    float m_old = m_s[i], m_new = m_old;
    for (uint j = 0u; j < BK; j++) m_new = max(m_new, s_s[i * BK + j]);
    float sum = 0.0;
    for (uint j = 0u; j < BK; j++) {
        float s = s_s[i * BK + j];
        float p = s == NEG_INF ? 0.0 : exp(s - m_new);
        s_s[i * BK + j] = p;
        sum += p;
    }
    float corr = m_old == m_new ? 1.0 : (m_old == NEG_INF ? 0.0 : exp(m_old - m_new));
    l_s[i] = l_s[i] * corr + sum;
    m_s[i] = m_new;
    corr_s[i] = corr;
}

void scores_to_tile(uint q0, uint nq, uint k0, uint nk) {
    // 2x2 blocks: rows (ib, ib + BQ/2), keys (jb, jb + BK/2)
    for (uint b = gl_LocalInvocationID.x; b < (BQ / 2u) * (BK / 2u); b += WG_SIZE) {
        uint ib = b / (BK / 2u), jb = b - ib * (BK / 2u), i1 = ib + BQ / 2u, j1 = jb + BK / 2u;
        vec4 s = score_block(ib, jb);
        s_s[ib * BK + jb] = visible(q0, nq, ib, k0 + jb, jb, nk) ? s.x : NEG_INF;
        s_s[ib * BK + j1] = visible(q0, nq, ib, k0 + j1, j1, nk) ? s.y : NEG_INF;
        s_s[i1 * BK + jb] = visible(q0, nq, i1, k0 + jb, jb, nk) ? s.z : NEG_INF;
        s_s[i1 * BK + j1] = visible(q0, nq, i1, k0 + j1, j1, nk) ? s.w : NEG_INF;
    }
}

void main() {
    uint n_qb = (pc.T + BQ - 1u) / BQ, id = linear_group_id();
    if (id >= n_qb * pc.n_heads) return;  // uniform over the workgroup
    uint h = id / n_qb, q0 = (id - h * n_qb) * BQ, nq = min(BQ, pc.T - q0);
    uint t = gl_LocalInvocationID.x, kvh = kv_head_of(h), units = (BQ / 2u) * hd4();
    if (t < BQ) { m_s[t] = NEG_INF; l_s[t] = 0.0; }
    uint lo = load_query_block(q0, nq, h), hi = q0 + nq;
    vec4 o0[UNITS], o1[UNITS];  // rows p and p + BQ/2
    for (uint c = 0u; c < UNITS; c++) { o0[c] = vec4(0.0); o1[c] = vec4(0.0); }

    for (uint k0 = lo; k0 < hi; k0 += BK) {
        uint nk = min(BK, hi - k0), kv0 = k0 * kv_stride() + kvh * pc.head_dim;
        barrier();  // the previous tile's V is no longer read
        LOAD_TILE(k_s, BK, k, kv0, kv_stride(), nk, 1.0)
        barrier();
        scores_to_tile(q0, nq, k0, nk);
        barrier();  // K no longer read: V takes its place
        if (t < BQ) softmax_update(t);
        LOAD_TILE(k_s, BK, v, kv0, kv_stride(), nk, 1.0)
        barrier();
        for (uint c = 0u; c < UNITS; c++) {
            uint u = t + c * WG_SIZE, p = u / hd4(), d4 = u - p * hd4(), p1 = p + BQ / 2u;
            if (u >= units) break;
            vec4 a = o0[c] * corr_s[p], b = o1[c] * corr_s[p1];
            for (uint j = 0u; j < nk; j++) {
                vec4 vj = k_s[j * S4 + d4];
                a += s_s[p * BK + j] * vj;
                b += s_s[p1 * BK + j] * vj;
            }
            o0[c] = a;
            o1[c] = b;
        }
    }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, p = u / hd4(), d4 = u - p * hd4(), p1 = p + BQ / 2u;
        if (u >= units) break;
        for (uint k_ = 0u; k_ < 4u && 4u * d4 + k_ < pc.head_dim; k_++) {
            if (p < nq) outv[(q0 + p) * q_stride() + h * pc.head_dim + 4u * d4 + k_] = o0[c][k_] / l_s[p];
            if (p1 < nq) outv[(q0 + p1) * q_stride() + h * pc.head_dim + 4u * d4 + k_] = o1[c][k_] / l_s[p1];
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

#ifdef ATTN_BWD_DQ
layout(std430, set = 0, binding = 4) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 5) readonly buffer Stats { float stats[]; };  // (m, l, delta) per (row, head)
layout(std430, set = 0, binding = 6) buffer DQ { float dq[]; };

shared vec4 do_s[BQ * S4];
shared vec4 v_s[BK * S4];
shared float m_s[BQ], l_s[BQ], delta_s[BQ];

DEFINE_DOT_BLOCK(dp_block, do_s, v_s, BQ, BK)

// dS = P (dP - delta) at tile entry (i, j), 0 where the key is not visible.
float ds_entry(uint q0, uint nq, uint i, uint k0, uint j, uint nk, float s, float dp) {
    if (!visible(q0, nq, i, k0 + j, j, nk)) return 0.0;
    return exp(s - m_s[i]) / l_s[i] * (dp - delta_s[i]);
}

void main() {
    uint n_qb = (pc.T + BQ - 1u) / BQ, id = linear_group_id();
    if (id >= n_qb * pc.n_heads) return;  // uniform over the workgroup
    uint h = id / n_qb, q0 = (id - h * n_qb) * BQ, nq = min(BQ, pc.T - q0);
    uint t = gl_LocalInvocationID.x, kvh = kv_head_of(h), units = (BQ / 2u) * hd4();
    uint qbase = q0 * q_stride() + h * pc.head_dim;
    LOAD_TILE(do_s, BQ, dout, qbase, q_stride(), nq, 1.0)
    if (t < BQ) {
        uint th = (q0 + min(t, nq - 1u)) * pc.n_heads + h;
        m_s[t] = stats[3u * th];
        l_s[t] = stats[3u * th + 1u];
        delta_s[t] = stats[3u * th + 2u];
    }
    uint lo = load_query_block(q0, nq, h), hi = q0 + nq;  // its barrier publishes the above
    vec4 a0[UNITS], a1[UNITS];  // rows p and p + BQ/2
    for (uint c = 0u; c < UNITS; c++) { a0[c] = vec4(0.0); a1[c] = vec4(0.0); }

    for (uint k0 = lo; k0 < hi; k0 += BK) {
        uint nk = min(BK, hi - k0), kv0 = k0 * kv_stride() + kvh * pc.head_dim;
        barrier();  // the previous tile is no longer read
        LOAD_TILE(k_s, BK, k, kv0, kv_stride(), nk, 1.0)
        LOAD_TILE(v_s, BK, v, kv0, kv_stride(), nk, 1.0)
        barrier();
        for (uint b = t; b < (BQ / 2u) * (BK / 2u); b += WG_SIZE) {  // 2x2 blocks as in the forward
            uint ib = b / (BK / 2u), jb = b - ib * (BK / 2u), i1 = ib + BQ / 2u, j1 = jb + BK / 2u;
            vec4 s = score_block(ib, jb), dp = dp_block(ib, jb);
            s_s[ib * BK + jb] = ds_entry(q0, nq, ib, k0, jb, nk, s.x, dp.x);
            s_s[ib * BK + j1] = ds_entry(q0, nq, ib, k0, j1, nk, s.y, dp.y);
            s_s[i1 * BK + jb] = ds_entry(q0, nq, i1, k0, jb, nk, s.z, dp.z);
            s_s[i1 * BK + j1] = ds_entry(q0, nq, i1, k0, j1, nk, s.w, dp.w);
        }
        barrier();
        for (uint c = 0u; c < UNITS; c++) {
            uint u = t + c * WG_SIZE, p = u / hd4(), d4 = u - p * hd4(), p1 = p + BQ / 2u;
            if (u >= units) break;
            vec4 a = a0[c], b = a1[c];
            for (uint j = 0u; j < nk; j++) {
                vec4 kj = k_s[j * S4 + d4];
                a += s_s[p * BK + j] * kj;
                b += s_s[p1 * BK + j] * kj;
            }
            a0[c] = a;
            a1[c] = b;
        }
    }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, p = u / hd4(), d4 = u - p * hd4(), p1 = p + BQ / 2u;
        if (u >= units) break;
        vec4 ga = pc.scale * a0[c], gb = pc.scale * a1[c];
        if (p < nq) STORE4(dq, qbase + p * q_stride(), 4u * d4, ga)
        if (p1 < nq) STORE4(dq, qbase + p1 * q_stride(), 4u * d4, gb)
    }
}
#endif

#ifdef ATTN_BWD_DKDV
// ---- one workgroup per block of keys: K and V tiles stay, query tiles pass
const uint BK = 16u, BQ = 8u;
// (key pair, vec4 of head_dim) units of dk/dv each invocation updates
const uint UNITS = ((BK / 2u) * MAX_HD4 + WG_SIZE - 1u) / WG_SIZE;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 2) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 3) readonly buffer Start { uint start[]; };
layout(std430, set = 0, binding = 4) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 5) readonly buffer Stats { float stats[]; };  // (m, l, delta) per (row, head)
layout(std430, set = 0, binding = 6) buffer DK { float dk[]; };
layout(std430, set = 0, binding = 7) buffer DV { float dv[]; };

shared vec4 k_s[BK * S4], v_s[BK * S4];
shared vec4 q_s[BQ * S4], do_s[BQ * S4];
shared float p_s[BQ * BK], ds_s[BQ * BK];
shared float m_s[BQ], l_s[BQ], delta_s[BQ];
shared uint start_s[BQ];

DEFINE_DOT_BLOCK(score_block, q_s, k_s, BQ, BK)
DEFINE_DOT_BLOCK(dp_block, do_s, v_s, BQ, BK)

// Reads the starts of query tile q0..q0+nq-1; returns the smallest (every
// invocation gets the same value).
uint query_tile_start(uint q0, uint nq) {
    uint t = gl_LocalInvocationID.x;
    barrier();  // the previous tile is no longer read
    if (t < BQ) start_s[t] = t < nq ? min(start[q0 + t], q0 + t) : 0xffffffffu;
    barrier();
    uint lo = 0xffffffffu;
    for (uint i = 0u; i < nq; i++) lo = min(lo, start_s[i]);
    return lo;
}

// Loads query tile q0..q0+nq-1 of head h: q times scale, dout and the rows' statistics.
void load_query_tile(uint q0, uint nq, uint h) {
    uint t = gl_LocalInvocationID.x, qbase = q0 * q_stride() + h * pc.head_dim;
    LOAD_TILE(q_s, BQ, q, qbase, q_stride(), nq, pc.scale)
    LOAD_TILE(do_s, BQ, dout, qbase, q_stride(), nq, 1.0)
    if (t < BQ) {
        uint th = (q0 + min(t, nq - 1u)) * pc.n_heads + h;
        m_s[t] = stats[3u * th];
        l_s[t] = stats[3u * th + 1u];
        delta_s[t] = stats[3u * th + 2u];
    }
    barrier();
}

// P and dS at tile entry (i, j): 0 where the key is not visible.
void p_ds_entry(uint q0, uint nq, uint i, uint k0, uint j, uint nk, float s, float dp) {
    uint key = k0 + j;
    float p = 0.0;
    if (i < nq && j < nk && key >= start_s[i] && key <= q0 + i) p = exp(s - m_s[i]) / l_s[i];
    p_s[i * BK + j] = p;
    ds_s[i * BK + j] = p * (dp - delta_s[i]);
}

void main() {
    uint n_kb = (pc.T + BK - 1u) / BK, id = linear_group_id();
    if (id >= n_kb * pc.n_kv_heads) return;  // uniform over the workgroup
    uint kvh = id / n_kb, k0 = (id - kvh * n_kb) * BK, nk = min(BK, pc.T - k0);
    uint t = gl_LocalInvocationID.x, group = pc.n_heads / pc.n_kv_heads, units = (BK / 2u) * hd4();
    uint kv0 = k0 * kv_stride() + kvh * pc.head_dim;
    LOAD_TILE(k_s, BK, k, kv0, kv_stride(), nk, 1.0)
    LOAD_TILE(v_s, BK, v, kv0, kv_stride(), nk, 1.0)
    vec4 dk0[UNITS], dk1[UNITS], dv0[UNITS], dv1[UNITS];  // keys j and j + BK/2
    for (uint c = 0u; c < UNITS; c++) { dk0[c] = vec4(0.0); dk1[c] = vec4(0.0); dv0[c] = vec4(0.0); dv1[c] = vec4(0.0); }

    for (uint h = kvh * group; h < (kvh + 1u) * group; h++)
        for (uint q0 = k0; q0 < pc.T; q0 += BQ) {  // rows before k0 see none of these keys
            uint nq = min(BQ, pc.T - q0);
            // Skip tiles where nobody sees these keys without a barrier: each
            // invocation reads the tile's starts itself (same value everywhere).
            uint lo = 0xffffffffu;
            for (uint i = 0u; i < nq; i++) lo = min(lo, min(start[q0 + i], q0 + i));
            if (lo >= k0 + nk) continue;  // uniform
            query_tile_start(q0, nq);
            load_query_tile(q0, nq, h);
            for (uint b = t; b < (BQ / 2u) * (BK / 2u); b += WG_SIZE) {
                uint ib = b / (BK / 2u), jb = b - ib * (BK / 2u), i1 = ib + BQ / 2u, j1 = jb + BK / 2u;
                vec4 s = score_block(ib, jb), dp = dp_block(ib, jb);
                p_ds_entry(q0, nq, ib, k0, jb, nk, s.x, dp.x);
                p_ds_entry(q0, nq, ib, k0, j1, nk, s.y, dp.y);
                p_ds_entry(q0, nq, i1, k0, jb, nk, s.z, dp.z);
                p_ds_entry(q0, nq, i1, k0, j1, nk, s.w, dp.w);
            }
            barrier();
            for (uint c = 0u; c < UNITS; c++) {
                uint u = t + c * WG_SIZE, j = u / hd4(), d4 = u - j * hd4(), j1 = j + BK / 2u;
                if (u >= units) break;
                vec4 ka = dk0[c], kb = dk1[c], va = dv0[c], vb = dv1[c];
                for (uint i = 0u; i < nq; i++) {
                    vec4 qi = q_s[i * S4 + d4], doi = do_s[i * S4 + d4];
                    va += p_s[i * BK + j] * doi;
                    vb += p_s[i * BK + j1] * doi;
                    ka += ds_s[i * BK + j] * qi;
                    kb += ds_s[i * BK + j1] * qi;
                }
                dk0[c] = ka; dk1[c] = kb; dv0[c] = va; dv1[c] = vb;
            }
        }
    for (uint c = 0u; c < UNITS; c++) {
        uint u = t + c * WG_SIZE, j = u / hd4(), d4 = u - j * hd4(), j1 = j + BK / 2u;
        if (u >= units) break;
        vec4 ka = dk0[c], kb = dk1[c], va = dv0[c], vb = dv1[c];
        if (j < nk) { STORE4(dk, kv0 + j * kv_stride(), 4u * d4, ka) STORE4(dv, kv0 + j * kv_stride(), 4u * d4, va) }
        if (j1 < nk) { STORE4(dk, kv0 + j1 * kv_stride(), 4u * d4, kb) STORE4(dv, kv0 + j1 * kv_stride(), 4u * d4, vb) }
    }
}
#endif
