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
