// _gtcodec.judge_self: the live guard's way to the one judging function of --self
// (diff/explain/self_judge.h). The guard measures in the training process and hands the sums
// over as plain Python values; the judged report comes back as the report JSON
// (diff/report.schema.json), the words those of explain/.
#include "judge_binding.h"

#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "divisor_finding.h"
#include "explain/reference_judge.h"
#include "explain/self_judge.h"
#include "report/report.h"
#include "report/violations.h"
#include "run_info_json.h"
#include "text_escape.h"

namespace gradtrace {
namespace {

namespace py = pybind11;

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) && !d[key].is_none() ? d[key].cast<T>() : fallback;
}

diff::ReductionSums SumsOf(const py::dict& d) {
  diff::ReductionSums s;
  s.ss = Get<double>(d, "ss", 0);
  s.sp = Get<double>(d, "sp", 0);
  s.pp = Get<double>(d, "pp", 0);
  s.compared = Get<int64_t>(d, "compared", 0);
  s.sum_sq = Get<double>(d, "sum_sq", 0);
  s.members_sq = Get<double>(d, "members_sq", 0);
  for (int32_t b : Get<std::vector<int32_t>>(d, "buckets", {})) s.buckets.insert(b);
  s.group = Get<std::string>(d, "group", "");
  s.group_size = Get<int>(d, "group_size", 0);
  s.declared = Get<double>(d, "declared", 0);
  s.problems = Get<std::vector<std::string>>(d, "problems", {});
  return s;
}

diff::SelfMeasurements MeasurementsOf(const py::dict& m) {
  diff::SelfMeasurements out;
  for (const py::handle& h : Get<py::list>(m, "reductions", py::list())) {
    const py::dict d = py::reinterpret_borrow<py::dict>(h);
    out.reductions[{Get<int32_t>(d, "param", -1), Get<std::string>(d, "group", "")}].Merge(SumsOf(d));
  }
  for (int32_t id : Get<std::vector<int32_t>>(m, "accumulating", {})) out.accumulating.insert(id);
  for (const py::handle& h : Get<py::list>(m, "replicas", py::list())) {
    const py::dict d = py::reinterpret_borrow<py::dict>(h);
    out.replicas[Get<int32_t>(d, "param", -1)] = {Get<double>(d, "rel", 0), Get<int>(d, "rank", -1),
                                                  Get<int>(d, "other", -1)};
  }
  out.reported_norm = Get<std::optional<double>>(m, "reported_norm", std::nullopt);
  out.final_norm = Get<std::optional<double>>(m, "final_norm", std::nullopt);
  for (const py::handle& h : Get<py::list>(m, "nonfinite", py::list())) {
    const py::dict d = py::reinterpret_borrow<py::dict>(h);
    diff::NonfiniteRecord r;
    r.rank = Get<int>(d, "rank", 0);
    r.phase = Get<std::string>(d, "phase", "");
    r.micro = Get<int32_t>(d, "micro", 0);
    r.bucket = Get<int32_t>(d, "bucket", 0);
    r.group = Get<std::string>(d, "group", "");
    r.params = Get<std::vector<int32_t>>(d, "params", {});
    out.nonfinite.push_back(std::move(r));
  }
  out.skipped = Get<std::vector<int>>(m, "skipped", {});
  for (const auto& [kind, message] : Get<std::vector<std::pair<std::string, std::string>>>(m, "notes", {})) {
    out.notes.emplace_back(kind, message);
  }
  out.final_only = Get<bool>(m, "final_only", false);
  return out;
}

// name -> (count, sum, sum of squares, abs max, non-finite count)
std::map<std::string, diff::Moments> MomentsOf(const py::dict& d) {
  std::map<std::string, diff::Moments> out;
  for (const auto& [name, v] : d) {
    const auto t = v.cast<std::tuple<int64_t, double, double, double, int64_t>>();
    diff::Moments m;
    std::tie(m.count, m.sum, m.sum_sq, m.abs_max, m.nonfinite) = t;
    out[name.cast<std::string>()] = m;
  }
  return out;
}

py::dict DictOf(const diff::Violation& v) {
  py::dict d;
  d["check"] = v.check;
  d["cause"] = v.cause;
  d["message"] = v.message;
  d["params"] = v.params;
  d["buckets"] = v.buckets;
  d["divisor"] = v.divisor ? py::object(py::float_(*v.divisor)) : py::object(py::none());
  return d;
}

