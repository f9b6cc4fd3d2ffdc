#include "report/partial_report.h"

#include <cmath>
#include <limits>

#include "format.h"
#include "regular_file.h"
#include "report/json_io.h"

namespace gradtrace::diff {
namespace {

constexpr char kPartialVersion[] = "1.4";  // minor: fields added; major: fields changed
constexpr char kKind[] = "partial";
// Far above any partial report: about 1 KB per parameter, and a trace holds at most kMaxParams.
constexpr uint64_t kMaxPartialBytes = uint64_t{4} << 30;

Json Exact(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

Json ParamJson(const ComparedParam& p) {
  const Metrics& m = p.metrics;
  Json j = Json::object();
  j["index"] = p.index;
  j["name"] = p.name;
  j["numel"] = p.numel;
  j["shape"] = p.shape;
  j["dtype"] = p.dtype;
  j["problem"] = p.problem;
  j["basis"] = BasisName(m.basis);
  j["compared"] = m.compared;
  j["scale"] = Exact(m.scale);
  j["residual"] = Exact(m.residual);
  j["cosine"] = Exact(m.cosine);
  j["rel_error"] = Exact(m.rel_error);
  j["max_abs_error"] = Exact(m.max_abs_error);
  j["norm_a"] = Exact(m.norm_a);
  j["norm_b"] = Exact(m.norm_b);
  j["nonfinite_a"] = m.nonfinite_a;
  j["nonfinite_b"] = m.nonfinite_b;
  j["sums_only"] = m.sums_only;
  j["note"] = p.note;
  j["param_kind"] = p.param_kind;
  j["replicas"] = Json::array();
  for (const auto& r : p.replica) {
    j["replicas"].push_back({{"rel", Exact(r.rel)}, {"first", r.first}, {"other", r.other}, {"path", r.other_path}});
  }
  j["noise_rel_error"] = p.noise_rel_error ? Exact(*p.noise_rel_error) : Json(nullptr);
  return j;
}

// A field that is missing or of the wrong type: where (e.g. "params[3].scale") and what.
struct BadField {
  std::string where, what;
};

// Typed access to one JSON object's fields, naming the field on failure.
class Fields {
 public:
  Fields(const Json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) throw BadField{where_.empty() ? "top level" : where_, "expected an object"};
  }
  const Json& At(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end()) throw BadField{Name(key), "missing"};
    return *it;
  }
  std::string Str(const char* key) const {
    const Json& v = At(key);
    if (!v.is_string()) throw Wrong(key, "a string", v);
    return v.get<std::string>();
  }
  int64_t Int(const char* key) const {
    const Json& v = At(key);
    if (!v.is_number_integer()) throw Wrong(key, "an integer", v);
    return v.get<int64_t>();
  }
  // An integer in [lo, hi]: counts and ranks a hostile part could set to 2^40, which a cast would wrap.
  int64_t IntIn(const char* key, int64_t lo, int64_t hi) const {
    const int64_t v = Int(key);
    if (v < lo || v > hi) {
      throw BadField{Name(key), std::to_string(v) + " is outside " + std::to_string(lo) + ".." + std::to_string(hi)};
    }
    return v;
  }
  bool Bool(const char* key) const {
    const Json& v = At(key);
    if (!v.is_boolean()) throw Wrong(key, "true or false", v);
    return v.get<bool>();
  }
  double Double(const char* key) const { return ExactValue(At(key), key); }
  std::optional<double> OptDouble(const char* key) const {
    const Json& v = At(key);
    if (v.is_null()) return std::nullopt;
    return ExactValue(v, key);
  }
  const Json& Array(const char* key) const {
    const Json& v = At(key);
    if (!v.is_array()) throw Wrong(key, "an array", v);
    return v;
  }
  std::vector<std::string> Strings(const char* key) const {
    std::vector<std::string> out;
    for (const Json& v : Array(key)) {
      if (!v.is_string()) throw Wrong(key, "an array of strings", v);
      out.push_back(v.get<std::string>());
    }
    return out;
  }
  std::vector<int64_t> Ints(const char* key) const {
    std::vector<int64_t> out;
    for (const Json& v : Array(key)) {
      if (!v.is_number_integer()) throw Wrong(key, "an array of integers", v);
      out.push_back(v.get<int64_t>());
    }
    return out;
  }
  bool Has(const char* key) const { return j_.contains(key); }
  std::string Name(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  double ExactValue(const Json& v, const char* key) const {
    if (v.is_number()) return v.get<double>();
    if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (v == "Infinity") return std::numeric_limits<double>::infinity();
    if (v == "-Infinity") return -std::numeric_limits<double>::infinity();
    throw Wrong(key, "a number, \"NaN\", \"Infinity\" or \"-Infinity\"", v);
  }
  BadField Wrong(const char* key, const char* want, const Json& got) const {
    std::string shown = got.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    return BadField{Name(key), std::string("expected ") + want + ", found " + shown};
  }

  const Json& j_;
  std::string where_;
};

Basis BasisFromName(const std::string& name, const std::string& where) {
  for (Basis b : {Basis::kFull, Basis::kSketch, Basis::kStats, Basis::kNone}) {
    if (name == BasisName(b)) return b;
  }
  throw BadField{where, "unknown basis '" + name + "'"};
}

SelfVerdict SelfVerdictFromName(const std::string& name, const std::string& where) {
  for (SelfVerdict v :
       {SelfVerdict::kOk, SelfVerdict::kMissing, SelfVerdict::kWrongDivisor, SelfVerdict::kInconsistent}) {
    if (name == SelfVerdictName(v)) return v;
  }
  throw BadField{where, "unknown verdict '" + name + "'"};
}

// A cell as BucketCellToJson wrote it: null numbers are undefined (NaN), a null expected divisor unknown (0).
// `world`: the side's, which a cell's rank and group size must fit.
BucketCell BucketCellFromJson(const Json& j, const std::string& where, int world) {
  Fields f(j, where);
  BucketCell c;
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  c.rank = static_cast<int>(f.IntIn("rank", 0, world - 1));
  c.micro = static_cast<int32_t>(f.IntIn("micro_step", 0, kInt32Max));
  c.bucket = static_cast<int32_t>(f.IntIn("bucket_id", std::numeric_limits<int32_t>::min(), kInt32Max));
  c.group = f.Str("group");
  c.group_size = static_cast<int>(f.IntIn("group_size", 0, world));
  c.params = static_cast<int>(f.IntIn("params", 0, format::kMaxParams));
  c.compared = f.Int("compared");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c.pre_norm = f.OptDouble("pre_norm").value_or(nan);
  c.post_norm = f.OptDouble("post_norm").value_or(nan);
  c.divisor = f.OptDouble("divisor").value_or(nan);
  c.residual = f.OptDouble("residual").value_or(nan);
  c.expected = f.OptDouble("expected").value_or(0);
  c.accumulates = f.Bool("accumulates");
  c.verdict = SelfVerdictFromName(f.Str("verdict"), f.Name("verdict"));
  return c;
}

TraceSide SideFromJson(const Fields& top, const char* trace_key, const char* config_key) {
  Fields f(top.At(trace_key), trace_key);
  TraceSide s;
  s.dir = f.Str("dir");
  s.producer = f.Str("producer");
  s.run_id = f.Str("run_id");
  s.world = static_cast<int>(f.IntIn("world", 1, std::numeric_limits<int32_t>::max()));
  s.truncated = f.Bool("truncated");
  if (f.Has("reported_grad_norm")) s.reported_grad_norm = f.OptDouble("reported_grad_norm");  // since 1.1
  if (f.Has("framework")) {                                                                   // since 1.2
    s.framework = f.Str("framework");
    s.valid_tokens_min = f.Int("valid_tokens_min");
    s.valid_tokens_max = f.Int("valid_tokens_max");
    s.loss_per_replica = f.Double("loss_per_replica");
    const Json& rs = f.Array("reductions");
    for (size_t i = 0; i < rs.size(); ++i) {
      Fields r(rs[i], f.Name("reductions") + "[" + std::to_string(i) + "]");
      s.reductions.push_back({r.Str("param_kind"), static_cast<int>(r.IntIn("group_size", 0, s.world)),
                              r.Double("measured"), r.Double("declared"), r.Double("expected")});
    }
  }
  if (f.Has("bucket_view")) {  // since 1.3; shard 0 carries it (DiffOptions.bucket_view)
    const Json& cells = f.Array("bucket_view");
    for (size_t i = 0; i < cells.size(); ++i) {
      s.bucket_view.push_back(
          BucketCellFromJson(cells[i], f.Name("bucket_view") + "[" + std::to_string(i) + "]", s.world));
    }
  }
  Status st = ConfigFromJson(top.At(config_key), &s.config);
  if (!st.ok()) throw BadField{config_key, st.message()};
  return s;
}

// `worlds`: A's and B's, which a replica's ranks must fit (-1: none).
ComparedParam ParamFromJson(const Json& j, const std::string& where, const int (&worlds)[2]) {
  Fields f(j, where);
  ComparedParam p;
  int64_t index = f.Int("index");
  if (index < 0) throw BadField{f.Name("index"), "negative"};
  p.index = static_cast<size_t>(index);
  p.name = f.Str("name");
  p.numel = f.Int("numel");
  p.shape = f.Ints("shape");
  p.dtype = f.Str("dtype");
  p.problem = f.Str("problem");
  Metrics& m = p.metrics;
  m.basis = BasisFromName(f.Str("basis"), f.Name("basis"));
  m.compared = f.Int("compared");
  m.scale = f.Double("scale");
  m.residual = f.Double("residual");
  m.cosine = f.Double("cosine");
  m.rel_error = f.Double("rel_error");
  m.max_abs_error = f.Double("max_abs_error");
  m.norm_a = f.Double("norm_a");
  m.norm_b = f.Double("norm_b");
  m.nonfinite_a = f.Int("nonfinite_a");
  m.nonfinite_b = f.Int("nonfinite_b");
  m.sums_only = f.Bool("sums_only");
  p.note = f.Str("note");
  if (j.contains("param_kind")) p.param_kind = f.Str("param_kind");
  const Json& replicas = f.Array("replicas");
  if (replicas.size() != 2) throw BadField{f.Name("replicas"), "expected 2 entries (A, B)"};
  for (int side = 0; side < 2; ++side) {
    Fields r(replicas[side], f.Name("replicas") + "[" + std::to_string(side) + "]");
    const int last = worlds[side] - 1;
    p.replica[side] = {r.Double("rel"), static_cast<int>(r.IntIn("first", -1, last)),
                       static_cast<int>(r.IntIn("other", -1, last)), r.Str("path")};
  }
  p.noise_rel_error = f.OptDouble("noise_rel_error");
  return p;
}

Comparison ComparisonFromJson(const Json& j) {
  Fields top(j, "");
  if (!j.contains("kind") && j.contains("verdict")) {
    throw BadField{"kind", "missing: this is a full report; --merge reads the files --shard K/N --json wrote"};
  }
  std::string kind = top.Str("kind");
  if (kind != kKind) throw BadField{"kind", "'" + kind + "', expected '" + kKind + "'"};
  std::string version = top.Str("schema_version");
  if (version.substr(0, version.find('.')) != "1") {
    throw BadField{"schema_version", "'" + version + "' (this gradtrace-diff reads 1.x)"};
  }
  Comparison c;
  Fields shard(top.At("shard"), "shard");
  int64_t k = shard.Int("k"), n = shard.Int("n");
  if (n < 1 || k < 0 || k >= n || n > std::numeric_limits<int>::max())
    throw BadField{"shard", std::to_string(k) + "/" + std::to_string(n) + " is not K/N"};
  c.shard = {static_cast<int>(k), static_cast<int>(n)};
  c.fingerprint = top.Str("fingerprint");
  int64_t count = top.Int("param_count");
  if (count < 0) throw BadField{"param_count", "negative"};
  c.param_count = static_cast<size_t>(count);
  c.step = top.Int("step");
  c.phase = top.Str("phase");
  c.rtol = top.OptDouble("rtol");
  c.noise_dir = top.Str("noise_dir");
  c.a = SideFromJson(top, "trace_a", "config_a");
  c.b = SideFromJson(top, "trace_b", "config_b");
  c.notes = top.Strings("notes");
  c.truncations = top.Strings("truncations");
  if (top.Has("setup_verdict")) {  // since 1.4
    c.setup_verdict = top.Str("setup_verdict");
    if (!c.setup_verdict.empty() && c.setup_verdict != "different-start" && c.setup_verdict != "different-data") {
      throw BadField{"setup_verdict", "'" + c.setup_verdict + "' is no setup verdict"};
    }
    c.setup_summary = top.Str("setup_summary");
    c.setup_data_step = top.Int("setup_data_step");
  }
  const Json& params = top.Array("params");
  for (size_t i = 0; i < params.size(); ++i) {
    c.params.push_back(ParamFromJson(params[i], "params[" + std::to_string(i) + "]", {c.a.world, c.b.world}));
  }
  return c;
}

}  // namespace

std::string RenderPartialJson(const Comparison& c) {
  Json j = Json::object();
  j["schema_version"] = kPartialVersion;
  j["tool"] = "gradtrace-diff";
  j["kind"] = kKind;
  j["shard"] = {{"k", c.shard.k}, {"n", c.shard.n}};
  j["fingerprint"] = c.fingerprint;
  j["param_count"] = c.param_count;
  j["step"] = c.step;
  j["phase"] = c.phase;
  j["rtol"] = c.rtol ? Exact(*c.rtol) : Json(nullptr);
  j["noise_dir"] = c.noise_dir;
  j["trace_a"] = TraceSideToJson(c.a);
  j["trace_b"] = TraceSideToJson(c.b);
  j["config_a"] = ConfigToJson(c.a.config);
  j["config_b"] = ConfigToJson(c.b.config);
  j["notes"] = c.notes;
  j["truncations"] = c.truncations;
  j["setup_verdict"] = c.setup_verdict;
  j["setup_summary"] = c.setup_summary;
  j["setup_data_step"] = c.setup_data_step;
  j["params"] = Json::array();
  for (const auto& p : c.params) j["params"].push_back(ParamJson(p));
  return DumpJson(j);
}

Expected<Comparison> ReadPartialJson(const std::string& path) {
  // A regular file only (a FIFO would block the read forever), read whole: memory stays proportional to the
  // file, which holds about 1 KB per parameter.
  auto text = ReadRegularFile(path, kMaxPartialBytes);
  if (!text.ok()) return text.status();
  auto parsed = ParseJson(*text);
  if (!parsed.ok()) return Status::InvalidArgument(path + ": " + parsed.status().message());
  const Json& j = *parsed;
  try {
    return ComparisonFromJson(j);
  } catch (const BadField& e) {
    return Status::InvalidArgument(path + ": not a gradtrace-diff partial report: " + e.where + ": " + e.what);
  } catch (const Json::exception& e) {  // a number out of range for its type, say
    return Status::InvalidArgument(path + ": not a gradtrace-diff partial report: " + e.what());
  }
}

}  // namespace gradtrace::diff
