// Element types: sizes, names, and exact conversions to and from double.
// fp32, fp16 and bf16 are handled by one routine parameterised by exponent and
// mantissa width, working on bits: no intermediate float rounding (double
// rounding through fp32 for bf16), no dependence on the FPU rounding mode, and
// NaN payloads (signalling ones too) survive a widen/narrow round trip.
#include <bit>
#include <cmath>
#include <cstring>

#include "slice_codec.h"

namespace gradtrace {
namespace {

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian; so is this code");

struct Narrow {
  int ebits;
  int mbits;
};
constexpr Narrow kHalf{5, 10};
constexpr Narrow kBf16{8, 7};
constexpr Narrow kFp32{8, 23};

double NarrowToDouble(uint32_t bits, Narrow f) {
  const uint64_t sign = static_cast<uint64_t>(bits >> (f.ebits + f.mbits)) & 1;
  const uint64_t exp = (bits >> f.mbits) & ((1u << f.ebits) - 1);
  const uint64_t man = bits & ((1u << f.mbits) - 1);
  const int bias = (1 << (f.ebits - 1)) - 1;
  uint64_t out;
  if (exp == (1u << f.ebits) - 1) {
    // Inf or NaN: keep the NaN payload in the top mantissa bits.
    out = (sign << 63) | (uint64_t{0x7ff} << 52) | (man << (52 - f.mbits));
  } else if (exp == 0) {
    // Zero or subnormal: man * 2^(1 - bias - mbits), exact in double.
    double v = std::ldexp(static_cast<double>(man), 1 - bias - f.mbits);
    return sign ? -v : v;
  } else {
    out = (sign << 63) | ((exp - bias + 1023) << 52) | (man << (52 - f.mbits));
  }
  return std::bit_cast<double>(out);
}

// Rounds v to the narrow format, round-to-nearest-even, overflow to Inf.
uint32_t DoubleToNarrow(double v, Narrow f) {
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  const uint64_t sign = (bits >> 63) << (f.ebits + f.mbits);
  const uint64_t dexp = (bits >> 52) & 0x7ff;
  const uint64_t dman = bits & ((uint64_t{1} << 52) - 1);
  const uint64_t inf = ((uint64_t{1} << f.ebits) - 1) << f.mbits;
  if (dexp == 0x7ff) {
    if (dman == 0) return static_cast<uint32_t>(sign | inf);
    uint64_t man = dman >> (52 - f.mbits);
    if (man == 0) man = uint64_t{1} << (f.mbits - 1);  // payload lost: make it a quiet NaN
    return static_cast<uint32_t>(sign | inf | man);
  }
  // v = m * 2^(e - 52) with m < 2^53.
  const uint64_t m = dexp == 0 ? dman : dman | (uint64_t{1} << 52);
  const int e = dexp == 0 ? -1022 : static_cast<int>(dexp) - 1023;
  const int bias = (1 << (f.ebits - 1)) - 1;
  const int emin = 1 - bias;
  const int e_eff = e < emin ? emin : e;
  // Keep mbits fraction bits at exponent e_eff: q = round(m / 2^shift).
  const int shift = 52 - f.mbits + (e_eff - e);
  uint64_t q = 0;
  if (shift < 64) {
    q = m >> shift;
    const uint64_t rem = m & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }  // else m < 2^53 <= half an ulp: rounds to zero.
  // q carries the implicit bit for normals; adding it to the biased exponent
  // field minus one handles subnormals (field 0) and a rounding carry into the
  // exponent in one step.
  const uint64_t field = (static_cast<uint64_t>(e_eff + bias - 1) << f.mbits) + q;
  if (field >= inf) return static_cast<uint32_t>(sign | inf);
  return static_cast<uint32_t>(sign | field);
}

}  // namespace

size_t DTypeSize(pb::DType dtype) {
  switch (dtype) {
    case pb::FP32:
      return 4;
    case pb::FP16:
    case pb::BF16:
      return 2;
    case pb::FP64:
      return 8;
    default:
      return 0;
  }
}

const char* DTypeName(pb::DType dtype) {
  switch (dtype) {
    case pb::FP32:
      return "fp32";
    case pb::FP16:
      return "fp16";
    case pb::BF16:
      return "bf16";
    case pb::FP64:
      return "fp64";
    default:
      return "unknown";
  }
}

bool ParseDType(const std::string& name, pb::DType* out) {
  static constexpr struct {
    const char* name;
    pb::DType dtype;
  } kNames[] = {{"fp32", pb::FP32}, {"float32", pb::FP32},  {"fp16", pb::FP16}, {"float16", pb::FP16},
                {"bf16", pb::BF16}, {"bfloat16", pb::BF16}, {"fp64", pb::FP64}, {"float64", pb::FP64}};
  for (const auto& n : kNames) {
    if (name == n.name) {
      *out = n.dtype;
      return true;
    }
  }
  return false;
}

double ElementToDouble(pb::DType dtype, const uint8_t* p) {
  switch (dtype) {
    case pb::FP32: {
      uint32_t b;
      std::memcpy(&b, p, 4);
      return NarrowToDouble(b, kFp32);
    }
    case pb::FP16:
    case pb::BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return NarrowToDouble(b, dtype == pb::FP16 ? kHalf : kBf16);
    }
    case pb::FP64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    default:
      return std::nan("");
  }
}

void DoubleToElement(pb::DType dtype, double v, uint8_t* p) {
  switch (dtype) {
    case pb::FP32: {
      const uint32_t b = DoubleToNarrow(v, kFp32);
      std::memcpy(p, &b, 4);
      return;
    }
    case pb::FP16:
    case pb::BF16: {
      const auto b = static_cast<uint16_t>(DoubleToNarrow(v, dtype == pb::FP16 ? kHalf : kBf16));
      std::memcpy(p, &b, 2);
      return;
    }
    case pb::FP64:
      std::memcpy(p, &v, 8);
      return;
    default:
      return;
  }
}

}  // namespace gradtrace
