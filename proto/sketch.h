// The pieces of the sketch-position algorithm (FORMAT.md, "Sketch positions"),
// exposed so tests and second implementations can check them step by step.
// SketchPositions() in slice_codec.h is the entry point producers use.
#pragma once

#include <cstdint>
#include <string_view>

namespace gradtrace::sketch {

// FNV-1a, 64-bit: offset basis 0xcbf29ce484222325, prime 0x100000001b3.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline constexpr uint64_t kFnvPrime = 0x100000001b3ull;
uint64_t Fnv1a64(std::string_view bytes, uint64_t h = kFnvOffset);

// SplitMix64's finalizer: a bijective 64-bit mixer.
uint64_t Mix64(uint64_t z);

inline constexpr int kFeistelRounds = 6;
inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// A keyed permutation of [0, n): a balanced Feistel network over the smallest
// domain 4^h >= n (h >= 1), restricted to [0, n) by cycle walking.
class Permutation {
 public:
  Permutation(uint64_t key, uint64_t n);  // n >= 1
  uint64_t half_bits() const { return h_; }
  // The Feistel permutation of the whole domain [0, 4^h).
  uint64_t Feistel(uint64_t x) const;
  // The permutation of [0, n); requires i < n.
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t n_;
  unsigned h_;
  uint64_t mask_;  // low h bits
  uint64_t round_keys_[kFeistelRounds];
};

}  // namespace gradtrace::sketch
