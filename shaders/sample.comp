#version 450
// Token sampling, one workgroup per row, mirroring vks_ref_sample (top-p: below):
//   temperature <= 0: argmax of the logits (lowest index on ties);
//   else z = logit / temperature, optional top-k then top-p filtering, and
//   token = argmax over kept tokens of z_i + Gumbel(Philox(i, pos, seq; seed)).
// Thresholds are over the order-preserving uint key of z: top-k keeps
// key >= the largest t with count(key >= t) >= k (the k-th largest key, found
// by a radix select: 4 passes of 256-bin histograms, exact integer counts);
// top-p keeps key >= the largest t >= that threshold whose kept mass M(t)
// (the masses of the kept keys >= t) is >= top_p * M(threshold), exactly in
// integers: a mass is exp(z - zmax) in 64-bit fixed point (round(e 2^38)), and
// t is found by the same radix select with per-digit sums of masses for counts,
// from the first byte where the top-k threshold and the largest key differ
// (at most 4 passes). NaN z is never kept and never wins (all NaN: token 0).
// Every sum is an integer, so the threshold depends on no summation order or
// workgroup size; vks_ref_sample sums in double in its own order, so the two
// can differ where a top-p boundary is within rounding (tests allow only that).
//
// Both selects spread over W workgroups per row (issue 28; few rows, a
// large vocabulary: vks_op_sample_split). Three more kernels from this file:
//   SAMPLE_ZERO   one workgroup per row: clears the row's scratch;
//   SAMPLE_HIST   W workgroups per row, each bins its slice of the row in
//                 shared memory (pass 0-3: top-k's counts of the keys under
//                 the prefix of the earlier passes, pass 0 also the largest
//                 key; pass 4-7: top-p's masses likewise), the earlier
//                 passes' digits taken again from the row's bins by each
//                 workgroup, then adds its bins to the row's with integer
//                 atomics (exact, so in any order; 64-bit masses as two words
//                 with the low word's carry);
//   SAMPLE_SPREAD this kernel with both thresholds' digits taken from the
//                 row's bins in place of the passes over the row.
// The bins are those of the one-workgroup kernel's passes, so the thresholds,
// and the token, are its bit for bit; the Gumbel argmax stays in one
// workgroup per row. Scratch: ROW_SCRATCH uints a row (below).
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
// W workgroups per row; pass: HIST's pass (0-3 top-k's bytes from the top, 4-7 top-p's)
layout(push_constant) uniform Push { uint S, V, W, pass; } pc;
#else
layout(push_constant) uniform Push { uint S, V; } pc;
#endif

shared float red_v[WG_SIZE];
shared uint red_i[WG_SIZE];
shared uint hist[256];
shared uint mass_lo[256], mass_hi[256];  // a top-p pass's 256 bins of 64-bit masses

// ---- workgroup reductions (all invocations call them, all get the result)
#define TREE_REDUCE(STEP)                                                          \
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u;                           \
         len = half_n, half_n = (half_n + 1u) / 2u) {                              \
        if (t < len - half_n) { STEP; }                                            \
        barrier();                                                                 \
    }

uint max_u(uint v) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_i[t] = v;
    barrier();
    TREE_REDUCE(red_i[t] = max(red_i[t], red_i[t + half_n]))
    return red_i[0];
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
// The rows whose top-k / top-p the spread kernels compute (the others take none).
bool topk_row(SampleRow p) { return p.temperature > 0.0 && p.top_k > 0u && p.top_k < pc.V; }
bool topp_row(SampleRow p) { return p.temperature > 0.0 && p.top_p > 0.0 && p.top_p < 1.0; }

// A row's scratch (uints): top-k counts [4][256] (pass 0 = bits 24..31), then
// top-p masses [4][lo 256, hi 256], then the largest key.
#define ROW_SCRATCH 3076u
uint counts_at(uint row, uint shift) { return row * ROW_SCRATCH + (24u - shift) / 8u * 256u; }
uint masses_at(uint row, uint shift) { return row * ROW_SCRATCH + 1024u + (24u - shift) / 8u * 512u; }
uint kmax_at(uint row) { return row * ROW_SCRATCH + 3072u; }
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

