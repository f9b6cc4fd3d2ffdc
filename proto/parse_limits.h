// Bounded parsing of frame payloads. A payload of at most 64 MiB can still
// make ParseFromString allocate gigabytes: an empty sub-message is 2 bytes on
// the wire and ~100 bytes in memory, a packed varint 1 byte on the wire and 8
// in memory. So before parsing, one pass over the wire bytes (no allocation)
// counts what the parse would create and refuses payloads beyond the limits
// of format.h. The pass follows the message's Descriptor, so fields added to
// the schema are covered without changes here.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <string>

#include "format.h"
#include "status.h"

namespace gradtrace {

// What parsing a payload would allocate, as counted by MeasureParse.
struct ParseCost {
  // Heap objects the parse creates below the top-level message: sub-messages
  // (map entries included), elements of repeated string/bytes fields, and
  // unknown fields. An upper bound: a singular message field repeated on the
  // wire is merged by the parser but counted once per occurrence here.
  int64_t objects = 0;
  // In-memory bytes of repeated numeric elements (packed or not): element
  // count times the C++ width (8 for int64/double, 4 for int32/float/enum, 1 for bool).
  int64_t repeated_scalar_bytes = 0;
};

struct ParseLimits {
  int64_t max_objects = 0;
  int64_t max_repeated_scalar_bytes = 0;
};

// The limits for a frame type's payload (format.h); zeros for an unknown type.
ParseLimits ParseLimitsFor(format::FrameType type);

// Walks `payload` as the wire encoding of a message of type `type` and adds
// what ParseFromString would allocate to *cost. Returns false when the bytes
// are not well-formed wire data (bad tag or varint, length past the end,
// mismatched or over-deep groups): the parse would fail as well.
bool MeasureParse(const google::protobuf::Descriptor* type, const std::string& payload, ParseCost* cost);

// MeasureParse, then ParseFromString into *out. Returns Ok; LimitExceeded
// "<Type> payload would create N protobuf objects (limit M)" (or "would decode
// N bytes of repeated numbers (limit M)"), nothing parsed; or Corruption
// "cannot parse <Type> payload (N bytes)". Messages carry no path or offset:
// the reader prefixes them. On failure *out is unspecified.
Status ParseBounded(const std::string& payload, const ParseLimits& limits, google::protobuf::Message* out);

}  // namespace gradtrace
