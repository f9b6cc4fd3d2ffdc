// --json: the machine-readable report. Schema: diff/report.schema.json (checked
// against this writer by tests/diff/report_contract_test.py), prose
// in diff/REPORT_SCHEMA.md. Minor version when adding fields, major when
// changing existing ones. Keys are written in the documented order.
#include <cmath>

#include "report/json_io.h"
#include "report/report.h"

namespace gradtrace::diff {
namespace {

Json ParamJson(const ParamResult& p) {
  const Metrics& m = p.metrics;
  bool none = m.basis == Basis::kNone;
  Json j = Json::object();
  j["name"] = p.name;
  j["numel"] = p.numel;
  j["shape"] = p.shape;
  j["dtype"] = p.dtype;
  j["verdict"] = VerdictName(p.verdict);
  j["basis"] = BasisName(m.basis);
  j["compared"] = m.compared;
  j["scale"] = NumberOrNull(none ? NAN : m.scale);
  j["residual"] = NumberOrNull(none ? NAN : m.residual);
  j["cosine"] = NumberOrNull(none ? NAN : m.cosine);
  j["rel_error"] = NumberOrNull(none ? NAN : m.rel_error);
  j["max_abs_error"] = NumberOrNull(none ? NAN : m.max_abs_error);
  j["nonfinite_a"] = m.nonfinite_a;
  j["nonfinite_b"] = m.nonfinite_b;
  j["rtol"] = NumberOrNull(p.rtol);
  j["note"] = p.note;
  j["param_kind"] = p.param_kind;
  return j;
}

Json GroupJson(const Group& g) {
  Json j = Json::object();
  j["kind"] = g.kind;
  j["scale"] = g.scale ? NumberOrNull(*g.scale) : Json(nullptr);
  j["count"] = g.count;
  j["expression"] = g.expression;
  j["explanation"] = g.explanation;
  j["params"] = g.params;
  j["cause"] = g.cause ? semantics::CauseName(*g.cause) : "";
  j["dimension"] = semantics::DimensionName(g.dimension);
  j["param_kind"] = g.param_kind;
  j["side"] = g.side;
  j["predicted"] = g.predicted ? NumberOrNull(*g.predicted) : Json(nullptr);
  j["candidates"] = Json::array();
  for (const auto& c : g.candidates) {
    j["candidates"].push_back({{"cause", semantics::CauseName(c.cause)},
                               {"dimension", semantics::DimensionName(c.dimension)},
                               {"side", c.side},
                               {"expression", c.expression},
                               {"explanation", c.explanation},
                               {"ruled_out_by", c.ruled_out_by},
                               {"rerun_predicts", c.rerun_predicts ? NumberOrNull(*c.rerun_predicts) : Json(nullptr)}});
  }
  j["rerun"] = g.rerun;
  if (g.localisation) {
    const Localisation& w = *g.localisation;
    j["localisation"] = {{"module", w.module},
                         {"within", w.within},
                         {"param", w.param},
                         {"differ_module", w.differ_module},
                         {"differ_within", w.differ_within},
                         {"agree_within", w.agree_within},
                         {"differ", w.differ},
                         {"agree", w.agree}};
  } else {
    j["localisation"] = nullptr;
  }
  return j;
}

Json SelfParamJson(const SelfParam& p) {
  Json j = Json::object();
  j["name"] = p.name;
  j["numel"] = p.numel;
  j["group"] = p.group;
  j["group_size"] = p.group_size;
  j["divisor"] = NumberOrNull(p.divisor);
  j["expected"] = NumberOrNull(p.expected > 0 ? p.expected : NAN);
  j["declared"] = NumberOrNull(p.declared > 0 ? p.declared : NAN);
  j["residual"] = NumberOrNull(p.residual);
  j["compared"] = p.compared;
  j["buckets"] = p.buckets;
  j["verdict"] = SelfVerdictName(p.verdict);
  j["param_kind"] = p.param_kind;
  return j;
}

Json GradNormJson(const GradNormCheck& g) {
  auto opt = [](const std::optional<double>& v) { return v ? NumberOrNull(*v) : Json(nullptr); };
  return {{"verdict", g.verdict},
          {"message", g.message},
          {"reported_a", opt(g.reported_a)},
          {"reported_b", opt(g.reported_b)},
          {"computed_a", NumberOrNull(g.computed_a)},
          {"computed_b", NumberOrNull(g.computed_b)},
          {"off_a", opt(g.off_a)},
          {"off_b", opt(g.off_b)}};
}

}  // namespace

Json ReportToJson(const Report& r) {
  bool self = r.mode == "self";
  Json j = Json::object();
  j["schema_version"] = kReportSchemaVersion;
  j["tool"] = "gradtrace-diff";
  j["mode"] = r.mode;
  j["verdict"] = r.verdict;
  j["exit_code"] = r.ExitCode();
  j["summary"] = r.summary;
  j["step"] = r.step;
  j["phase"] = r.phase;
  j["tolerance"] = {{"rtol", NumberOrNull(r.tolerance.rtol)},
                    {"source", r.tolerance.source},
                    {"bound", r.tolerance.bound},
                    {"atol", NumberOrNull(r.tolerance.atol)}};
  j["trace_a"] = TraceSideToJson(r.a);
  j["trace_b"] = self ? Json(nullptr) : TraceSideToJson(r.b);
  j["config_a"] = ConfigToJson(r.a.config);
  j["config_b"] = self ? Json(nullptr) : ConfigToJson(r.b.config);
  j["params"] = Json::array();
  for (const auto& p : r.params) j["params"].push_back(ParamJson(p));
  j["groups"] = Json::array();
  for (const auto& g : r.groups) j["groups"].push_back(GroupJson(g));
  j["findings"] = Json::array();
  for (const auto& f : r.findings) j["findings"].push_back({{"kind", f.kind}, {"message", f.message}});
  j["self_params"] = Json::array();
  for (const auto& p : r.self_params) j["self_params"].push_back(SelfParamJson(p));
  j["grad_norm"] = r.grad_norm ? GradNormJson(*r.grad_norm) : Json(nullptr);
  j["bucket_view"] = Json::array();
  for (const auto& c : r.bucket_view) j["bucket_view"].push_back(BucketCellToJson(c));
  j["steps"] = Json::array();  // since 1.4
  for (const StepRow& s : r.steps) {
    j["steps"].push_back({{"step", s.step},
                          {"verdict", s.verdict},
                          {"match", s.match},
                          {"differ", s.differ},
                          {"worst_residual", NumberOrNull(s.worst_residual)},
                          {"summary", s.summary}});
  }
  return j;
}

std::string RenderJson(const Report& r) { return DumpJson(ReportToJson(r)); }

}  // namespace gradtrace::diff
