#version 450
// Token sampling, one workgroup per row, mirroring vks_ref_sample exactly:
//   temperature <= 0: argmax of the logits (lowest index on ties);
//   else z = logit / temperature, optional top-k then top-p filtering, and
//   token = argmax over kept tokens of z_i + Gumbel(Philox(i, pos, seq; seed)).
// Thresholds are over the order-preserving uint key of z: top-k keeps
// key >= the largest t with count(key >= t) >= k (the k-th largest key, found
// by a radix select: 4 passes of 256-bin histograms, exact integer counts);
// top-p keeps key >= the largest t whose kept softmax mass is >= top_p (found
// by bisection over the bits below the common prefix of the top-k threshold
// and the largest key: the answer lies between them). NaN z is never kept and
// never wins (all NaN: token 0).
//
// Top-k's histograms spread over W workgroups per row (issue 28; few rows, a
// large vocabulary: vks_op_sample_split). Three more kernels from this file:
//   SAMPLE_ZERO   one workgroup per row: clears the row's 4 x 256 counts;
//   SAMPLE_HIST   W workgroups per row, each histograms its slice of the row
//                 (keys under the prefix of the earlier passes, whose digits
//                 each workgroup takes again from their counts) in shared
//                 memory, then adds its bins to the row's counts of this pass
//                 with integer atomics (exact, so in any order);
//   SAMPLE_SPREAD this kernel with the 4 digits taken from the row's counts
//                 in place of top_k_threshold.
// The counts are those of top_k_threshold's passes, so the threshold, and the
// token, are the one-workgroup kernel's bit for bit; top-p's float masses and
// the Gumbel argmax stay in one workgroup per row, summed in the same order.
// Scratch (uints): counts[S][4][256], pass 0 = bits 24..31.
#include "common.glsl"
layout(local_size_x_id = 0) in;
#if defined(SAMPLE_ZERO) || defined(SAMPLE_HIST) || defined(SAMPLE_SPREAD)
#define SPREAD_ANY
#endif

struct SampleRow {
    float temperature;
    uint top_k;
    float top_p;
    uint seed_lo, seed_hi, seq, pos, pad;
};
layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer Params { SampleRow params[]; };
#if defined(SAMPLE_ZERO) || defined(SAMPLE_HIST)
layout(std430, set = 0, binding = 2) buffer Scratch { uint scratch[]; };
#else
layout(std430, set = 0, binding = 2) writeonly buffer Tokens { uint tokens[]; };
#endif
#ifdef SAMPLE_SPREAD
layout(std430, set = 0, binding = 3) readonly buffer Scratch { uint scratch[]; };
#endif
#ifdef SPREAD_ANY
// W workgroups per row; shift: HIST's radix pass (24, 16, 8, 0)
layout(push_constant) uniform Push { uint S, V, W, shift; } pc;
#else
layout(push_constant) uniform Push { uint S, V; } pc;
#endif

shared float red_v[WG_SIZE];
shared uint red_i[WG_SIZE];
shared uint hist[256];
shared vec4 red_a[WG_SIZE], red_b[WG_SIZE];

// ---- workgroup reductions (all invocations call them, all get the result)
#define TREE_REDUCE(STEP)                                                          \
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u;                           \
         len = half_n, half_n = (half_n + 1u) / 2u) {                              \
        if (t < len - half_n) { STEP; }                                            \
        barrier();                                                                 \
    }

float sum_f(float v) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_v[t] = v;
    barrier();
    TREE_REDUCE(red_v[t] += red_v[t + half_n])
    return red_v[0];
}

// sum_f's tree on 8 values at once, component by component (the same bits as 8 sum_f).
void sum_f8(inout vec4 a, inout vec4 b) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_a[t] = a;
    red_b[t] = b;
    barrier();
    TREE_REDUCE(red_a[t] += red_a[t + half_n]; red_b[t] += red_b[t + half_n])
    a = red_a[0];
    b = red_b[0];
}

float max_f(float v) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_v[t] = v;
    barrier();
    TREE_REDUCE(red_v[t] = max(red_v[t], red_v[t + half_n]))
    return red_v[0];
}

bool better(float v, uint i, float bv, uint bi) { return v > bv || (v == bv && i < bi); }

// Index of the largest value (lowest index on ties).
uint argmax(float v, uint i) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_v[t] = v;
    red_i[t] = i;
    barrier();
    TREE_REDUCE(if (better(red_v[t + half_n], red_i[t + half_n], red_v[t], red_i[t])) {
        red_v[t] = red_v[t + half_n];
        red_i[t] = red_i[t + half_n];
    })
    return red_i[0];
}

// ---- order-preserving float -> uint key (-0 and +0 share a key, as they compare equal)
uint key_of(float f) {
    uint u = floatBitsToUint(f);
    if (u == 0x80000000u) u = 0u;
    return (u & 0x80000000u) != 0u ? ~u : u | 0x80000000u;
}

