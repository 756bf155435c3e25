// weights.glsl: decoding of weight elements stored as packed 32-bit words.
// WTYPE 0 = f32, 1 = f16, 2 = bf16 (two 16-bit values per word, element e in
// word e/2, low half first). No 16-bit storage feature is needed.
#ifndef WTYPE
#define WTYPE 0
#endif

#if WTYPE == 0
const uint ELEMS_PER_WORD = 1u;
#else
const uint ELEMS_PER_WORD = 2u;
#endif

float half_from_bits(uint bits16) {
#if WTYPE == 1
    return unpackHalf2x16(bits16).x;
#else
    return uintBitsToFloat(bits16 << 16);
#endif
}

// Both elements of one packed word (16-bit types only).
vec2 decode_pair(uint word) {
#if WTYPE == 1
    return unpackHalf2x16(word);
#else
    return vec2(uintBitsToFloat(word << 16), uintBitsToFloat(word & 0xffff0000u));
#endif
}

// Element e of a weight array given a word reader function WORD(i).
#if WTYPE == 0
#define DECODE_ELEMENT(WORD, e) uintBitsToFloat(WORD(e))
#else
#define DECODE_ELEMENT(WORD, e) half_from_bits((WORD((e) >> 1) >> (((e) & 1u) * 16u)) & 0xffffu)
#endif

// ---- block types (issue 3), in the GPU layout written by vks_op_pack_weights ----
// WTYPE 3 = Q8_0: the int8 quants of all WEIGHT_COUNT elements first (element e
//           at byte e), then the f16 scales of the WEIGHT_COUNT/32 blocks (block
//           b in word SCALE0 + b/2, low half first).
// WTYPE 4 = Q4_0: 16 bytes of nibbles per block first (llama.cpp order: byte j
//           of block b holds element 32b+j in its low and 32b+j+16 in its high
//           nibble), then the f16 scales as for Q8_0.
// WTYPE 5 = Q4_K: llama.cpp's 144-byte blocks unchanged (36 words, so every
//           block starts 16-byte aligned): word 0 = f16 d | f16 dmin << 16,
//           words 1-3 = 12 bytes of 6-bit scales and mins, words 4-35 = quants.
// A shader including this for WTYPE 3 or 4 defines WEIGHT_COUNT (elements of
// the bound matrix, a multiple of 32) before DECODE_ELEMENT is used.
// DECODE_ELEMENT decodes one element (tiled matmul, embed); matvec_q.comp
// decodes whole 32-element units with the *_unit helpers below.
// f16 scale of block b given its scale word.
float block_scale(uint scale_word, uint b) {
    return unpackHalf2x16(scale_word >> ((b & 1u) * 16u)).x;
}

#if WTYPE == 3
#define SCALE0 (uint(WEIGHT_COUNT) / 4u)
float q8_0_element(uint qword, uint scale_word, uint e) {
    return block_scale(scale_word, e >> 5) * float(bitfieldExtract(int(qword), int((e & 3u) * 8u), 8));
}
#undef DECODE_ELEMENT
#define DECODE_ELEMENT(WORD, e) q8_0_element(WORD((e) >> 2), WORD(SCALE0 + ((e) >> 6)), (e))
#elif WTYPE == 4
#define SCALE0 (uint(WEIGHT_COUNT) / 8u)
float q4_0_element(uint qword, uint scale_word, uint e) {
    uint shift = (e & 3u) * 8u + ((e >> 4) & 1u) * 4u;
    return block_scale(scale_word, e >> 5) * (float((qword >> shift) & 15u) - 8.0);
}
#undef DECODE_ELEMENT
#define DECODE_ELEMENT(WORD, e) \
    q4_0_element(WORD(((e) >> 5) * 4u + (((e) & 15u) >> 2)), WORD(SCALE0 + ((e) >> 6)), (e))
