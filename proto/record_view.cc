#include "record_view.h"

#include <cstdint>

namespace gradtrace {
namespace {

constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// Wire-format bytes [p, end), read as protobuf reads them; anything this shape
// does not need (groups, tags beyond 32 bits, lengths beyond 2 GiB) is declined.
struct Wire {
  const uint8_t* p;
  const uint8_t* end;

  bool Varint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) return false;
      const uint8_t b = *p++;
      r |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = r;
        return true;
      }
    }
    return false;
  }
  // A field's tag: its number and wire type, and where its bytes start.
  bool Tag(int* number, int* wire, const uint8_t** start) {
    *start = p;
    uint64_t tag = 0;
    if (!Varint(&tag) || tag > UINT32_MAX || (tag >> 3) == 0) return false;
    *number = static_cast<int>(tag >> 3);
    *wire = static_cast<int>(tag & 7);
    return true;
  }
  bool Length(std::string_view* bytes) {
    uint64_t n = 0;
    if (!Varint(&n) || n > INT32_MAX || n > static_cast<uint64_t>(end - p)) return false;
    *bytes = std::string_view(reinterpret_cast<const char*>(p), static_cast<size_t>(n));
    p += n;
    return true;
  }
  // Skips the value of a field of wire type `wire`.
  bool Skip(int wire) {
    uint64_t v = 0;
    std::string_view bytes;
    switch (wire) {
      case kVarint:
        return Varint(&v);
      case kFixed64:
        return Take(8);
      case kFixed32:
        return Take(4);
      case kLengthDelimited:
        return Length(&bytes);
      default:  // groups: not this shape
        return false;
    }
  }
  bool Take(size_t n) {
    if (n > static_cast<size_t>(end - p)) return false;
    p += n;
    return true;
  }
};

Wire Over(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  return Wire{p, p + bytes.size()};
}

void PutVarint(uint64_t v, std::string* out) {
  for (; v >= 0x80; v >>= 7) out->push_back(static_cast<char>((v & 0x7f) | 0x80));
  out->push_back(static_cast<char>(v));
}

// A length-delimited field rewritten: its tag bytes as they were, the new contents' length, the contents.
void PutField(const uint8_t* tag_start, const uint8_t* tag_end, const std::string& contents, std::string* out) {
  out->append(reinterpret_cast<const char*>(tag_start), static_cast<size_t>(tag_end - tag_start));
  PutVarint(contents.size(), out);
  out->append(contents);
}

// Copies the fields of `message` into *out, except those `rewrite(number, bytes, out)` takes (length-delimited
// fields; it returns 0 to leave the field as it is, 1 when it wrote it, -1 to decline).
template <typename Rewrite>
bool CopyFields(std::string_view message, std::string* out, Rewrite&& rewrite) {
  Wire in = Over(message);
  while (in.p != in.end) {
    int number = 0, wire = 0;
    const uint8_t* start = nullptr;
    if (!in.Tag(&number, &wire, &start)) return false;
    const uint8_t* value = in.p;
    if (wire == kLengthDelimited) {
      std::string_view bytes;
      if (!in.Length(&bytes)) return false;
      const int taken = rewrite(number, start, value, bytes, out);
      if (taken < 0) return false;
      if (taken > 0) continue;
    } else if (!in.Skip(wire)) {
      return false;
    }
    out->append(reinterpret_cast<const char*>(start), static_cast<size_t>(in.p - start));
  }
  return true;
}

}  // namespace

bool SplitFullData(std::string_view payload, std::string* skeleton, std::vector<std::string_view>* data) {
  skeleton->clear();
  data->clear();
  std::string slice_out, full_out;
  return CopyFields(
      payload, skeleton,
      [&](int number, const uint8_t* tag, const uint8_t* value, std::string_view slice, std::string* out) {
        if (number != pb::BucketRecord::kSlicesFieldNumber) return 0;
        // A slice: the bytes of its one `full`'s one `data` go to `data`, the rest stays.
        std::string_view bytes;
        bool seen_full = false;
        slice_out.clear();
        const bool ok = CopyFields(
            slice, &slice_out,
            [&](int n, const uint8_t* t, const uint8_t* v, std::string_view full, std::string* s_out) {
              if (n != pb::Slice::kFullFieldNumber) return 0;
              if (seen_full) return -1;  // two: protobuf merges them
              seen_full = true;
              bool seen_data = false;
              full_out.clear();
              const bool inner = CopyFields(
                  full, &full_out,
                  [&](int d, const uint8_t* dt, const uint8_t* dv, std::string_view held, std::string* f_out) {
                    if (d != pb::FullPayload::kDataFieldNumber) return 0;
                    if (seen_data) return -1;  // two: the last wins
                    seen_data = true;
                    bytes = held;
                    PutField(dt, dv, std::string(), f_out);
                    return 1;
                  });
              if (!inner) return -1;
              PutField(t, v, full_out, s_out);
              return 1;
            });
        if (!ok) return -1;
        data->push_back(bytes);
        PutField(tag, value, slice_out, out);
        return 1;
      });
}

}  // namespace gradtrace