// ---- Philox4x32-10 (Random123), word 0 of the output block
uint philox_word0(uvec4 c, uvec2 k) {
    for (int round = 0; round < 10; round++) {
        uint hi0, lo0, hi1, lo1;
        umulExtended(0xD2511F53u, c.x, hi0, lo0);
        umulExtended(0xCD9E8D57u, c.z, hi1, lo1);
        c = uvec4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k += uvec2(0x9E3779B9u, 0xBB67AE85u);
    }
    return c.x;
}

float gumbel(uint i, SampleRow p) {
    uint x = philox_word0(uvec4(i, p.pos, p.seq, 0u), uvec2(p.seed_lo, p.seed_hi));
    float u = (float(x >> 9) + 0.5) * (1.0 / 8388608.0); /* exact, strictly inside (0, 1) */
    /* -log(u) near u = 1 from its exact complement: log has only an absolute error bound
     * there (2^-21 on [0.5, 2]), a large relative error of -log(u) when u is within ~1e-6 of 1;
     * the same series as vks_gumbel_from_uniform (src/ref/ref_sample.c) */
    float w = 1.0 - u;
    float e = w < 0.015625 ? w * (1.0 + w * (0.5 + w * (0.33333334 + w * 0.25))) : -log(u);
    return -log(e);
}

// ---- per-row state: first logit of this workgroup's row
uint row_base;

float z_at(uint i, float temperature) { return logits[row_base + i] / temperature; }

// Largest key t with count(key >= t) >= k: the k-th largest key (0 when
// fewer than k keys are not NaN). Radix select, 8 bits a pass from the top:
// with the high bits fixed to prefix and `above` keys known to lie above
// it, the digit is the largest d with above + count(prefix, digit >= d) >= k.
uint top_k_threshold(uint k, float temperature) {
    uint t = gl_LocalInvocationID.x, prefix = 0u, above = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint high = shift == 24 ? 0u : 0xffffffffu << uint(shift + 8);
        barrier();  // every invocation is done reading the last pass's bins
        for (uint b = t; b < 256u; b += WG_SIZE) hist[b] = 0u;
        barrier();
        for (uint i = t; i < pc.V; i += WG_SIZE) {
            float z = z_at(i, temperature);
            uint key = key_of(z);
            if (!isnan(z) && (key & high) == prefix) atomicAdd(hist[(key >> uint(shift)) & 255u], 1u);
        }
        barrier();
        uint d = 255u, c = above + hist[255];
        while (c < k && d > 0u) c += hist[--d];
        above = c - hist[d];
        prefix |= d << uint(shift);
    }
    return prefix;
}

#ifdef SPREAD_ANY
// The rows whose top-k the spread kernels compute (the others take no radix select).
bool spread_row(SampleRow p) { return p.temperature > 0.0 && p.top_k > 0u && p.top_k < pc.V; }

uint counts_at(uint row, uint shift) { return (row * 4u + (24u - shift) / 8u) * 256u; }
#endif

#if defined(SAMPLE_HIST) || defined(SAMPLE_SPREAD)
// top_k_threshold's digits of the passes above bit `stop` from the row's
// counts (the same digit choice, from the same counts).
// Invocation 0 scans (every workgroup of every pass takes them again: on CPU
// drivers a scan by all invocations costs WG_SIZE / lanes times as much).
shared uint digits[2];

void take_digits(uint row, uint k, uint stop, out uint prefix, out uint above) {
    prefix = 0u;
    above = 0u;
    for (uint shift = 24u; shift >= stop && shift <= 24u; shift -= 8u) {
        barrier();  // every invocation is done reading hist
        for (uint b = gl_LocalInvocationID.x; b < 256u; b += WG_SIZE) hist[b] = scratch[counts_at(row, shift) + b];
        barrier();
        if (gl_LocalInvocationID.x == 0u) {
            uint d = 255u, c = above + hist[255];
            while (c < k && d > 0u) c += hist[--d];
            digits[0] = d;
            digits[1] = c - hist[d];
        }
        barrier();
        above = digits[1];
        prefix |= digits[0] << shift;
    }
}
#endif

#ifdef SAMPLE_SPREAD
uint cur_row;

// top_k_threshold's result from the spread passes' counts.
uint spread_top_k_threshold(uint k) {
    uint prefix, above;
    take_digits(cur_row, k, 0u, prefix, above);
    return prefix;
}
#endif

float mass_at_least(uint thr, float zmax, float temperature) {
    float m = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
        float z = z_at(i, temperature);
        if (!isnan(z) && key_of(z) >= thr) m += exp(z - zmax);
    }
    return sum_f(m);
}

