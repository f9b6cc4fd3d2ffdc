// Element types: the one table (dtype.h), sizes, names, and exact conversions to and from double.
// fp32, fp16 and bf16 are handled by one routine parameterised by exponent and
// mantissa width, working on bits: no intermediate float rounding (double
// rounding through fp32 for bf16), no dependence on the FPU rounding mode, and
// NaN payloads (signalling ones too) survive a widen/narrow round trip.
#include "dtype.h"

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>

namespace gradtrace {
namespace {

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian; so is this code");

// FORMAT.md 4.4, in enum order (FindDType indexes it by value - 1).
constexpr DTypeInfo kDTypes[] = {
    {pb::FP32, "FP32", 4, 8, 23},
    {pb::FP16, "FP16", 2, 5, 10},
    {pb::BF16, "BF16", 2, 8, 7},
    {pb::FP64, "FP64", 8, 11, 52},
};
static_assert(std::size(kDTypes) == pb::DType_MAX, "a DType value without a row in kDTypes");
// What ElementToDouble and DoubleToElement can convert from the row alone: IEEE-style binary formats
// (sign, exponent, mantissa filling the element) of at most 4 bytes, and binary64.
constexpr bool RowsAreConvertible() {
  for (const DTypeInfo& r : kDTypes) {
    const bool binary64 = r.size == 8 && r.exponent_bits == 11 && r.mantissa_bits == 52;
    const bool narrow = r.size <= 4 && 1 + r.exponent_bits + r.mantissa_bits == static_cast<int>(8 * r.size);
    if (!binary64 && !narrow) return false;
  }
  return true;
}
static_assert(RowsAreConvertible(), "a kDTypes row the generic conversions cannot handle");

// The other spellings, each naming one dtype: the names the ML frameworks use
// (torch.float32 -> "float32", numpy's "float16", torch.half -> "half").
constexpr struct {
  const char* alias;
  pb::DType dtype;
} kAliases[] = {
    {"fp32", pb::FP32}, {"float32", pb::FP32},  {"fp16", pb::FP16}, {"float16", pb::FP16}, {"half", pb::FP16},
    {"bf16", pb::BF16}, {"bfloat16", pb::BF16}, {"fp64", pb::FP64}, {"float64", pb::FP64}, {"double", pb::FP64},
};

constexpr const DTypeInfo& Row(pb::DType d) { return kDTypes[d - 1]; }
static_assert(Row(pb::FP16).dtype == pb::FP16 && Row(pb::FP64).dtype == pb::FP64, "kDTypes is in enum order");

bool SameIgnoringCase(const std::string& a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

struct Narrow {
  int ebits;
  int mbits;
};

// The N little-endian bytes at p as an unsigned integer (N a constant: the copy inlines).
template <typename Bits, size_t N>
Bits LoadBits(const uint8_t* p) {
  Bits b = 0;
  std::memcpy(&b, p, N);
  return b;
}

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

std::span<const DTypeInfo> DTypes() { return kDTypes; }

const DTypeInfo* FindDType(pb::DType dtype) {
  if (dtype < 1 || dtype > pb::DType_MAX) return nullptr;
  return &Row(dtype);
}

size_t DTypeSize(pb::DType dtype) {
  const DTypeInfo* row = FindDType(dtype);
  return row ? row->size : 0;
}

const char* DTypeName(pb::DType dtype) {
  const DTypeInfo* row = FindDType(dtype);
  return row ? row->name : "unknown";
}

std::vector<std::string> DTypeAliases(pb::DType dtype) {
  std::vector<std::string> out;
  for (const auto& a : kAliases) {
    if (a.dtype == dtype) out.push_back(a.alias);
  }
  return out;
}

bool ParseDType(const std::string& name, pb::DType* out) {
  for (const DTypeInfo& row : kDTypes) {
    if (SameIgnoringCase(name, row.name)) {
      *out = row.dtype;
      return true;
    }
  }
  for (const auto& a : kAliases) {
    if (SameIgnoringCase(name, a.alias)) {
      *out = a.dtype;
      return true;
    }
  }
  return false;
}

std::string DTypeNamesInWords() {
  std::string out;
  for (size_t i = 0; i < std::size(kDTypes); ++i) {
    out += (i == 0 ? "" : i + 1 == std::size(kDTypes) ? " or " : ", ") + std::string(kDTypes[i].name);
  }
  return out;
}

// Driven by the row: binary64 is already a double; every narrower format goes
// through the generic routines with the row's exponent and mantissa widths.
namespace {

// Any row of the table, from the row alone: binary64 is already a double; a narrower format goes
// through the generic routine with the row's widths.
double RowToDouble(const DTypeInfo& row, const uint8_t* p) {
  const Narrow f{row.exponent_bits, row.mantissa_bits};
  switch (row.size) {
    case 8:
      return std::bit_cast<double>(LoadBits<uint64_t, 8>(p));
    case 4:
      return NarrowToDouble(LoadBits<uint32_t, 4>(p), f);
    case 2:
      return NarrowToDouble(LoadBits<uint32_t, 2>(p), f);
    default:
      return NarrowToDouble(LoadBits<uint32_t, 1>(p), f);
  }
}

}  // namespace

double ElementToDouble(pb::DType dtype, const uint8_t* p) {
  // The four formats readers decode most, with their widths as constants (about 8% of a full read);
  // every other row takes the generic path.
  constexpr auto kFp32 = Row(pb::FP32), kFp16 = Row(pb::FP16), kBf16 = Row(pb::BF16);
  switch (dtype) {
    case pb::FP32:
      return NarrowToDouble(LoadBits<uint32_t, 4>(p), Narrow{kFp32.exponent_bits, kFp32.mantissa_bits});
    case pb::FP16:
      return NarrowToDouble(LoadBits<uint32_t, 2>(p), Narrow{kFp16.exponent_bits, kFp16.mantissa_bits});
    case pb::BF16:
      return NarrowToDouble(LoadBits<uint32_t, 2>(p), Narrow{kBf16.exponent_bits, kBf16.mantissa_bits});
    case pb::FP64:
      return std::bit_cast<double>(LoadBits<uint64_t, 8>(p));
    default: {
      const DTypeInfo* row = FindDType(dtype);
      return row ? RowToDouble(*row, p) : std::nan("");
    }
  }
}

void DoubleToElement(pb::DType dtype, double v, uint8_t* p) {
  const DTypeInfo* row = FindDType(dtype);
  if (row == nullptr) return;
  if (row->size == 8) {
    std::memcpy(p, &v, 8);
    return;
  }
  const uint32_t bits = DoubleToNarrow(v, Narrow{row->exponent_bits, row->mantissa_bits});
  std::memcpy(p, &bits, row->size);  // the low bytes: little-endian
}

}  // namespace gradtrace