// ---- top-p over exact masses
// A kept token's mass is exp(z - zmax) in fixed point, round(e * 2^38), a
// 64-bit integer (uvec2: low, high word; V < 2^26 keeps every sum below 2^64).
// Integer sums do not depend on their order, so the spread passes (W
// workgroups adding into the row's bins with atomics) and the one-workgroup
// kernel get the same masses, and the same threshold, bit for bit, at any
// workgroup size.
uvec2 add64(uvec2 a, uvec2 b) {
    uint c, lo = uaddCarry(a.x, b.x, c);
    return uvec2(lo, a.y + b.y + c);
}
uvec2 sub64(uvec2 a, uvec2 b) {
    uint br, lo = usubBorrow(a.x, b.x, br);
    return uvec2(lo, a.y - b.y - br);
}
bool ge64(uvec2 a, uvec2 b) { return a.y > b.y || (a.y == b.y && a.x >= b.x); }

// Inverse of key_of (key 0, a NaN's, is never asked for a kept token).
float float_of(uint key) { return uintBitsToFloat((key & 0x80000000u) != 0u ? key & 0x7fffffffu : ~key); }

uvec2 mass_q(float z, float zmax) {
    precise float e = exp(z - zmax);
    if (!(e >= 0.0)) e = 1.0;  // inf - inf (z = zmax = +-inf): the largest value's mass
    precise float s = roundEven(min(e, 1.0) * 274877906944.0);  // 2^38: exact, an integer
    precise float h = floor(s * (1.0 / 4294967296.0));
    return uvec2(uint(s - h * 4294967296.0), uint(h));  // both exact
}

// The least 64-bit M with M / total >= top_p (exactly: M * 2^q >= P * total,
// top_p = P / 2^q, P < 2^24): ceil(P * total / 2^q).
uvec2 need_of(uvec2 total, float top_p) {
    int e;
    float m = frexp(top_p, e);  // top_p = m 2^e, 0.5 <= m < 1, e <= 0
    uint P = uint(m * 16777216.0), q = uint(24 - e);
    uint h0, l0, h1, l1, c;
    umulExtended(P, total.x, h0, l0);
    umulExtended(P, total.y, h1, l1);
    uint r1 = uaddCarry(h0, l1, c);
    uvec3 r = uvec3(l0, r1, h1 + c);  // P * total < 2^88
    if (q >= 96u) return uvec2(r != uvec3(0u) ? 1u : 0u, 0u);
    bool rem = false;
    for (; q >= 32u; q -= 32u) {
        rem = rem || r.x != 0u;
        r = uvec3(r.y, r.z, 0u);
    }
    if (q > 0u) {
        rem = rem || (r.x << (32u - q)) != 0u;
        r = uvec3((r.x >> q) | (r.y << (32u - q)), (r.y >> q) | (r.z << (32u - q)), r.z >> q);
    }
    return add64(r.xy, uvec2(rem ? 1u : 0u, 0u));  // r.z = 0: q >= 24
}

// mass_lo/hi += the masses of the kept keys (not NaN, >= lo) in logits
// [from, to) of this row whose bits above shift + 8 are prefix, binned by
// their digit at shift (shared 64-bit adds: a carry out of the low word
// goes to the high one).
void mass_bins(uint from, uint to, uint lo, uint prefix, uint shift, float zmax, float temperature) {
    uint t = gl_LocalInvocationID.x, high = shift == 24u ? 0u : 0xffffffffu << (shift + 8u);
    barrier();  // every invocation is done reading the bins
    for (uint b = t; b < 256u; b += WG_SIZE) {
        mass_lo[b] = 0u;
        mass_hi[b] = 0u;
    }
    barrier();
    for (uint i = from + t; i < to; i += WG_SIZE) {
        float z = z_at(i, temperature);
        uint key = key_of(z);
        if (isnan(z) || key < lo || (key & high) != prefix) continue;
        uvec2 m = mass_q(z, zmax);
        uint b = (key >> shift) & 255u, old = atomicAdd(mass_lo[b], m.x);
        uint carry = old + m.x < old ? 1u : 0u;
        if (m.y + carry != 0u) atomicAdd(mass_hi[b], m.y + carry);
    }
    barrier();
}

// Top-p's radix select, a pass at `shift` from its bins in mass_lo/hi: the
// digit is the largest d with above + mass(prefix, digit >= d) >= need (0 if
// none; the first counted pass sets need from its bins' total: every kept key
// is in them). GPUs: the bins' suffix sums by all invocations (8 steps between
// mass_* and suf_*, ending in mass_*), then the largest d that reaches need.
// CPU drivers (SERIAL_SCAN): invocation 0 walks the bins down (a barrier costs
// a switch per invocation there; the same digit).
layout(constant_id = 1) const uint SERIAL_SCAN = 0u;
shared uint suf_lo[256], suf_hi[256], pick;
shared uint scan_out[5];