// Largest key t >= lo whose mass (keys >= t, relative to keys >= lo) is >= top_p.
uint top_p_threshold(uint lo, float top_p, float temperature) {
    float zmax = -1.0 / 0.0;
    for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
        float z = z_at(i, temperature);
        if (z > zmax) zmax = z;  // NaN never compares greater
    }
    zmax = max_f(zmax);
    float total = mass_at_least(lo, zmax, temperature);
    // The mass is non-increasing in t (sums of fewer non-negative terms in the
    // same order), 1 at lo and 0 above the largest key: the answer shares the
    // high bits where lo and that key agree, and bisection over the bits below
    // finds the same t as over all 32.
    // Three bits a pass: the masses at the 7 candidates t | j << shift (j = 1..7) in
    // one pass over the row, each summed in mass_at_least's order (adding +0 for
    // a key below a candidate changes no bit), so the same t in a third of the passes.
    uint diff = lo ^ key_of(zmax);
    int top = diff == 0u ? -1 : findMSB(diff);
    uint t = top >= 31 ? 0u : lo & (0xffffffffu << uint(top + 1));
    for (int bit = top; bit >= 0;) {
        int nb = min(3, bit + 1), shift = bit + 1 - nb;
        uvec4 ca = max(uvec4(t) | (uvec4(1u, 2u, 3u, 4u) << uint(shift)), uvec4(lo));
        uvec4 cb = max(uvec4(t) | (uvec4(5u, 6u, 7u, 7u) << uint(shift)), uvec4(lo));
        vec4 ma = vec4(0.0), mb = vec4(0.0);
        for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
            float z = z_at(i, temperature);
            if (isnan(z)) continue;
            uint key = key_of(z);
            if (key < ca.x) continue;  // below every candidate
            float e = exp(z - zmax);
            ma += mix(vec4(0.0), vec4(e), greaterThanEqual(uvec4(key), ca));
            mb += mix(vec4(0.0), vec4(e), greaterThanEqual(uvec4(key), cb));
        }
        sum_f8(ma, mb);
        float f[7] = float[7](ma.x, ma.y, ma.z, ma.w, mb.x, mb.y, mb.z);
        uint pick = 0u;
        for (int j = 1; j < (1 << nb); j++)
            if (f[j - 1] / total >= top_p) pick = uint(j);
        t |= pick << uint(shift);
        bit -= nb;
    }
    return max(t, lo);
}

uint sample_row(SampleRow p) {
    uint best_i = 0xffffffffu;
    float best_v = -1.0 / 0.0;
    if (!(p.temperature > 0.0)) {  // NaN temperature is greedy too, as in the reference
        for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
            float v = logits[row_base + i];
            if (better(v, i, best_v, best_i)) { best_v = v; best_i = i; }
        }
        return argmax(best_v, best_i);
    }
    uint thr = 0u;
#ifdef SAMPLE_SPREAD
    if (p.top_k > 0u && p.top_k < pc.V) thr = spread_top_k_threshold(p.top_k);
#else
    if (p.top_k > 0u && p.top_k < pc.V) thr = top_k_threshold(p.top_k, p.temperature);
#endif
    if (p.top_p > 0.0 && p.top_p < 1.0) thr = top_p_threshold(thr, p.top_p, p.temperature);
    for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
        float z = z_at(i, p.temperature);
        if (isnan(z) || key_of(z) < thr) continue;
        float v = z + gumbel(i, p);
        if (better(v, i, best_v, best_i)) { best_v = v; best_i = i; }
    }
    return argmax(best_v, best_i);
}

#if defined(SAMPLE_ZERO)
void main() {
    uint row = linear_group_id();
    if (row >= pc.S) return;
    for (uint b = gl_LocalInvocationID.x; b < 1024u; b += WG_SIZE) scratch[row * 1024u + b] = 0u;
}
#elif defined(SAMPLE_HIST)
// Workgroup w of row's W: the histogram of its slice [w * chunk, (w + 1) * chunk)
// of the keys whose bits above pc.shift + 8 equal the prefix of the earlier passes.
void main() {
    uint g = linear_group_id(), row = g / pc.W, w = g % pc.W, t = gl_LocalInvocationID.x;
    if (row >= pc.S) return;  // uniform over the workgroup
    SampleRow p = params[row];
    if (!spread_row(p)) return;
    row_base = row * pc.V;
    uint prefix = 0u, above = 0u, high = 0u;
    if (pc.shift != 24u) {
        take_digits(row, p.top_k, pc.shift + 8u, prefix, above);
        high = 0xffffffffu << (pc.shift + 8u);
    }
    barrier();  // every invocation is done reading hist
    for (uint b = t; b < 256u; b += WG_SIZE) hist[b] = 0u;
    barrier();
    uint chunk = pc.V / pc.W + (pc.V % pc.W != 0u ? 1u : 0u);
    uint lo = w * chunk, hi = min(pc.V, lo + chunk);
    for (uint i = lo + t; i < hi; i += WG_SIZE) {
        float z = z_at(i, p.temperature);
        uint key = key_of(z);
        if (!isnan(z) && (key & high) == prefix) atomicAdd(hist[(key >> pc.shift) & 255u], 1u);
    }
    barrier();
    uint base = counts_at(row, pc.shift);
    for (uint b = t; b < 256u; b += WG_SIZE)
        if (hist[b] != 0u) atomicAdd(scratch[base + b], hist[b]);
}
#else
void main() {
    uint row = linear_group_id();
    if (row >= pc.S) return;  // uniform over the workgroup
    row_base = row * pc.V;
#ifdef SAMPLE_SPREAD
    cur_row = row;
#endif
    uint tok = sample_row(params[row]);
    if (gl_LocalInvocationID.x == 0u) tokens[row] = tok == 0xffffffffu ? 0u : tok;
}
#endif
