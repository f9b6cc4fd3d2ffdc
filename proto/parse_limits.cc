#include "parse_limits.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/wire_format_lite.h>

#include <cstdio>
#include <mutex>

namespace gradtrace {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// protobuf's default recursion limit: deeper input fails to parse anyway.
constexpr int kMaxDepth = 100;

// protobuf logs why it refuses a payload (e.g. invalid UTF-8 in a string field) on stderr, 2-4
// "[libprotobuf ERROR ...]" lines before our one-line error (issue 42). While this thread parses, the first
// such line is kept for the error instead; elsewhere the handler prints what protobuf's default one does.
thread_local std::string* parse_log = nullptr;

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  if (parse_log != nullptr) {
    if (parse_log->empty()) *parse_log = message;
    return;
  }
  static const char* const kLevels[] = {"INFO", "WARNING", "ERROR", "FATAL"};
  const int l = static_cast<int>(level);
  const char* name = l >= 0 && l < 4 ? kLevels[l] : "?";
  std::fprintf(stderr, "[libprotobuf %s %s:%d] %s\n", name, file, line, message.c_str());
}

// The first sentence of protobuf's message, short: it names the field ("String field
// 'gradtrace.pb.RunInfo.producer' contains invalid UTF-8 data ...").
std::string FirstSentence(const std::string& message) {
  std::string s = message.substr(0, message.find(". "));
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return s;
}

int CppWidth(const FieldDescriptor* f) {
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return 8;
    case FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    default:  // int32, uint32, float, enum
      return 4;
  }
}

WireFormatLite::WireType ExpectedWireType(const FieldDescriptor* f) {
  // FieldDescriptor::Type and WireFormatLite::FieldType share their values.
  return WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(f->type()));
}

// The pre-pass mirrors what the generated parser does with each field: a
// message field is parsed (recurse), a packed or unpacked repeated number is
// appended, anything else known is stored in place, and a field the schema
// does not know -- or a known one with the wrong wire type -- becomes an
// unknown field (a group's contents included).
class Walker {
 public:
  Walker(const std::string& payload, ParseCost* cost)
      : in_(reinterpret_cast<const uint8_t*>(payload.data()), static_cast<int>(payload.size())), cost_(cost) {}

  bool Message(const Descriptor* type, size_t size) {
    const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(size));
    if (!Fields(type, 0, 0)) return false;
    in_.PopLimit(limit);
    return true;
  }

 private:
  // Reads fields of `type` (nullptr: unknown, inside a group) up to the
  // current limit, or up to the END_GROUP tag of field `group` when group > 0.
  bool Fields(const Descriptor* type, int depth, int group) {
    if (depth > kMaxDepth) return false;
    for (;;) {
      const uint32_t tag = in_.ReadTag();
      // 0: the end of the message (at the limit, nothing half read), or a bad tag.
      if (tag == 0) return group == 0 && in_.ConsumedEntireMessage();
      const int number = WireFormatLite::GetTagFieldNumber(tag);
      const WireFormatLite::WireType wire = WireFormatLite::GetTagWireType(tag);
      if (number == 0) return false;
      if (wire == WireFormatLite::WIRETYPE_END_GROUP) return number == group;
      const FieldDescriptor* f = type == nullptr ? nullptr : type->FindFieldByNumber(number);
      if (f != nullptr && f->type() == FieldDescriptor::TYPE_MESSAGE &&
          wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        ++cost_->objects;
        if (!SubMessage(f->message_type(), depth)) return false;
        continue;
      }
      if (f != nullptr && f->type() == FieldDescriptor::TYPE_GROUP && wire == WireFormatLite::WIRETYPE_START_GROUP) {
        ++cost_->objects;
        if (!Fields(f->message_type(), depth + 1, number)) return false;
        continue;
      }
      if (f != nullptr && f->is_packable() && wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        if (!Packed(f)) return false;
        continue;
      }
      if (f != nullptr && wire == ExpectedWireType(f)) {
        if (f->is_repeated()) {
          if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
            ++cost_->objects;
          } else {
            cost_->repeated_scalar_bytes += CppWidth(f);
          }
        }
        if (!WireFormatLite::SkipField(&in_, tag)) return false;
        continue;
      }
      ++cost_->objects;  // an unknown field
      if (wire == WireFormatLite::WIRETYPE_START_GROUP) {
        if (!Fields(nullptr, depth + 1, number)) return false;
      } else if (!WireFormatLite::SkipField(&in_, tag)) {
        return false;
      }
    }
  }

  bool SubMessage(const Descriptor* type, int depth) {
    uint32_t len = 0;
    if (!in_.ReadVarint32(&len) || static_cast<int64_t>(len) > in_.BytesUntilLimit()) return false;
    const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(len));
    if (!Fields(type, depth + 1, 0)) return false;
    in_.PopLimit(limit);
    return true;
  }

  // A packed run of numbers: count the elements without storing them.
  bool Packed(const FieldDescriptor* f) {
    uint32_t len = 0;
    if (!in_.ReadVarint32(&len) || static_cast<int64_t>(len) > in_.BytesUntilLimit()) return false;
    int64_t n = 0;
    switch (ExpectedWireType(f)) {
      case WireFormatLite::WIRETYPE_FIXED32:
      case WireFormatLite::WIRETYPE_FIXED64: {
        const uint32_t w = ExpectedWireType(f) == WireFormatLite::WIRETYPE_FIXED32 ? 4 : 8;
        if (len % w != 0 || !in_.Skip(static_cast<int>(len))) return false;
        n = len / w;
        break;
      }
      default: {  // varints
        const CodedInputStream::Limit limit = in_.PushLimit(static_cast<int>(len));
        for (uint64_t v = 0; in_.BytesUntilLimit() > 0; ++n) {
          if (!in_.ReadVarint64(&v)) return false;
        }
        in_.PopLimit(limit);
      }
    }
    cost_->repeated_scalar_bytes += n * CppWidth(f);
    return true;
  }

  CodedInputStream in_;
  ParseCost* cost_;
};

}  // namespace

