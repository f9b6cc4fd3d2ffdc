#include "json_io.h"

#include <google/protobuf/util/json_util.h>

#include <cmath>

namespace gradtrace::diff {

std::string DumpJson(const Json& j) { return j.dump(2) + "\n"; }

Json NumberOrNull(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

Json ConfigToJson(const pb::Config& c) {
  std::string text;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  opts.always_print_enums_as_ints = false;
  if (!google::protobuf::util::MessageToJsonString(c, &text, opts).ok()) return Json::object();
  return Json::parse(text);
}

Status ConfigFromJson(const Json& j, pb::Config* c) {
  if (!j.is_object()) return Status::InvalidArgument("config is not an object");
  auto st = google::protobuf::util::JsonStringToMessage(j.dump(), c);
  if (!st.ok()) return Status::InvalidArgument("config: " + std::string(st.message()));
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
