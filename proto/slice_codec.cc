// Capture modes, byte-shuffle, building Slices and decoding full payloads,
// and the model fingerprint.
#include "slice_codec.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "moments.h"
#include "sketch.h"
#include "unshuffle.h"

namespace gradtrace {

std::string CaptureMode::ToString() const {
  switch (kind) {
    case Kind::kFull:
      return "full";
    case Kind::kSketch:
      return "sketch:" + std::to_string(k);
    case Kind::kStats:
      return "stats";
  }
  return "full";
}

Expected<CaptureMode> ParseCaptureMode(const std::string& text) {
  CaptureMode mode;
  if (text == "full") return mode;
  if (text == "stats") {
    mode.kind = CaptureMode::Kind::kStats;
    return mode;
  }
  static constexpr std::string_view kSketch = "sketch:";
  if (text.compare(0, kSketch.size(), kSketch) == 0) {
    const char* first = text.data() + kSketch.size();
    const char* last = text.data() + text.size();
    int64_t k = 0;
    auto [ptr, ec] = std::from_chars(first, last, k);
    if (first != last && *first != '+' && *first != '-' && ec == std::errc() && ptr == last && k > 0 &&
        k <= std::numeric_limits<int32_t>::max()) {
      mode.kind = CaptureMode::Kind::kSketch;
      mode.k = static_cast<int32_t>(k);
      return mode;
    }
    return Status::InvalidArgument("invalid capture mode '" + text + "': K in sketch:K must be an integer in [1, " +
                                   std::to_string(std::numeric_limits<int32_t>::max()) + "]");
  }
  return Status::InvalidArgument("invalid capture mode '" + text + "': expected full, sketch:K (K > 0) or stats");
}

namespace {

// A block at a time, so that the input is read from memory once (not once per
// byte plane) and each plane is written sequentially; W known at compile time
// lets the compiler unroll the gather.
template <size_t W>
void ShuffleBlocks(const uint8_t* in, size_t n, size_t width, uint8_t* out) {
  const size_t w = W == 0 ? width : W;
  constexpr size_t kBlock = 4096;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t m = n - begin < kBlock ? n - begin : kBlock;
    const uint8_t* src = in + begin * w;
    for (size_t j = 0; j < w; ++j) {
      uint8_t* plane = out + j * n + begin;
      for (size_t i = 0; i < m; ++i) plane[i] = src[i * w + j];
    }
  }
}

}  // namespace

void ByteShuffle(const uint8_t* in, size_t n, size_t width, uint8_t* out) {
  switch (width) {
    case 2:
      return ShuffleBlocks<2>(in, n, width, out);
    case 4:
      return ShuffleBlocks<4>(in, n, width, out);
    case 8:
      return ShuffleBlocks<8>(in, n, width, out);
    default:
      return ShuffleBlocks<0>(in, n, width, out);
  }
}

void ByteUnshuffle(const uint8_t* in, size_t n, size_t width, uint8_t* out) {
  for (size_t j = 0; j < width; ++j) {
    const uint8_t* plane = in + j * n;
    for (size_t i = 0; i < n; ++i) out[i * width + j] = plane[i];
  }
}

namespace {

int64_t ParamNumel(const pb::ParamInfo& param) {
  if (param.numel() > 0) return param.numel();
  int64_t n = 1;
  for (int64_t d : param.shape()) n *= d;
  return n;
}

}  // namespace

pb::Slice MakeSlice(const pb::ParamInfo& param, int64_t offset, int64_t count, pb::DType dtype, const void* data,
                    const CaptureMode& mode, const std::vector<int64_t>* sketch_positions) {
  pb::Slice s;
  s.set_param_id(param.id());
  s.set_offset(offset);
  s.set_count(count);
  s.set_dtype(dtype);
  const size_t w = DTypeSize(dtype);
  const auto* p = static_cast<const uint8_t*>(data);
  switch (mode.kind) {
    case CaptureMode::Kind::kFull: {
      pb::FullPayload* full = s.mutable_full();
      std::string* bytes = full->mutable_data();
      bytes->resize(static_cast<size_t>(count) * w);
      ByteShuffle(p, static_cast<size_t>(count), w, reinterpret_cast<uint8_t*>(bytes->data()));
      full->set_shuffled(true);
      break;
    }
    case CaptureMode::Kind::kSketch: {
      if (sketch_positions != nullptr) {
        FillSketch(*sketch_positions, offset, count, dtype, p, mode.k, s.mutable_sketch());
      } else {
        FillSketch(SketchPositions(param.name(), ParamNumel(param), mode.k), offset, count, dtype, p, mode.k,
                   s.mutable_sketch());
      }
      break;
    }
    case CaptureMode::Kind::kStats:
      SliceMoments(dtype, p, count).Fill(s.mutable_stats());
      break;
  }
  return s;
}

