// The element types of the trace format (FORMAT.md 4.4): the one table every
// part reads, C++ directly and Python through _gtcodec. Each dtype has one
// canonical name, the enum name FORMAT.md, proto JSON, the reports and the
// Python dicts spell ("FP32"), and a few aliases accepted on input ("fp32",
// "float32"); names are matched ignoring ASCII case. A new dtype is one DType value
// in gradtrace.proto and one row in dtype.cc: widening, narrowing, decoding and
// stats follow from its size and widths (IEEE-style formats up to 4 bytes, and
// binary64; a static_assert refuses a row they cannot convert).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gradtrace.pb.h"

namespace gradtrace {

struct DTypeInfo {
  pb::DType dtype;
  const char* name;   // canonical: the enum name
  size_t size;        // bytes per element
  int exponent_bits;  // of the stored encoding
  int mantissa_bits;  // stored fraction bits: the unit roundoff is 2^-(mantissa_bits + 1)
};

// Every dtype of the format, in enum order.
std::span<const DTypeInfo> DTypes();

// The row of `dtype`; null for DTYPE_UNSPECIFIED and values the format does not define.
const DTypeInfo* FindDType(pb::DType dtype);

size_t DTypeSize(pb::DType dtype);       // 0 for unknown
const char* DTypeName(pb::DType dtype);  // the canonical name ("FP32"); "unknown" for unknown

// The other spellings each dtype is accepted as ("fp32", "float32", ...), in one list.
std::vector<std::string> DTypeAliases(pb::DType dtype);

// `name` in any case: a canonical name or an alias. False (and `out` untouched) otherwise.
bool ParseDType(const std::string& name, pb::DType* out);

// For messages: "FP32, FP16, BF16 or FP64".
std::string DTypeNamesInWords();

// Exact widening of one element to double, and rounding a double to the dtype (round-to-nearest-even).
double ElementToDouble(pb::DType dtype, const uint8_t* p);
void DoubleToElement(pb::DType dtype, double v, uint8_t* p);

}  // namespace gradtrace