diff::Violation ViolationOf(const py::dict& d) {
  diff::Violation v;
  v.check = Get<std::string>(d, "check", "");
  v.message = Get<std::string>(d, "message", "");
  v.params = Get<std::vector<std::string>>(d, "params", {});
  v.buckets = Get<std::vector<int32_t>>(d, "buckets", {});
  return v;
}

}  // namespace

// The run the guard judges, its RunInfo parsed once (a rank's), and the world size.
struct RunJudge {
  pb::RunInfo run;
  int world = 1;
};

void RegisterJudge(py::module_& m) {
  // The guard's reference run (diff/explain/reference_judge.h): loaded once, judged through RunJudge.judge.
  py::class_<diff::ReferenceRun>(m, "ReferenceRun")
      .def(py::init([](const std::string& dir) {
             auto r = diff::ReferenceRun::Load(dir);
             if (!r.ok()) throw py::value_error(r.status().message());
             return std::move(*r);
           }),
           py::arg("dir"))
      .def_property_readonly("steps", &diff::ReferenceRun::steps);
  py::class_<RunJudge>(m, "RunJudge")
      .def(py::init([](const std::string& run_info_json, int world) {
             return RunJudge{RunInfoFromJson(run_info_json), world};
           }),
           py::arg("run_info_json"), py::arg("world"))
      .def(
          "judge",
          [](const RunJudge& j, int64_t step, const py::dict& measurements, const diff::ReferenceRun* reference,
             const py::dict& moments, std::optional<double> rtol) {
            const diff::SelfMeasurements ms = MeasurementsOf(measurements);
            const auto mine = MomentsOf(moments);
            std::string against;
            diff::Report report;
            std::vector<diff::Violation> found;
            {
              py::gil_scoped_release release;
              report = diff::SelfReportHead(j.run, j.world, rtol);
              report.step = step;
              diff::JudgeSelf(j.run, ms, &report);
              found = diff::SelfViolations(report);
              if (reference != nullptr) {
                auto compared = reference->Judge(step, j.run, j.world, mine, &report);
                if (!compared.ok()) throw py::value_error(compared.status().message());
                against = diff::RenderJson(*compared);
                for (auto& v : diff::ReferenceViolations(*compared)) found.push_back(std::move(v));
              }
            }
            py::list violations;
            for (const diff::Violation& v : found) violations.append(DictOf(v));
            return py::make_tuple(diff::RenderJson(report),
                                  reference != nullptr ? py::object(py::str(against)) : py::object(py::none()),
                                  violations);
          },
          py::arg("step"), py::arg("measurements"), py::arg("reference") = nullptr, py::arg("moments") = py::dict(),
          py::arg("rtol") = std::nullopt,
          "(the self report, the comparison with `reference` or None, the violations), the reports JSON: one step's "
          "measurements judged as --self judges a trace set, and, with a reference, this run's FINAL `moments` (name "
          "-> count, sum, sum of squares, abs max, non-finite) against the reference's, the self report as B's "
          "reduction evidence. The violations (diff/report/violations.h): dicts with check, cause, message, params, "
          "buckets, divisor; the reference's (check \"reference\") last.")
      .def(
          "sums_over_replicas",
          [](const RunJudge& j, const std::string& group) {
            return semantics::SumsOverReplicas(j.run.config(), group);
          },
          py::arg("group"), "Whether a POST_REDUCE over `group` also sums over HSDP's replicas (divisor_finding.h).");
  m.def(
      "guard_line",
      [](int rank, int64_t step, const py::dict& violation) {
        return diff::ViolationLine(rank, step, ViolationOf(violation));
      },
      py::arg("rank"), py::arg("step"), py::arg("violation"),
      "The guard's stderr line of one violation (a dict as RunJudge.judge returns): rank, step, buckets, the diff's "
      "words, terminal-safe.");
  // The one escaping of terminal text (proto/text_escape.h): the guard's lines quote parameter names.
  m.def(
      "terminal_safe", [](const std::string& text) { return TerminalSafe(text); }, py::arg("text"));
}

}  // namespace gradtrace
