#include "synth_cluster.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "rank_file.h"
#include "sketch.h"
#include "slice_codec.h"
#include "trace_writer.h"

namespace gradtrace::testing {
namespace fs = std::filesystem;

std::vector<SynthParam> LlamaParams(int layers, const ModelShape& m) {
  const int64_t hidden = m.hidden, inter = m.intermediate;
  std::vector<SynthParam> out{{"model.embed_tokens.weight", {m.vocab, hidden}}};
  for (int i = 0; i < layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    out.push_back({l + "self_attn.q_proj.weight", {hidden, hidden}});
    out.push_back({l + "self_attn.k_proj.weight", {m.kv, hidden}});
    out.push_back({l + "self_attn.v_proj.weight", {m.kv, hidden}});
    out.push_back({l + "self_attn.o_proj.weight", {hidden, hidden}});
    if (m.experts == 0) {
      out.push_back({l + "mlp.gate_proj.weight", {inter, hidden}});
      out.push_back({l + "mlp.up_proj.weight", {inter, hidden}});
      out.push_back({l + "mlp.down_proj.weight", {hidden, inter}});
    } else {
      out.push_back({l + "mlp.gate.weight", {m.experts, hidden}});
      for (int e = 0; e < m.experts; ++e) {
        const std::string x = l + "mlp.experts." + std::to_string(e) + ".";
        out.push_back({x + "gate_proj.weight", {inter, hidden}});
        out.push_back({x + "up_proj.weight", {inter, hidden}});
        out.push_back({x + "down_proj.weight", {hidden, inter}});
      }
    }
    out.push_back({l + "input_layernorm.weight", {hidden}});
    out.push_back({l + "post_attention_layernorm.weight", {hidden}});
  }
  out.push_back({"model.norm.weight", {hidden}});
  out.push_back({"lm_head.weight", {m.vocab, hidden}});
  return out;
}

namespace {

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Megatron's split: column-parallel (output rows) along dim 0, row-parallel along dim 1, norms replicated.
// Experts (ModelShape.experts) are split along dim 0 whatever their role: one slice per rank, so that a model of
// 20,000 tensors stays small in stats mode (a row-parallel shard is a slice per row there).
int PartitionDim(const std::string& name) {
  if (name.find(".mlp.experts.") != std::string::npos) return 0;
  if (EndsWith(name, "o_proj.weight") || EndsWith(name, "down_proj.weight")) return 1;
  if (EndsWith(name, "norm.weight") || EndsWith(name, "mlp.gate.weight")) return -1;
  return 0;
}

int StageOf(const std::string& name, int layers, int pp) {
  const std::string pre = "model.layers.";
  if (name.rfind(pre, 0) == 0) return std::stoi(name.substr(pre.size())) / (layers / pp);
  return name == "model.embed_tokens.weight" ? 0 : pp - 1;
}

double UnitInterval(uint64_t h) { return (sketch::Mix64(h) >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

// One slice a rank writes of a parameter: elements [offset, offset + count) and, in sketch mode, the
// parameter's sketch positions inside it.
struct Piece {
  int64_t offset = 0, count = 0;
  std::vector<int64_t> positions;
};

// The pieces tp rank `t` holds of parameter `p` (positions: the parameter's sketch, or null in stats mode).
std::vector<Piece> PiecesOf(const pb::ParamInfo& p, int tp, int t, const std::vector<int64_t>* positions) {
  std::vector<Piece> out;
  const int dim = p.kind() == pb::TP_SHARD ? p.partition_dim() : -1;
  auto inside = [&](Piece* piece) {
    if (positions == nullptr) return;
    auto lo = std::lower_bound(positions->begin(), positions->end(), piece->offset);
    auto hi = std::lower_bound(lo, positions->end(), piece->offset + piece->count);
    piece->positions.assign(lo, hi);
  };
  if (dim <= 0) {  // whole, or a contiguous block of rows
    Piece piece;
    piece.count = dim < 0 ? p.numel() : p.numel() / tp;
    piece.offset = dim < 0 ? 0 : t * piece.count;
    inside(&piece);
    out.push_back(std::move(piece));
    return out;
  }
  const int64_t rows = p.shape(0), cols = p.shape(1), width = cols / tp;
  if (positions == nullptr) {
    for (int64_t r = 0; r < rows; ++r) out.push_back({r * cols + t * width, width, {}});
    return out;
  }
  // Sketch: only rows whose run of this rank's columns holds a position (an empty sketch slice says nothing).
  for (int64_t pos : *positions) {
    const int64_t row = pos / cols, col = pos % cols;
    if (col / width != t) continue;
    if (out.empty() || out.back().offset != row * cols + t * width) out.push_back({row * cols + t * width, width, {}});
    out.back().positions.push_back(pos);
  }
  return out;
}

// Closed-form moments of the reference gradient over one slice (stats mode).
pb::StatsPayload SliceMoments(uint64_t key, int64_t offset, int64_t count, int64_t step) {
  const uint64_t h = key ^ sketch::Mix64(static_cast<uint64_t>(offset) * 0x9E3779B97F4A7C15ull + step);
  const double mu = 1e-4 * (UnitInterval(key + 1) - 0.5), sigma = 0.005 * (0.5 + UnitInterval(key + 2));
  const double n = static_cast<double>(count);
  pb::StatsPayload s;
  s.set_count(count);
  s.set_sum(n * mu + 2 * sigma * std::sqrt(n) * (UnitInterval(h) - 0.5));
  s.set_sum_sq(n * (mu * mu + sigma * sigma) * (0.9 + 0.2 * UnitInterval(h + 1)));
  s.set_abs_max(4.5 * sigma + std::fabs(mu));
  return s;
}

pb::StatsPayload Scaled(const pb::StatsPayload& s, double c) {
  pb::StatsPayload out = s;
  out.set_sum(s.sum() * c);
  out.set_sum_sq(s.sum_sq() * c * c);
  out.set_abs_max(s.abs_max() * std::fabs(c));
  return out;
}

// Member j's share of dp x g at element (or slice) `at`: positive weights summing to dp over the group.
std::vector<double> Shares(uint64_t key, int64_t at, int dp) {
  std::vector<double> w(dp);
  double sum = 0;
  for (int j = 0; j < dp; ++j) sum += w[j] = 0.5 + UnitInterval(key ^ (static_cast<uint64_t>(at) * 131 + 7919ull * j));
  for (double& x : w) x *= dp / sum;
  return w;
}

struct Plan {
  const ClusterSpec& spec;
  CaptureMode mode;
  pb::RunInfo run;                                     // the table and config every rank shares
  std::vector<std::vector<int64_t>> positions;         // per parameter (sketch mode)
  std::vector<std::vector<std::vector<int>>> buckets;  // per stage: buckets of parameter ids
};

int MicroBatches(const ClusterSpec& s) { return s.microbatches > 0 ? s.microbatches : 2 * s.pp; }

int RankOf(const ClusterSpec& s, int t, int d, int st) { return t + s.tp * (d + s.dp * st); }

pb::RunInfo RankRun(const Plan& plan, int t, int d, int st) {
  const ClusterSpec& s = plan.spec;
  pb::RunInfo rr = plan.run;
  rr.set_rank(RankOf(s, t, d, st));
  rr.set_dp_rank(d);
  rr.set_tp_rank(t);
  rr.set_pp_rank(st);
  rr.set_host("node" + std::to_string(rr.rank() / 8));
  auto add = [&](const char* name, int n, auto member) {
    pb::ProcessGroup* g = rr.add_groups();
    g->set_name(name);
    for (int k = 0; k < n; ++k) g->add_ranks(member(k));
  };
  add("tp", s.tp, [&](int k) { return RankOf(s, k, d, st); });
  add("dp", s.dp, [&](int k) { return RankOf(s, t, k, st); });
  add("pp", s.pp, [&](int k) { return RankOf(s, t, d, k); });
  if (s.world_group) add("world", s.dp * s.tp * s.pp, [](int k) { return k; });
  return rr;
}

// The records of one bucket for one step on the dp group of (stage, tp rank t): PRE per member, and the
// POST (= FINAL, one reduction per step) every member holds.
struct BucketRecords {
  std::vector<pb::BucketRecord> pre;
  pb::BucketRecord post;
};

BucketRecords MakeBucket(const Plan& plan, const std::vector<int>& ids, int bucket_id, int t, int stage, int64_t step) {
  const ClusterSpec& s = plan.spec;
  const bool planted = stage == s.planted_stage;
  const double divisor = planted ? (s.planted_divisor > 0 ? s.planted_divisor : s.dp / 2.0) : s.dp;
  const int micro = MicroBatches(s) - 1;  // the reduction follows the last micro-batch
  BucketRecords out;
  out.pre.resize(s.dp);
  int64_t numel = 0;
  for (int j = 0; j < s.dp; ++j) {
    out.pre[j].set_step(step);
    out.pre[j].set_micro_step(micro);
    out.pre[j].set_bucket_id(bucket_id);
    out.pre[j].set_phase(pb::PRE_REDUCE);
    out.pre[j].set_group("dp");
  }
  out.post = out.pre[0];
  out.post.set_phase(pb::POST_REDUCE);
  const bool sketch = plan.mode.kind == CaptureMode::Kind::kSketch;
  for (int id : ids) {
    const pb::ParamInfo& p = plan.run.params(id);
    const uint64_t key = sketch::Fnv1a64(p.name());
    for (const Piece& piece : PiecesOf(p, s.tp, t, sketch ? &plan.positions[id] : nullptr)) {
      numel += piece.count;
      pb::Slice base;
      base.set_param_id(id);
      base.set_offset(piece.offset);
      base.set_count(piece.count);
      base.set_dtype(pb::FP32);
      std::vector<pb::Slice> pre(s.dp, base);
      pb::Slice post = base;
      if (sketch) {
        post.mutable_sketch()->set_k(plan.mode.k);
        for (auto& sl : pre) sl.mutable_sketch()->set_k(plan.mode.k);
        for (int64_t pos : piece.positions) {
          const double g = ReferenceGradient(p.name(), pos, step);
          const std::vector<double> w = Shares(key, pos, s.dp);
          float sum = 0;  // the reduction in fp32, in rank order
          for (int j = 0; j < s.dp; ++j) {
            const float v = static_cast<float>(g * w[j]);
            sum += v;
            pre[j].mutable_sketch()->add_positions(pos);
            pre[j].mutable_sketch()->add_values(v);
          }
          post.mutable_sketch()->add_positions(pos);
          post.mutable_sketch()->add_values(static_cast<float>(sum / divisor));
        }
      } else {
        const pb::StatsPayload g = SliceMoments(key, piece.offset, piece.count, step);
        const std::vector<double> w = Shares(key, piece.offset, s.dp);
        double total = 0;
        for (int j = 0; j < s.dp; ++j) {
          *pre[j].mutable_stats() = Scaled(g, w[j]);
          total += w[j];
        }
        *post.mutable_stats() = Scaled(g, total / divisor);
      }
      for (int j = 0; j < s.dp; ++j) *out.pre[j].add_slices() = std::move(pre[j]);
      *out.post.add_slices() = std::move(post);
    }
  }
  for (auto& r : out.pre) r.set_bucket_numel(numel);
  out.post.set_bucket_numel(numel);
  return out;
}

// Writes the dp rank files of (stage, tp rank t).
Status WriteGroup(const std::string& dir, const Plan& plan, int t, int stage) {
  const ClusterSpec& s = plan.spec;
  std::vector<std::unique_ptr<TraceWriter>> writers;
  for (int d = 0; d < s.dp; ++d) {
    auto w =
        TraceWriter::Open((fs::path(dir) / RankFileName(RankOf(s, t, d, stage))).string(), RankRun(plan, t, d, stage));
    if (!w.ok()) return w.status();
    writers.push_back(std::move(*w));
  }
  const int micro = MicroBatches(s);
  const auto& buckets = plan.buckets[stage];
  for (int64_t step = 0; step < s.steps; ++step) {
    for (int d = 0; d < s.dp; ++d) {
      for (int m = 0; m < micro; ++m) {
        pb::StepInfo si;
        si.set_step(step);
        si.set_micro_step(m);
        si.set_loss(stage == s.pp - 1 ? 2.5 + 0.001 * d : 0);  // only the last stage computes the loss
        si.set_valid_tokens(4096);
        GT_RETURN_IF_ERROR(writers[d]->WriteStep(si));
      }
    }
    std::vector<pb::BucketRecord> finals;
    for (size_t b = 0; b < buckets.size(); ++b) {
      BucketRecords rec = MakeBucket(plan, buckets[b], static_cast<int>(b), t, stage, step);
      for (int d = 0; d < s.dp && !s.final_only; ++d) {
        GT_RETURN_IF_ERROR(writers[d]->WriteBucket(rec.pre[d]));
        GT_RETURN_IF_ERROR(writers[d]->WriteBucket(rec.post));
      }
      pb::BucketRecord fin = std::move(rec.post);
      fin.set_phase(pb::FINAL);
      fin.set_group("");
      fin.set_bucket_numel(0);
      finals.push_back(std::move(fin));
    }
    for (const auto& fin : finals) {
      for (int d = 0; d < s.dp; ++d) GT_RETURN_IF_ERROR(writers[d]->WriteBucket(fin));
    }
  }
  for (auto& w : writers) GT_RETURN_IF_ERROR(w->Close());
  return Status::Ok();
}

Status CheckSpec(const ClusterSpec& s, const CaptureMode& mode) {
  if (mode.kind == CaptureMode::Kind::kFull) {
    return Status::InvalidArgument("capture 'full' is not simulated at 70B scale (use sketch:K or stats)");
  }
  if (s.dp < 1 || s.tp < 1 || s.pp < 1 || s.layers < 1 || s.steps < 1) {
    return Status::InvalidArgument("dp, tp, pp, layers and steps must be >= 1");
  }
  if (s.layers % s.pp != 0) {
    return Status::InvalidArgument("layers (" + std::to_string(s.layers) + ") must divide evenly over pp " +
                                   std::to_string(s.pp) + " stages");
  }
  const ModelShape& m = s.shape;
  if (m.hidden < 1 || m.intermediate < 1 || m.kv < 1 || m.vocab < 1 || m.experts < 0) {
    return Status::InvalidArgument("hidden, intermediate, kv and vocab must be >= 1, experts >= 0");
  }
  if (m.hidden % s.tp != 0 || m.intermediate % s.tp != 0 || m.kv % s.tp != 0 || m.vocab % s.tp != 0) {
    return Status::InvalidArgument("tp " + std::to_string(s.tp) + " must divide every sharded dimension (" +
                                   std::to_string(m.kv) + " k/v rows, " + std::to_string(m.vocab) +
                                   " vocab rows, hidden " + std::to_string(m.hidden) + ", intermediate " +
                                   std::to_string(m.intermediate) + ")");
  }
  if (s.planted_stage >= s.pp) {
    return Status::InvalidArgument("planted stage " + std::to_string(s.planted_stage) + " outside the " +
                                   std::to_string(s.pp) + " stages");
  }
  return Status::Ok();
}

}  // namespace

Status WriteClusterSet(const std::string& dir, const ClusterSpec& spec) {
  auto mode = ParseCaptureMode(spec.capture);
  if (!mode.ok()) return mode.status();
  GT_RETURN_IF_ERROR(CheckSpec(spec, *mode));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(dir + ": " + ec.message());

  Plan plan{spec, *mode, {}, {}, {}};
  pb::RunInfo& run = plan.run;
  run.set_producer("gradtrace-synth");
  run.set_producer_version("cluster");
  run.set_framework("megatron-lm");
  run.set_run_id(!spec.run_id.empty() ? spec.run_id
                                      : "llama70b-dp" + std::to_string(spec.dp) + "-tp" + std::to_string(spec.tp) +
                                            "-pp" + std::to_string(spec.pp) + "-" + spec.capture);
  pb::Config* c = run.mutable_config();
  c->set_world(spec.dp * spec.tp * spec.pp);
  c->set_dp(spec.dp);
  c->set_sp(1);
  c->set_tp(spec.tp);
  c->set_pp(spec.pp);
  c->set_pp_stages(spec.pp);
  c->set_pp_microbatches(MicroBatches(spec));
  c->set_pp_schedule("megatron-1f1b");
  c->set_scaling("mean");
  c->set_loss("local-mean");
  c->set_gas(1);
  c->set_dtype(pb::FP32);
  c->set_seed(1);
  c->set_backend("nccl");
  c->set_capture_mode(spec.capture);
  c->set_layers(spec.layers);
  c->set_hidden(spec.shape.hidden);
  c->set_heads(64);
  c->set_vocab(spec.shape.vocab);
  c->set_steps(spec.steps);
  const std::vector<SynthParam> params = LlamaParams(spec.layers, spec.shape);
  plan.buckets.assign(spec.pp, {});
  for (size_t i = 0; i < params.size(); ++i) {
    pb::ParamInfo* p = run.add_params();
    p->set_id(static_cast<int>(i));
    p->set_name(params[i].name);
    for (int64_t d : params[i].shape) p->add_shape(d);
    p->set_dtype(pb::FP32);
    p->set_numel(params[i].shape.size() == 1 ? params[i].shape[0] : params[i].shape[0] * params[i].shape[1]);
    p->set_grad_group("dp");
    const int dim = PartitionDim(p->name());
    if (spec.tp == 1) {
      p->set_kind(pb::DENSE);
    } else if (dim < 0) {
      p->set_kind(pb::REPLICATED);
    } else {
      p->set_kind(pb::TP_SHARD);
      p->set_partition_dim(dim);
      p->set_shard_count(spec.tp);
    }
    const int stage = StageOf(p->name(), spec.layers, spec.pp);
    if (spec.pp > 1) p->add_stages(stage);
    // Buckets: the embedding, one per layer, the final norm with lm_head.
    auto& stage_buckets = plan.buckets[stage];
    const bool layer_start = EndsWith(p->name(), "q_proj.weight") || p->name() == "model.norm.weight";
    if (stage_buckets.empty() || layer_start) stage_buckets.emplace_back();
    stage_buckets.back().push_back(static_cast<int>(i));
    if (mode->kind == CaptureMode::Kind::kSketch) {
      plan.positions.push_back(SketchPositions(p->name(), p->numel(), mode->k));
    }
  }
  run.set_model_fingerprint(ModelFingerprint(run));

  // (stage, tp rank) groups, each writing its dp files, spread over the threads.
  std::atomic<int> next{0};
  std::mutex mu;
  Status first = Status::Ok();
  auto work = [&] {
    for (int g = next++; g < spec.pp * spec.tp; g = next++) {
      Status st = WriteGroup(dir, plan, g % spec.tp, g / spec.tp);
      std::lock_guard<std::mutex> lock(mu);
      if (!st.ok() && first.ok()) first = st;
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < std::max(1, spec.threads); ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  return first;
}

}  // namespace gradtrace::testing
