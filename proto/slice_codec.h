// Building and decoding Slice payloads in the three capture modes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtype.h"
#include "gradtrace.pb.h"
#include "status.h"

namespace gradtrace {

// Capture mode as on the command line: "full", "sketch:K" or "stats".
struct CaptureMode {
  enum class Kind { kFull, kSketch, kStats } kind = Kind::kFull;
  int32_t k = 0;  // sketch size
  std::string ToString() const;
};
Expected<CaptureMode> ParseCaptureMode(const std::string& text);

// Byte-shuffle: for n elements of `width` bytes, output byte j*n + i is input
// byte i*width + j (all first bytes, then all second bytes, ...).
void ByteShuffle(const uint8_t* in, size_t n, size_t width, uint8_t* out);
void ByteUnshuffle(const uint8_t* in, size_t n, size_t width, uint8_t* out);

// The sketch positions of a parameter: the first min(k, numel) values of a
// pseudo-random permutation of [0, numel) keyed by the parameter's name
// (FORMAT.md, "Sketch positions"), sorted ascending. Independent of slicing.
std::vector<int64_t> SketchPositions(const std::string& param_name, int64_t numel, int32_t k);
// The sketch part of MakeSlice: of a parameter's `positions` (SketchPositions,
// sorted), those inside [offset, offset + count) with their values widened
// exactly to double.
void FillSketch(const std::vector<int64_t>& positions, int64_t offset, int64_t count, pb::DType dtype, const void* data,
                int32_t k, pb::SketchPayload* out);

// `data` holds `count` elements of `dtype` (little-endian), elements
// [offset, offset+count) of parameter `param`. By mode:
//  full:   the bytes, byte-shuffled (shuffled = true).
//  sketch: the SketchPositions(param.name(), numel, k) inside the range, with
//          their values widened exactly to double; numel is param.numel(), or
//          the product of param.shape() when numel is 0.
//  stats:  count and nonfinite (NaN/Inf) elements; sum, sum_sq and abs_max
//          over the finite ones (SliceMoments, moments.h: one vectorized pass,
//          compensated double sums in a fixed order, error bound there).
// The caller guarantees the sizes (a programmer error otherwise); the writer
// re-checks records against RunInfo before writing them. A producer that
// caches SketchPositions per parameter passes them as `sketch_positions`.
pb::Slice MakeSlice(const pb::ParamInfo& param, int64_t offset, int64_t count, pb::DType dtype, const void* data,
                    const CaptureMode& mode, const std::vector<int64_t>* sketch_positions = nullptr);

// Values of a full slice widened to double, in element order. Checks that the
// payload size matches count * DTypeSize(dtype).
Expected<std::vector<double>> DecodeFullValues(const pb::Slice& slice);
// Adds the values of a full slice onto out[0, count): unshuffle, widening and
// accumulation in one pass, without a temporary the size of the slice. Checks
// the payload size as DecodeFullValues does. T is double, or float for slices
// of at most 32-bit dtypes (exact: fp32, bf16 and fp16 values are floats);
// an fp64 slice into float is InvalidArgument.
template <typename T>
Status AddFullValues(const pb::Slice& slice, T* out);
// The same for elements [first, first + count) of the slice only, onto
// out[0, count): a window of a parameter larger than memory should hold.
// InvalidArgument when the range is not inside the slice.
template <typename T>
Status AddFullValueRange(const pb::Slice& slice, int64_t first, int64_t count, T* out);
// AddFullValues from the slice's bytes held in `data` (record_view.h), not in the slice.
template <typename T>
Status AddFullValues(const pb::Slice& slice, std::string_view data, T* out);
// The same, writing the values (out[i] = element) instead of adding them (no
// zeroed buffer needed), from the slice's bytes held in `data` (record_view.h).
template <typename T>
Status CopyFullValueRange(const pb::Slice& slice, std::string_view data, int64_t first, int64_t count, T* out);
// Raw little-endian element bytes of a full slice (unshuffled).
Expected<std::string> DecodeFullBytes(const pb::Slice& slice);

// Hex digest over (name, shape, dtype) of every parameter, in order: 16
// lowercase hex digits of FNV-1a 64 over a length-prefixed encoding
// (FORMAT.md, "Model fingerprint").
std::string ModelFingerprint(const pb::RunInfo& run);

}  // namespace gradtrace