void scan_masses(bool first, float top_p, uint shift, inout uint prefix, inout uvec2 above, inout uvec2 need) {
    uint t = gl_LocalInvocationID.x;
    if (SERIAL_SCAN != 0u) {
        barrier();
        if (t == 0u) {
            if (first) {
                uvec2 total = uvec2(0u);
                for (uint b = 0u; b < 256u; b++) total = add64(total, uvec2(mass_lo[b], mass_hi[b]));
                need = need_of(total, top_p);
            }
            uint d = 255u;
            uvec2 c = add64(above, uvec2(mass_lo[255], mass_hi[255]));
            while (!ge64(c, need) && d > 0u) {
                d--;
                c = add64(c, uvec2(mass_lo[d], mass_hi[d]));
            }
            uvec2 a = sub64(c, uvec2(mass_lo[d], mass_hi[d]));
            scan_out[0] = d;
            scan_out[1] = a.x;
            scan_out[2] = a.y;
            scan_out[3] = need.x;
            scan_out[4] = need.y;
        }
        barrier();
        prefix |= scan_out[0] << shift;
        above = uvec2(scan_out[1], scan_out[2]);
        need = uvec2(scan_out[3], scan_out[4]);
        return;
    }
    for (uint off = 1u; off < 256u; off <<= 1u) {
        bool from_mass = (findLSB(off) & 1) == 0;
        barrier();
        for (uint b = t; b < 256u; b += WG_SIZE) {
            uvec2 v = from_mass ? uvec2(mass_lo[b], mass_hi[b]) : uvec2(suf_lo[b], suf_hi[b]);
            uint c = b + off;
            if (c < 256u) v = add64(v, from_mass ? uvec2(mass_lo[c], mass_hi[c]) : uvec2(suf_lo[c], suf_hi[c]));
            if (from_mass) {
                suf_lo[b] = v.x;
                suf_hi[b] = v.y;
            } else {
                mass_lo[b] = v.x;
                mass_hi[b] = v.y;
            }
        }
    }
    barrier();
    if (first) need = need_of(uvec2(mass_lo[0], mass_hi[0]), top_p);
    if (t == 0u) pick = 0u;
    barrier();
    for (uint d = t; d < 256u; d += WG_SIZE)
        if (d > 0u && ge64(add64(above, uvec2(mass_lo[d], mass_hi[d])), need)) atomicMax(pick, d);
    barrier();
    uint d = pick;
    if (d < 255u) above = add64(above, uvec2(mass_lo[d + 1u], mass_hi[d + 1u]));
    prefix |= d << shift;
}

// A pass whose digit is lo's: lo and the largest key agree on the bits from
// shift up, so every kept key has them (nothing to count).
bool forced(uint lo, uint kmax, uint shift) { return ((lo ^ kmax) >> shift) == 0u; }

#ifdef SAMPLE_SPREAD
uint cur_row;

// top_k_threshold's result from the spread passes' counts.
uint spread_top_k_threshold(uint k) {
    uint prefix, above;
    take_digits(cur_row, k, 0u, prefix, above);
    return prefix;
}
#endif

#if defined(SAMPLE_HIST) || defined(SAMPLE_SPREAD)
// top_p_threshold's digits of the passes above bit `stop` from the row's bins.
uint take_mass_digits(uint row, uint lo, uint kmax, float top_p, uint stop) {
    uint prefix = 0u;
    uvec2 above = uvec2(0u), need = uvec2(0u);
    bool first = true;
    for (uint shift = 24u; shift >= stop && shift <= 24u; shift -= 8u) {
        if (forced(lo, kmax, shift)) {
            prefix |= lo & (255u << shift);
            continue;
        }
        barrier();  // every invocation is done reading the bins
        for (uint b = gl_LocalInvocationID.x; b < 256u; b += WG_SIZE) {
            mass_lo[b] = scratch[masses_at(row, shift) + b];
            mass_hi[b] = scratch[masses_at(row, shift) + 256u + b];
        }
        scan_masses(first, top_p, shift, prefix, above, need);
        first = false;
    }
    return prefix;
}
#endif