ParseLimits ParseLimitsFor(format::FrameType type) {
  switch (type) {
    case format::FrameType::kRunInfo:
      return {format::kMaxRunInfoObjects, format::kMaxRepeatedScalarBytes};
    case format::FrameType::kStepInfo:
      return {format::kMaxStepInfoObjects, format::kMaxRepeatedScalarBytes};
    case format::FrameType::kBucketRecord:
      return {format::kMaxBucketRecordObjects, format::kMaxRepeatedScalarBytes};
    case format::FrameType::kIndex:
      return {format::kMaxIndexFrameObjects, format::kMaxRepeatedScalarBytes};
  }
  return {};
}

bool MeasureParse(const Descriptor* type, const std::string& payload, ParseCost* cost) {
  if (payload.size() > static_cast<size_t>(INT32_MAX)) return false;  // frames are at most 64 MiB
  return Walker(payload, cost).Message(type, payload.size());
}

Status ParseBounded(const std::string& payload, const ParseLimits& limits, google::protobuf::Message* out) {
  const std::string& name = out->GetDescriptor()->name();
  const Status unparsable =
      Status::Corruption("cannot parse " + name + " payload (" + std::to_string(payload.size()) + " bytes)");
  ParseCost cost;
  if (!MeasureParse(out->GetDescriptor(), payload, &cost)) return unparsable;
  if (cost.objects > limits.max_objects) {
    return Status::LimitExceeded(name + " payload would create " + std::to_string(cost.objects) +
                                 " protobuf objects (limit " + std::to_string(limits.max_objects) + ")");
  }
  if (cost.repeated_scalar_bytes > limits.max_repeated_scalar_bytes) {
    return Status::LimitExceeded(name + " payload would decode " + std::to_string(cost.repeated_scalar_bytes) +
                                 " bytes of repeated numbers (limit " +
                                 std::to_string(limits.max_repeated_scalar_bytes) + ")");
  }
  static std::once_flag installed;
  std::call_once(installed, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
  std::string log;
  parse_log = &log;
  const bool parsed = out->ParseFromString(payload);
  parse_log = nullptr;
  if (!parsed) return log.empty() ? unparsable : Status::Corruption(unparsable.message() + ": " + FirstSentence(log));
  return Status::Ok();
}

}  // namespace gradtrace
