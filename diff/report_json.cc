// --json: the machine-readable report. Schema: diff/report.schema.json, prose
// in diff/REPORT_SCHEMA.md. Minor version when adding fields, major when
// changing existing ones.
#include <google/protobuf/util/json_util.h>

#include "json_out.h"
#include "report.h"

namespace gradtrace::diff {
namespace {

constexpr char kSchemaVersion[] = "1.0";

std::string ConfigJson(const pb::Config& c) {
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  opts.always_print_enums_as_ints = false;
  if (!google::protobuf::util::MessageToJsonString(c, &json, opts).ok()) return "{}";
  return json;
}

void Side(JsonOut& j, const TraceSide& s) {
  j.BeginObject();
  j.Key("dir").String(s.dir);
  j.Key("producer").String(s.producer);
  j.Key("run_id").String(s.run_id);
  j.Key("world").Int(s.world);
  j.Key("truncated").Bool(s.truncated);
  j.EndObject();
}

}  // namespace

std::string RenderJson(const Report& r) {
  JsonOut j;
  bool self = r.mode == "self";
  j.BeginObject();
  j.Key("schema_version").String(kSchemaVersion);
  j.Key("tool").String("gradtrace-diff");
  j.Key("mode").String(r.mode);
  j.Key("verdict").String(r.verdict);
  j.Key("exit_code").Int(r.ExitCode());
  j.Key("summary").String(r.summary);
  j.Key("step").Int(r.step);
  j.Key("phase").String(r.phase);
  j.Key("tolerance").BeginObject();
  j.Key("rtol").Number(r.tolerance.rtol);
  j.Key("source").String(r.tolerance.source);
  j.Key("bound").String(r.tolerance.bound);
  j.EndObject();
  j.Key("trace_a");
  Side(j, r.a);
  j.Key("trace_b");
  if (self)
    j.Null();
  else
    Side(j, r.b);
  j.Key("config_a").Raw(ConfigJson(r.a.config));
  j.Key("config_b");
  if (self)
    j.Null();
  else
    j.Raw(ConfigJson(r.b.config));
  j.Key("params").BeginArray();
  for (const auto& p : r.params) {
    const Metrics& m = p.metrics;
    bool none = m.basis == Basis::kNone;
    j.BeginObject();
    j.Key("name").String(p.name);
    j.Key("numel").Int(p.numel);
    j.Key("shape").BeginArray();
    for (int64_t d : p.shape) j.Int(d);
    j.EndArray();
    j.Key("dtype").String(p.dtype);
    j.Key("verdict").String(VerdictName(p.verdict));
    j.Key("basis").String(BasisName(m.basis));
    j.Key("compared").Int(m.compared);
    j.Key("scale").Number(none ? NAN : m.scale);
    j.Key("residual").Number(none ? NAN : m.residual);
    j.Key("cosine").Number(none ? NAN : m.cosine);
    j.Key("rel_error").Number(none ? NAN : m.rel_error);
    j.Key("max_abs_error").Number(none ? NAN : m.max_abs_error);
    j.Key("nonfinite_a").Int(m.nonfinite_a);
    j.Key("nonfinite_b").Int(m.nonfinite_b);
    j.Key("rtol").Number(p.rtol);
    j.Key("note").String(p.note);
    j.EndObject();
  }
  j.EndArray();
  j.Key("groups").BeginArray();
  for (const auto& g : r.groups) {
    j.BeginObject();
    j.Key("kind").String(g.kind);
    j.Key("scale");
    if (g.scale)
      j.Number(*g.scale);
    else
      j.Null();
    j.Key("count").Int(g.count);
    j.Key("expression").String(g.expression);
    j.Key("explanation").String(g.explanation);
    j.Key("params").BeginArray();
    for (const auto& n : g.params) j.String(n);
    j.EndArray();
    j.EndObject();
  }
  j.EndArray();
  j.Key("findings").BeginArray();
  for (const auto& f : r.findings) {
    j.BeginObject();
    j.Key("kind").String(f.kind);
    j.Key("message").String(f.message);
    j.EndObject();
  }
  j.EndArray();
  j.Key("self_params").BeginArray();
  for (const auto& p : r.self_params) {
    j.BeginObject();
    j.Key("name").String(p.name);
    j.Key("numel").Int(p.numel);
    j.Key("group").String(p.group);
    j.Key("group_size").Int(p.group_size);
    j.Key("divisor").Number(p.divisor);
    j.Key("expected").Number(p.expected > 0 ? p.expected : NAN);
    j.Key("declared").Number(p.declared > 0 ? p.declared : NAN);
    j.Key("residual").Number(p.residual);
    j.Key("compared").Int(p.compared);
    j.Key("buckets").BeginArray();
    for (int32_t b : p.buckets) j.Int(b);
    j.EndArray();
    j.Key("verdict").String(p.verdict);
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
  return j.Take();
}

}  // namespace gradtrace::diff