// Largest key t >= lo whose mass (keys >= t, relative to keys >= lo) is >= top_p:
// a radix select over the keys' bytes as top_k_threshold's, with masses for counts,
// from the first byte where lo and the largest key differ (the answer lies between).
uint top_p_threshold(uint lo, float top_p, float temperature) {
#ifdef SAMPLE_SPREAD
    uint kmax = scratch[kmax_at(cur_row)];
    return max(take_mass_digits(cur_row, lo, kmax, top_p, 0u), lo);
#else
    uint kmax = 0u;
    for (uint i = gl_LocalInvocationID.x; i < pc.V; i += WG_SIZE) {
        float z = z_at(i, temperature);
        if (!isnan(z)) kmax = max(kmax, key_of(z));
    }
    kmax = max_u(kmax);
    float zmax = float_of(kmax);
    uint prefix = 0u;
    uvec2 above = uvec2(0u), need = uvec2(0u);
    bool first = true;
    for (int s = 24; s >= 0; s -= 8) {
        uint shift = uint(s);
        if (forced(lo, kmax, shift)) {
            prefix |= lo & (255u << shift);
            continue;
        }
        mass_bins(0u, pc.V, lo, prefix, shift, zmax, temperature);
        scan_masses(first, top_p, shift, prefix, above, need);
        first = false;
    }
    return max(prefix, lo);
#endif
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
    for (uint b = gl_LocalInvocationID.x; b < ROW_SCRATCH; b += WG_SIZE) scratch[row * ROW_SCRATCH + b] = 0u;
}
#elif defined(SAMPLE_HIST)
// Workgroup w of row's W, over its slice [w * chunk, (w + 1) * chunk) of the row.
// Passes 0-3 (top-k, bits 24-8 pass up): the histogram of the keys whose bits
// above the pass's byte equal the prefix of the earlier passes (pass 0 also the
// largest key, for top-p). Passes 4-7 (top-p, bits 24-8 (pass - 4) up): the
// masses of the kept keys under the earlier passes' prefix, by digit. Each adds
// into the row's scratch with integer atomics (exact, so in any order).
void main() {
    uint g = linear_group_id(), row = g / pc.W, w = g % pc.W, t = gl_LocalInvocationID.x;
    if (row >= pc.S) return;  // uniform over the workgroup
    SampleRow p = params[row];
    bool use_k = topk_row(p), use_p = topp_row(p);
    uint chunk = pc.V / pc.W + (pc.V % pc.W != 0u ? 1u : 0u);
    uint from = w * chunk, to = min(pc.V, from + chunk);
    row_base = row * pc.V;
    if (pc.pass >= 4u) {  // top-p
        if (!use_p) return;
        uint shift = 24u - 8u * (pc.pass - 4u), lo = 0u, above;
        if (use_k) take_digits(row, p.top_k, 0u, lo, above);
        uint kmax = scratch[kmax_at(row)];
        if (forced(lo, kmax, shift)) return;  // uniform
        uint prefix = take_mass_digits(row, lo, kmax, p.top_p, shift + 8u);
        mass_bins(from, to, lo, prefix, shift, float_of(kmax), p.temperature);
        uint base = masses_at(row, shift);
        for (uint b = t; b < 256u; b += WG_SIZE) {
            uint m = mass_lo[b], old = m != 0u ? atomicAdd(scratch[base + b], m) : 0u;
            uint hi = mass_hi[b] + (old + m < old ? 1u : 0u);
            if (hi != 0u) atomicAdd(scratch[base + 256u + b], hi);
        }
        return;
    }
    if (!use_k && !(use_p && pc.pass == 0u)) return;
    uint shift = 24u - 8u * pc.pass, prefix = 0u, above = 0u, high = 0u;
    if (use_k && pc.pass != 0u) {
        take_digits(row, p.top_k, shift + 8u, prefix, above);
        high = 0xffffffffu << (shift + 8u);
    }
    barrier();  // every invocation is done reading hist
    for (uint b = t; b < 256u; b += WG_SIZE) hist[b] = 0u;
    barrier();
    uint kmax = 0u;
    for (uint i = from + t; i < to; i += WG_SIZE) {
        float z = z_at(i, p.temperature);
        uint key = key_of(z);
        if (isnan(z)) continue;
        kmax = max(kmax, key);
        if (use_k && (key & high) == prefix) atomicAdd(hist[(key >> shift) & 255u], 1u);
    }
    if (use_p && pc.pass == 0u) {
        kmax = max_u(kmax);
        if (t == 0u && kmax != 0u) atomicMax(scratch[kmax_at(row)], kmax);
    }
    barrier();
    if (!use_k) return;
    uint base = counts_at(row, shift);
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
