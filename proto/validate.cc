#include "validate.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "format.h"
#include "slice_codec.h"

namespace gradtrace {
namespace {

// A name from the file, safe inside a one-line message: control bytes
// escaped as \xNN, at most kMaxQuoted bytes (cut at a UTF-8 boundary).
std::string Quoted(const std::string& name) {
  constexpr size_t kMaxQuoted = 96;
  size_t n = name.size();
  if (n > kMaxQuoted) {
    n = kMaxQuoted;
    while (n > 0 && (static_cast<uint8_t>(name[n]) & 0xc0) == 0x80) --n;  // not inside a character
  }
  std::string out = "'";
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<uint8_t>(name[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (n < name.size() ? "'..." : "'");
}

std::string SliceWhere(int i, const pb::Slice& s) {
  return "slice " + std::to_string(i) + " (param " + std::to_string(s.param_id()) + ", elements [" +
         std::to_string(s.offset()) + ", +" + std::to_string(s.count()) + "))";
}

Status CheckSlice(const pb::RunInfo& run, int i, const pb::Slice& s, size_t full_bytes) {
  auto bad = [&](const std::string& what) { return Status::Corruption(SliceWhere(i, s) + ": " + what); };
  if (s.param_id() < 0 || s.param_id() >= run.params_size()) {
    return bad("unknown param id (run has " + std::to_string(run.params_size()) + " params)");
  }
  const int64_t numel = run.params(s.param_id()).numel();
  if (s.offset() < 0 || s.count() < 0 || s.offset() > numel || s.count() > numel - s.offset()) {
    return bad("range outside the parameter's " + std::to_string(numel) + " elements");
  }
  const size_t w = DTypeSize(s.dtype());
  if (w == 0) return bad("unknown dtype " + std::to_string(s.dtype()));
  switch (s.payload_case()) {
    case pb::Slice::kFull:
      if (full_bytes / w != static_cast<uint64_t>(s.count()) || full_bytes % w != 0) {
        return bad("full payload holds " + std::to_string(full_bytes) + " bytes, expected " +
                   std::to_string(s.count()) + " x " + std::to_string(w));
      }
      return Status::Ok();
    case pb::Slice::kSketch: {
      const pb::SketchPayload& sk = s.sketch();
      if (sk.positions_size() != sk.values_size()) {
        return bad("sketch has " + std::to_string(sk.positions_size()) + " positions but " +
                   std::to_string(sk.values_size()) + " values");
      }
      if (sk.k() < 0 || sk.positions_size() > sk.k()) return bad("sketch holds more positions than k");
      int64_t prev = s.offset() - 1;
      for (int64_t p : sk.positions()) {
        if (p <= prev || p - s.offset() >= s.count())
          return bad("sketch position " + std::to_string(p) + " out of order or range");
        prev = p;
      }
      return Status::Ok();
    }
    case pb::Slice::kStats: {
      const pb::StatsPayload& st = s.stats();
      if (st.count() < 0 || st.nonfinite() < 0 || st.count() > s.count() || st.nonfinite() != s.count() - st.count()) {
        return bad("stats count " + std::to_string(st.count()) + " + nonfinite " + std::to_string(st.nonfinite()) +
                   " != slice count");
      }
      return Status::Ok();
    }
    default:
      return bad("no payload");
  }
}

// Ranks index a trace set's per-rank tables: none is negative, none lies outside a recorded world (0 = not
// recorded: the set's file count bounds it, diff/load/trace_set.cc), and no group lists a rank twice.
// Regression, issue 20: negative ranks were written and read, and a group of 1M ranks in a world of 2 accepted.
Status CheckRanks(const pb::RunInfo& run) {
  const int world = run.config().world();
  auto outside = [world](int32_t rank) { return rank < 0 || (world > 0 && rank >= world); };
  auto why = [world](int32_t rank) {
    return "rank " + std::to_string(rank) + (rank < 0 ? " is negative" : " outside world " + std::to_string(world));
  };
  if (outside(run.rank())) return Status::Corruption(why(run.rank()));
  for (auto [name, coordinate] : {std::pair{"dp_rank", run.dp_rank()},
                                  {"sp_rank", run.sp_rank()},
                                  {"tp_rank", run.tp_rank()},
                                  {"cp_rank", run.cp_rank()},
                                  {"pp_rank", run.pp_rank()},
                                  {"ep_rank", run.ep_rank()}}) {
    if (coordinate < 0) return Status::Corruption(std::string("negative ") + name + " " + std::to_string(coordinate));
  }
  std::vector<int32_t> members;
  for (const pb::ProcessGroup& g : run.groups()) {
    auto where = [&g] { return "group " + Quoted(g.name()); };  // only for an error
    for (int32_t m : g.ranks()) {
      if (outside(m)) return Status::Corruption(where() + ": " + why(m));
    }
    // Groups are listed in ascending order: then no rank is there twice, with no copy and no sort (a world
    // group of 10,000 on each of 10,000 ranks was sorted 10,000 times).
    if (std::adjacent_find(g.ranks().begin(), g.ranks().end(), std::greater_equal<int32_t>()) == g.ranks().end()) {
      continue;
    }
    members.assign(g.ranks().begin(), g.ranks().end());
    std::sort(members.begin(), members.end());
    if (auto twice = std::adjacent_find(members.begin(), members.end()); twice != members.end()) {
      return Status::Corruption(where() + ": rank " + std::to_string(*twice) + " listed twice");
    }
  }
  return Status::Ok();
}

// One parameter's entry: its id, dtype, shape, layout, dtype chain, stages and sketch.
Status CheckParam(const pb::RunInfo& run, int i) {
  const pb::ParamInfo& p = run.params(i);
  // Named only when something is wrong: built eagerly, it was 9 % of a 4,096-rank diff of a 20,000-tensor model
  // (every rank's RunInfo lists the whole table; issue 42).
  auto where = [&p, i] { return "param " + std::to_string(i) + " " + Quoted(p.name()); };
  if (p.id() != i)
    return Status::Corruption(where() + ": id " + std::to_string(p.id()) + ", expected " + std::to_string(i));
  if (DTypeSize(p.dtype()) == 0) return Status::Corruption(where() + ": unknown dtype " + std::to_string(p.dtype()));
  int64_t n = 1;
  for (int64_t d : p.shape()) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d)) {
      return Status::Corruption(where() + ": invalid shape");
    }
    n *= d;
  }
  if (p.numel() != n) {
    return Status::Corruption(where() + ": numel " + std::to_string(p.numel()) + " != product of shape " +
                              std::to_string(n));
  }
  // 1.2 layout: a partition dim must name one of the shape's dimensions.
  if (p.has_partition_dim() && (p.partition_dim() < 0 || p.partition_dim() >= p.shape_size())) {
    return Status::Corruption(where() + ": partition_dim " + std::to_string(p.partition_dim()) + " outside its " +
                              std::to_string(p.shape_size()) + "-d shape");
  }
  if (p.shard_count() < 0) return Status::Corruption(where() + ": negative shard_count");
  // 1.4 precision chain and initial-weight sketch.
  for (auto [field, dtype] :
       {std::pair{"grad_dtype", p.grad_dtype()}, {"comm_dtype", p.comm_dtype()}, {"accum_dtype", p.accum_dtype()}}) {
    if (dtype != pb::DTYPE_UNSPECIFIED && DTypeSize(dtype) == 0) {
      return Status::Corruption(where() + ": unknown " + field + " " + std::to_string(dtype));
    }
  }
  // 1.5: the stages holding it, each a stage of the pipeline (at most two: a tied parameter's copies).
  if (p.stages_size() > 2)
    return Status::Corruption(where() + ": held by " + std::to_string(p.stages_size()) + " stages, at most 2");
  for (int32_t st : p.stages()) {
    if (st < 0 || (run.config().pp_stages() > 0 && st >= run.config().pp_stages())) {
      return Status::Corruption(where() + ": stage " + std::to_string(st) + " outside the pipeline's " +
                                std::to_string(run.config().pp_stages()) + " stages");
    }
  }
  if (p.init_sketch_size() > format::kInitSketchSize || p.init_sketch_size() > p.numel()) {
    return Status::Corruption(where() + ": init_sketch holds " + std::to_string(p.init_sketch_size()) +
                              " values, at most min(numel, " + std::to_string(format::kInitSketchSize) + ")");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateRunInfo(const pb::RunInfo& run) {
  if (run.params_size() > format::kMaxParams) {
    return Status::LimitExceeded("RunInfo lists " + std::to_string(run.params_size()) + " params (limit " +
                                 std::to_string(format::kMaxParams) + ")");
  }
  for (int i = 0; i < run.params_size(); ++i) GT_RETURN_IF_ERROR(CheckParam(run, i));
  const pb::Config& c = run.config();
  for (auto [name, degree] : {std::pair{"world", c.world()},
                              {"dp", c.dp()},
                              {"sp", c.sp()},
                              {"tp", c.tp()},
                              {"pp", c.pp()},
                              {"cp", c.cp()},
                              {"ep_size", c.ep_size()},
                              {"edp", c.edp()},
                              {"replicate", c.replicate()},
                              {"pp_stages", c.pp_stages()},
                              {"pp_microbatches", c.pp_microbatches()}}) {
    if (degree < 0) return Status::Corruption(std::string("config: negative ") + name + " " + std::to_string(degree));
  }
  if (c.comm_dtype() != pb::DTYPE_UNSPECIFIED && DTypeSize(c.comm_dtype()) == 0) {
    return Status::Corruption("config: unknown comm_dtype " + std::to_string(c.comm_dtype()));
  }
  return CheckRanks(run);
}

Status ValidateBucketRecord(const pb::RunInfo& run, const pb::BucketRecord& record,
                            const std::vector<std::string_view>* full_data) {
  if (full_data != nullptr && full_data->size() != static_cast<size_t>(record.slices_size())) {
    return Status::InvalidArgument("full data for " + std::to_string(full_data->size()) + " of " +
                                   std::to_string(record.slices_size()) + " slices");
  }
  for (int i = 0; i < record.slices_size(); ++i) {
    const pb::Slice& s = record.slices(i);
    const size_t bytes = full_data != nullptr ? (*full_data)[static_cast<size_t>(i)].size() : s.full().data().size();
    GT_RETURN_IF_ERROR(CheckSlice(run, i, s, bytes));
  }
  if (record.chunk_count() < 0 || record.chunk() < 0 ||
      (record.chunk_count() > 0 && record.chunk() >= record.chunk_count())) {
    return Status::Corruption("chunk " + std::to_string(record.chunk()) + " of " +
                              std::to_string(record.chunk_count()));
  }
  return Status::Ok();
}

}  // namespace gradtrace
