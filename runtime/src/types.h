// Element types and reduction operators shared by the host and CUDA backends.
//
// float16 and bfloat16 are plain 16-bit values converted through float in software, so both backends
// produce bit-identical results (round to nearest even, like numpy's float16 and torch's bfloat16).
#pragma once
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define TACCL_HD __host__ __device__ __forceinline__
#else
#define TACCL_HD inline
#endif

namespace taccl {

struct f16 { uint16_t bits; };
struct bf16 { uint16_t bits; };

TACCL_HD float bitsToFloat(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
TACCL_HD uint32_t floatToBits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

TACCL_HD float toFloat(f16 h) {
  uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bitsToFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return bitsToFloat(sign);
    float v = (float)man * (1.0f / 16777216.0f);  // subnormal: man * 2^-24
    return sign ? -v : v;
  }
  return bitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

TACCL_HD f16 toF16(float f) {
  uint32_t x = floatToBits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  f16 r;
  if (ax >= 0x7f800000u) {  // inf or nan
    r.bits = (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    return r;
  }
  if (ax >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    r.bits = (uint16_t)(sign | 0x7c00u);
    return r;
  }
  if (ax < 0x38800000u) {  // below the smallest normal (2^-14): subnormal or zero
    // value = ax as float; subnormal unit is 2^-24. Round to nearest even on the integer count.
    float a = bitsToFloat(ax) * 16777216.0f;  // exact scaling by 2^24
    uint32_t n = (uint32_t)a;
    float frac = a - (float)n;
    if (frac > 0.5f || (frac == 0.5f && (n & 1u))) n++;
    r.bits = (uint16_t)(sign | n);
    return r;
  }
  uint32_t exp = (ax >> 23) - 112u;
  uint32_t man = ax & 0x7fffffu;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  r.bits = (uint16_t)(sign | h);
  return r;
}

TACCL_HD float toFloat(bf16 b) { return bitsToFloat((uint32_t)b.bits << 16); }
TACCL_HD bf16 toBF16(float f) {
  uint32_t x = floatToBits(f);
  bf16 r;
  if ((x & 0x7fffffffu) > 0x7f800000u) { r.bits = (uint16_t)((x >> 16) | 0x40u); return r; }  // quiet nan
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  r.bits = (uint16_t)(x >> 16);
  return r;
}

// Reduction operators. Each is a functor with a static apply(a, b); 16-bit floats go through float.
template <class T> struct Arith {
  TACCL_HD static T add(T a, T b) { return (T)(a + b); }
  TACCL_HD static T mul(T a, T b) { return (T)(a * b); }
  TACCL_HD static T mn(T a, T b) { return b < a ? b : a; }
  TACCL_HD static T mx(T a, T b) { return a < b ? b : a; }
};
// Unsigned arithmetic for the small and signed integer types, so overflow wraps (defined behaviour).
#define TACCL_WRAP_ARITH(T, U)                                                              \
  template <> struct Arith<T> {                                                             \
    TACCL_HD static T add(T a, T b) { return (T)(U)((U)a + (U)b); }                         \
    TACCL_HD static T mul(T a, T b) { return (T)(U)((U)a * (U)b); }                         \
    TACCL_HD static T mn(T a, T b) { return b < a ? b : a; }                                \
    TACCL_HD static T mx(T a, T b) { return a < b ? b : a; }                                \
  };
TACCL_WRAP_ARITH(int8_t, uint32_t)
TACCL_WRAP_ARITH(uint8_t, uint32_t)
TACCL_WRAP_ARITH(int32_t, uint32_t)
TACCL_WRAP_ARITH(uint32_t, uint32_t)
TACCL_WRAP_ARITH(int64_t, uint64_t)
TACCL_WRAP_ARITH(uint64_t, uint64_t)
#undef TACCL_WRAP_ARITH
#define TACCL_HALF_ARITH(T, CONV)                                                            \
  template <> struct Arith<T> {                                                              \
    TACCL_HD static T add(T a, T b) { return CONV(toFloat(a) + toFloat(b)); }                \
    TACCL_HD static T mul(T a, T b) { return CONV(toFloat(a) * toFloat(b)); }                \
    TACCL_HD static T mn(T a, T b) { return toFloat(b) < toFloat(a) ? b : a; }               \
    TACCL_HD static T mx(T a, T b) { return toFloat(a) < toFloat(b) ? b : a; }               \
  };
TACCL_HALF_ARITH(f16, toF16)
TACCL_HALF_ARITH(bf16, toBF16)
#undef TACCL_HALF_ARITH

template <class T> struct OpSum { TACCL_HD static T apply(T a, T b) { return Arith<T>::add(a, b); } };
template <class T> struct OpProd { TACCL_HD static T apply(T a, T b) { return Arith<T>::mul(a, b); } };
template <class T> struct OpMin { TACCL_HD static T apply(T a, T b) { return Arith<T>::mn(a, b); } };
template <class T> struct OpMax { TACCL_HD static T apply(T a, T b) { return Arith<T>::mx(a, b); } };

// X-macros listing every instantiation. Keep in the order of tacclDataType / tacclRedOp (taccl_runtime.h).
#define TACCL_FOR_EACH_TYPE(X) \
  X(0, int8_t) X(1, uint8_t) X(2, int32_t) X(3, uint32_t) X(4, int64_t) X(5, uint64_t) \
  X(6, taccl::f16) X(7, taccl::bf16) X(8, float) X(9, double)
#define TACCL_FOR_EACH_OP(X) X(0, taccl::OpSum) X(1, taccl::OpProd) X(2, taccl::OpMin) X(3, taccl::OpMax)

// Inst<T, Op>::value for a run-time (dtype, op) pair, nullptr if either is unknown: each backend instantiates
// its entry point (a CUDA kernel, a host thread function) for every type and reduction through this one switch.
template <template <class, template <class> class> class Inst>
decltype(Inst<float, OpSum>::value) pickInstance(int dtype, int op) {
#define TACCL_OP_CASE(OI, OP) \
  if (op == OI) return Inst<TYPE, OP>::value;
#define TACCL_TYPE_CASE(TI, T) \
  if (dtype == TI) {           \
    using TYPE = T;            \
    TACCL_FOR_EACH_OP(TACCL_OP_CASE) \
  }
  TACCL_FOR_EACH_TYPE(TACCL_TYPE_CASE)
#undef TACCL_TYPE_CASE
#undef TACCL_OP_CASE
  return nullptr;
}

}  // namespace taccl
