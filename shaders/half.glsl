// half.glsl: f32 -> f16 bits rounded to nearest even, the same function as
// the host's vks_f32_to_f16 (src/core/common.c) bit for bit, so a cache
// written here equals one a verifier rounds on the host. Integer arithmetic
// only: GLSL's float16_t/packHalf2x16 conversions leave the rounding to the
// driver.
uint half_shift_round_even(uint value, uint shift) {
    uint kept = value >> shift;
    uint rest = value & ((1u << shift) - 1u);
    uint half_ = 1u << (shift - 1u);
    if (rest > half_ || (rest == half_ && (kept & 1u) != 0u)) kept++;
    return kept;
}

uint f32_to_f16_bits(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | ((ax >> 13) & 0x3ffu);  // NaN stays (quiet) NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;                         // >= 65520 rounds to inf
    if (ax >= 0x38800000u) return sign | half_shift_round_even(ax - (112u << 23), 13u);
    if (ax <= 0x33000000u) return sign;                                   // <= 2^-25: zero
    uint e = ax >> 23, man = (ax & 0x7fffffu) | 0x800000u;                // subnormal half
    return sign | half_shift_round_even(man, 126u - e);
}

// Four halves (two words, low half first) as a vec4: exact.
vec4 unpack_half4(uvec2 w) { return vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y)); }
