#include "report/json_io.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "text_escape.h"

namespace gradtrace::diff {

std::string DumpJson(const Json& j) { return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n"; }

namespace {

// The first limit `text` breaks (kMaxJsonDepth, kMaxJsonString), or Ok. Not a
// validation: whatever it lets through, the parser still judges.
Status CheckJsonLimits(const std::string& text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  size_t string_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        continue;
      }
      if (i - string_start > kMaxJsonString) {  // the bytes between the quotes so far, escapes as written
        return Status::InvalidArgument("string longer than " + std::to_string(kMaxJsonString) + " bytes (byte " +
                                       std::to_string(string_start) + ")");
      }
    } else if (c == '"') {
      in_string = true;
      string_start = i;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return Status::InvalidArgument("nested deeper than " + std::to_string(kMaxJsonDepth) +
                                       " arrays and objects (byte " + std::to_string(i) + ")");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<Json> ParseJson(const std::string& text) {
  GT_RETURN_IF_ERROR(CheckJsonLimits(text));
  // A key given twice in one object (issue 42: the last one silently won, switching a pack.json's diff mode):
  // the keys of each open object, the first duplicate kept for the error.
  std::vector<std::set<std::string>> keys;
  std::optional<std::string> duplicate;
  auto watch = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        !duplicate) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    Json parsed = Json::parse(text, watch);
    if (duplicate) return Status::InvalidArgument("key \"" + TerminalSafe(*duplicate) + "\" given twice in one object");
    return parsed;
  } catch (const Json::exception& e) {
    // parse_error, and out_of_range for a number too large for a double (fuzz finding: it
    // escaped as an uncaught exception). The message without its "[json.exception.parse_error.101] ".
    std::string what = e.what();
    const size_t cut = what.find("] ");
    return Status::InvalidArgument("not JSON: " + (cut == std::string::npos ? what : what.substr(cut + 2)));
  }
}

Json NumberOrNull(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

Json ConfigToJson(const pb::Config& c) {
  std::string text;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  opts.always_print_enums_as_ints = false;
  if (!google::protobuf::util::MessageToJsonString(c, &text, opts).ok()) return Json::object();
  Json j = Json::parse(text);
  // A map prints in the order protobuf's Map iterates, which is seeded per process (two runs of one diff wrote
  // `extra` in two orders): sorted by key, the report is the same bytes every run.
  if (auto extra = j.find("extra"); extra != j.end() && extra->is_object()) {
    std::map<std::string, Json> sorted;
    for (auto it = extra->begin(); it != extra->end(); ++it) sorted.emplace(it.key(), it.value());
    Json ordered = Json::object();
    for (auto& [key, value] : sorted) ordered[key] = std::move(value);
    *extra = std::move(ordered);
  }
  return j;
}

Status ConfigFromJson(const Json& j, pb::Config* c) {
  if (!j.is_object()) return Status::InvalidArgument("config is not an object");
  auto st = google::protobuf::util::JsonStringToMessage(j.dump(-1, ' ', false, Json::error_handler_t::replace), c);
  // protobuf's message quotes the file's field names and values as they are (a newline in a key broke the
  // one-line error, fuzz_partial_report at 3dcc308): escaped.
  if (!st.ok()) return Status::InvalidArgument("config: " + TerminalSafe(std::string(st.message())));
  return Status();
}

Json BucketCellToJson(const BucketCell& c) {
  Json j = Json::object();
  j["rank"] = c.rank;
  j["micro_step"] = c.micro;
  j["bucket_id"] = c.bucket;
  j["group"] = c.group;
  j["group_size"] = c.group_size;
  j["params"] = c.params;
  j["compared"] = c.compared;
  j["pre_norm"] = NumberOrNull(c.pre_norm);
  j["post_norm"] = NumberOrNull(c.post_norm);
  j["divisor"] = NumberOrNull(c.divisor);
  j["residual"] = NumberOrNull(c.residual);
  j["expected"] = NumberOrNull(c.expected > 0 ? c.expected : NAN);
  j["accumulates"] = c.accumulates;
  j["verdict"] = SelfVerdictName(c.verdict);
  return j;
}

Json TraceSideToJson(const TraceSide& s) {
  Json j = Json::object();
  j["dir"] = s.dir;
  j["producer"] = s.producer;
  j["run_id"] = s.run_id;
  j["world"] = s.world;
  j["truncated"] = s.truncated;
  j["reported_grad_norm"] = s.reported_grad_norm ? NumberOrNull(*s.reported_grad_norm) : Json(nullptr);
  // Since 1.2: what the explanation's evidence came from.
  j["framework"] = s.framework;
  j["reductions"] = Json::array();
  for (const auto& e : s.reductions) {
    j["reductions"].push_back({{"param_kind", e.param_kind},
                               {"group_size", e.group_size},
                               {"measured", NumberOrNull(e.measured)},
                               {"declared", NumberOrNull(e.declared)},
                               {"expected", NumberOrNull(e.expected)}});
  }
  j["valid_tokens_min"] = s.valid_tokens_min;
  j["valid_tokens_max"] = s.valid_tokens_max;
  j["loss_per_replica"] = NumberOrNull(s.loss_per_replica);
  // Since 1.3: always an array, empty when not computed.
  j["bucket_view"] = Json::array();
  for (const auto& c : s.bucket_view) j["bucket_view"].push_back(BucketCellToJson(c));
  return j;
}

}  // namespace gradtrace::diff