#elif WTYPE == 5
// 6-bit scale (x) and min (y) of sub-block s (0..7) from the 12 scale bytes.
uvec2 q4_k_scale_min(uvec3 sc, uint s) {
#define SC_BYTE(i) ((sc[(i) >> 2] >> (((i) & 3u) * 8u)) & 255u)
    if (s < 4u) return uvec2(SC_BYTE(s) & 63u, SC_BYTE(s + 4u) & 63u);
    return uvec2((SC_BYTE(s + 4u) & 15u) | ((SC_BYTE(s - 4u) >> 6) << 4),
                 (SC_BYTE(s + 4u) >> 4) | ((SC_BYTE(s) >> 6) << 4));
#undef SC_BYTE
}
// Element e (index within the matrix) given its block's words 0..3 and its quant word.
float q4_k_element(uint dword, uvec3 sc, uint qword, uint e) {
    uint s = (e >> 5) & 7u;
    vec2 dm = unpackHalf2x16(dword);
    uvec2 scm = q4_k_scale_min(sc, s);
    uint q = (qword >> ((e & 3u) * 8u + (s & 1u) * 4u)) & 15u;
    return dm.x * float(scm.x) * float(q) - dm.y * float(scm.y);
}
#define Q4K_BLOCK_WORD(e) (36u * ((e) >> 8))
#undef DECODE_ELEMENT
#define DECODE_ELEMENT(WORD, e)                                                              \
    q4_k_element(WORD(Q4K_BLOCK_WORD(e)),                                                   \
                 uvec3(WORD(Q4K_BLOCK_WORD(e) + 1u), WORD(Q4K_BLOCK_WORD(e) + 2u),          \
                       WORD(Q4K_BLOCK_WORD(e) + 3u)),                                       \
                 WORD(Q4K_BLOCK_WORD(e) + 4u + (((e) & 255u) >> 6) * 8u + (((e) & 31u) >> 2)), (e))
#endif

// ---- 4 consecutive elements e..e+3 (e a multiple of 4) of a block type ----
// They share one quant word and one scale (tiled matmul staging), so the quad
// costs two or three word reads instead of four element decodes.
#if WTYPE == 3
#define DECODE_QUAD(WORD, e) q8_0_quad(WORD((e) >> 2), WORD(SCALE0 + ((e) >> 6)), (e))
vec4 q8_0_quad(uint qword, uint scale_word, uint e) {
    ivec4 q = ivec4(bitfieldExtract(int(qword), 0, 8), bitfieldExtract(int(qword), 8, 8),
                    bitfieldExtract(int(qword), 16, 8), bitfieldExtract(int(qword), 24, 8));
    return block_scale(scale_word, e >> 5) * vec4(q);
}
#elif WTYPE == 4
#define DECODE_QUAD(WORD, e) \
    q4_0_quad(WORD(((e) >> 5) * 4u + (((e) & 15u) >> 2)), WORD(SCALE0 + ((e) >> 6)), (e))
vec4 q4_0_quad(uint qword, uint scale_word, uint e) {
    uvec4 q = (uvec4(qword) >> (uvec4(0u, 8u, 16u, 24u) + ((e >> 4) & 1u) * 4u)) & 15u;
    return block_scale(scale_word, e >> 5) * (vec4(q) - 8.0);
}
#elif WTYPE == 5
#define DECODE_QUAD(WORD, e)                                                                 \
    q4_k_quad(WORD(Q4K_BLOCK_WORD(e)),                                                      \
              uvec3(WORD(Q4K_BLOCK_WORD(e) + 1u), WORD(Q4K_BLOCK_WORD(e) + 2u),             \
                    WORD(Q4K_BLOCK_WORD(e) + 3u)),                                          \
              WORD(Q4K_BLOCK_WORD(e) + 4u + (((e) & 255u) >> 6) * 8u + (((e) & 31u) >> 2)), (e))
vec4 q4_k_quad(uint dword, uvec3 sc, uint qword, uint e) {
    uint s = (e >> 5) & 7u;
    vec2 dm = unpackHalf2x16(dword);
    uvec2 scm = q4_k_scale_min(sc, s);
    uvec4 q = (uvec4(qword) >> (uvec4(0u, 8u, 16u, 24u) + (s & 1u) * 4u)) & 15u;
    return dm.x * float(scm.x) * vec4(q) - dm.y * float(scm.y);
}
#endif
