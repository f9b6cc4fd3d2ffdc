// Sketch positions: a keyed pseudo-random permutation evaluated only at the
// first k indices, so the cost is O(k) whatever the parameter's size, and the
// positions depend on (name, numel, k) alone, never on how the parameter is
// sliced across ranks.
#include "sketch.h"

#include <algorithm>
#include <cassert>

#include "slice_codec.h"

namespace gradtrace {
namespace sketch {

uint64_t Fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Permutation::Permutation(uint64_t key, uint64_t n) : n_(n), h_(1) {
  assert(n >= 1);
  // Smallest h >= 1 with 4^h >= n; h == 32 covers every uint64 n.
  while (h_ < 32 && (uint64_t{1} << (2 * h_)) < n) ++h_;
  mask_ = (uint64_t{1} << h_) - 1;
  for (int r = 0; r < kFeistelRounds; ++r) round_keys_[r] = Mix64(key + static_cast<uint64_t>(r + 1) * kGoldenGamma);
}

uint64_t Permutation::Feistel(uint64_t x) const {
  uint64_t left = (x >> h_) & mask_;
  uint64_t right = x & mask_;
  for (int r = 0; r < kFeistelRounds; ++r) {
    uint64_t next = left ^ (Mix64(right ^ round_keys_[r]) & mask_);
    left = right;
    right = next;
  }
  return (left << h_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  assert(i < n_);
  // Cycle walking: the cycle of the domain permutation through i returns to
  // i < n, so this terminates; the domain is < 4n, so on average the walk takes
  // fewer than 4 steps.
  uint64_t y = Feistel(i);
  while (y >= n_) y = Feistel(y);
  return y;
}

}  // namespace sketch

std::vector<int64_t> SketchPositions(const std::string& param_name, int64_t numel, int32_t k) {
  std::vector<int64_t> out;
  if (numel <= 0 || k <= 0) return out;
  const uint64_t n = static_cast<uint64_t>(numel);
  const uint64_t m = std::min<uint64_t>(n, static_cast<uint64_t>(k));
  const sketch::Permutation perm(sketch::Fnv1a64(param_name), n);
  out.reserve(m);
  for (uint64_t i = 0; i < m; ++i) out.push_back(static_cast<int64_t>(perm(i)));
  std::sort(out.begin(), out.end());
  return out;
}

void FillSketch(const std::vector<int64_t>& positions, int64_t offset, int64_t count, pb::DType dtype, const void* data,
                int32_t k, pb::SketchPayload* out) {
  const size_t w = DTypeSize(dtype);
  const auto* p = static_cast<const uint8_t*>(data);
  out->set_k(k);
  for (auto it = std::lower_bound(positions.begin(), positions.end(), offset);
       it != positions.end() && *it - offset < count; ++it) {
    out->add_positions(*it);
    out->add_values(ElementToDouble(dtype, p + (*it - offset) * w));
  }
}

}  // namespace gradtrace