namespace {

// The element width of a full slice whose payload (`data`) holds exactly `count` elements.
Expected<size_t> FullSliceWidth(const pb::Slice& slice, std::string_view data) {
  if (!slice.has_full()) return Status::InvalidArgument("slice has no full payload");
  const size_t w = DTypeSize(slice.dtype());
  if (w == 0) return Status::Corruption("slice has unknown dtype " + std::to_string(slice.dtype()));
  const int64_t count = slice.count();
  if (count < 0 || static_cast<uint64_t>(count) > data.size() / w || data.size() != static_cast<size_t>(count) * w) {
    return Status::Corruption("full slice payload size mismatch (expected " + std::to_string(count) + " x " +
                              std::to_string(w) + " bytes, got " + std::to_string(data.size()) + ")");
  }
  return w;
}

}  // namespace

Expected<std::string> DecodeFullBytes(const pb::Slice& slice) {
  Expected<size_t> width = FullSliceWidth(slice, slice.full().data());
  if (!width.ok()) return width.status();
  const size_t w = *width;
  const std::string& data = slice.full().data();
  const int64_t count = slice.count();
  if (!slice.full().shuffled()) return data;
  std::string out(data.size(), '\0');
  ByteUnshuffle(reinterpret_cast<const uint8_t*>(data.data()), static_cast<size_t>(count), w,
                reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

namespace {

// out[i] += element i (kAdd), or out[i] = element i, for n elements W bytes
// wide, stored plain or byte-shuffled. Shuffled input is reassembled straight
// from its W byte planes (plane k holds byte k of every element), with no
// transposition buffer: the loop vectorizes.
// Elements [first, first + count) of the n stored go to out[0, count).
template <bool kAdd, size_t W, typename Bits, typename ToDouble, typename T>
void PutElements(const uint8_t* data, size_t n, size_t first, size_t count, bool shuffled, ToDouble to_double, T* out) {
  const auto put = [out](size_t i, T v) {
    if constexpr (kAdd) {
      out[i] += v;
    } else {
      out[i] = v;
    }
  };
  if (!shuffled) {
    data += first * W;
    for (size_t i = 0; i < count; ++i) {
      Bits bits;
      std::memcpy(&bits, data + i * W, W);
      put(i, static_cast<T>(to_double(bits)));
    }
    return;
  }
  const uint8_t* plane[W];
  for (size_t k = 0; k < W; ++k) plane[k] = data + k * n + first;
  for (size_t i = 0; i < count; ++i) {
    Bits bits = 0;
    for (size_t k = 0; k < W; ++k) bits |= static_cast<Bits>(plane[k][i]) << (8 * k);
    put(i, static_cast<T>(to_double(bits)));
  }
}

// Elements of a dtype without a fast path above, each widened by the dtype table's ElementToDouble.
template <bool kAdd, typename T>
void PutWidened(pb::DType dtype, const uint8_t* p, size_t n, size_t first, size_t count, bool shuffled, T* out) {
  const auto widen = [dtype](auto bits) {
    uint8_t e[sizeof bits];
    std::memcpy(e, &bits, sizeof bits);  // little-endian, as stored
    return ElementToDouble(dtype, e);
  };
  switch (DTypeSize(dtype)) {
    case 1:
      PutElements<kAdd, 1, uint8_t>(p, n, first, count, shuffled, widen, out);
      break;
    case 2:
      PutElements<kAdd, 2, uint16_t>(p, n, first, count, shuffled, widen, out);
      break;
    case 4:
      PutElements<kAdd, 4, uint32_t>(p, n, first, count, shuffled, widen, out);
      break;
    default:
      PutElements<kAdd, 8, uint64_t>(p, n, first, count, shuffled, widen, out);
      break;
  }
}

template <bool kAdd, typename T>
Status FullValueRange(const pb::Slice& slice, std::string_view data, int64_t first, int64_t count, T* out) {
  static_assert(std::endian::native == std::endian::little, "the trace format is little-endian");
  Expected<size_t> width = FullSliceWidth(slice, data);
  if (!width.ok()) return width.status();
  if (first < 0 || count < 0 || first > slice.count() || count > slice.count() - first) {
    return Status::InvalidArgument("elements [" + std::to_string(first) + ", +" + std::to_string(count) +
                                   ") outside a slice of " + std::to_string(slice.count()));
  }
  if (sizeof(T) < 8 && slice.dtype() == pb::FP64) return Status::InvalidArgument("fp64 slice into float values");
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const auto n = static_cast<size_t>(slice.count()), f = static_cast<size_t>(first), c = static_cast<size_t>(count);
  const bool sh = slice.full().shuffled();
  switch (slice.dtype()) {
    case pb::FP32: {
      size_t done = 0;
      if constexpr (std::is_same_v<T, float>) done = sh ? UnshuffleFloats(p, n, f, c, out, kAdd) : 0;
      PutElements<kAdd, 4, uint32_t>(
          p, n, f + done, c - done, sh, [](uint32_t b) { return static_cast<double>(std::bit_cast<float>(b)); },
          out + done);
      break;
    }
    case pb::FP64:
      PutElements<kAdd, 8, uint64_t>(
          p, n, f, c, sh, [](uint64_t b) { return std::bit_cast<double>(b); }, out);
      break;
    case pb::BF16:
      PutElements<kAdd, 2, uint16_t>(
          p, n, f, c, sh, [](uint16_t b) { return static_cast<double>(std::bit_cast<float>(uint32_t{b} << 16)); }, out);
      break;
    default:  // FP16 and any other row of the dtype table: its exact widening is ElementToDouble
      PutWidened<kAdd>(slice.dtype(), p, n, f, c, sh, out);
      break;
  }
  return Status::Ok();
}

}  // namespace

template <typename T>
Status AddFullValueRange(const pb::Slice& slice, int64_t first, int64_t count, T* out) {
  return FullValueRange<true>(slice, slice.full().data(), first, count, out);
}

template <typename T>
Status CopyFullValueRange(const pb::Slice& slice, std::string_view data, int64_t first, int64_t count, T* out) {
  return FullValueRange<false>(slice, data, first, count, out);
}

template <typename T>
Status AddFullValues(const pb::Slice& slice, T* out) {
  return AddFullValueRange(slice, 0, slice.count(), out);
}

template <typename T>
Status AddFullValues(const pb::Slice& slice, std::string_view data, T* out) {
  return FullValueRange<true>(slice, data, 0, slice.count(), out);
}

template Status AddFullValues<double>(const pb::Slice& slice, double* out);
template Status AddFullValues<float>(const pb::Slice& slice, float* out);
template Status AddFullValues<double>(const pb::Slice& slice, std::string_view data, double* out);
template Status AddFullValues<float>(const pb::Slice& slice, std::string_view data, float* out);
template Status AddFullValueRange<double>(const pb::Slice& slice, int64_t first, int64_t count, double* out);
template Status AddFullValueRange<float>(const pb::Slice& slice, int64_t first, int64_t count, float* out);
template Status CopyFullValueRange<double>(const pb::Slice&, std::string_view, int64_t, int64_t, double*);
template Status CopyFullValueRange<float>(const pb::Slice&, std::string_view, int64_t, int64_t, float*);

Expected<std::vector<double>> DecodeFullValues(const pb::Slice& slice) {
  Expected<std::string> bytes = DecodeFullBytes(slice);
  if (!bytes.ok()) return bytes.status();
  const size_t w = DTypeSize(slice.dtype());
  std::vector<double> out(bytes->size() / w);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes->data());
  for (size_t i = 0; i < out.size(); ++i) out[i] = ElementToDouble(slice.dtype(), p + i * w);
  return out;
}

std::string ModelFingerprint(const pb::RunInfo& run) {
  // FNV-1a 64 over a length-prefixed little-endian encoding (FORMAT.md,
  // "Model fingerprint"), so that no two parameter lists share an encoding.
  uint64_t h = sketch::kFnvOffset;
  auto put = [&h](uint64_t v, int bytes) {
    char buf[8];
    for (int i = 0; i < bytes; ++i) buf[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    h = sketch::Fnv1a64(std::string_view(buf, bytes), h);
  };
  put(static_cast<uint64_t>(run.params_size()), 4);
  for (const pb::ParamInfo& p : run.params()) {
    put(p.name().size(), 4);
    h = sketch::Fnv1a64(p.name(), h);
    put(static_cast<uint64_t>(p.shape_size()), 4);
    for (int64_t d : p.shape()) put(static_cast<uint64_t>(d), 8);
    put(static_cast<uint32_t>(p.dtype()), 4);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[i] = kHex[h & 0xf];
  return out;
}

}  // namespace gradtrace
