#include "synth_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "expected_divisor.h"
#include "init_sketch.h"
#include "loss_recipes.h"
#include "rank_file.h"
#include "reduction_path.h"
#include "scaling_policy.h"
#include "slice_codec.h"
#include "trace_writer.h"

namespace gradtrace::testing {
namespace fs = std::filesystem;

std::vector<SynthParam> DefaultParams() {
  return {
      {"embed.weight", {64, 16}},
      {"layers.0.attn.qkv.weight", {48, 16}},
      {"layers.0.attn.qkv.bias", {48}},
      {"layers.0.attn.out.weight", {16, 16}},
      {"layers.0.mlp.fc1.weight", {64, 16}},
      {"layers.0.mlp.fc2.weight", {16, 64}},
      {"layers.0.norm.weight", {16}},
      {"layers.1.attn.qkv.weight", {48, 16}},
      {"layers.1.attn.qkv.bias", {48}},
      {"layers.1.attn.out.weight", {16, 16}},
      {"layers.1.mlp.fc1.weight", {64, 16}},
      {"layers.1.mlp.fc2.weight", {16, 64}},
      {"layers.1.norm.weight", {16}},
      {"head.weight", {64, 16}},
  };
}

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

double Unit(uint64_t h) { return (Mix(h) >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)

float RoundFp32(double v) { return static_cast<float>(v); }

int64_t Numel(const SynthParam& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  return n;
}

// The path a bucket of `bucket_numel` elements takes under the recorded settings, as gradtrace-train's reducer
// chooses it.
semantics::ReductionPath PathOf(const pb::Config& c, int64_t bucket_numel) {
  return semantics::ChooseReductionPath(c.zero_stage(), semantics::RecordedZeroSettings(c), bucket_numel);
}

// Whether POST_REDUCE holds each rank's partition of the bucket (else the whole bucket), as in
// capture/train/reducer.cc.
bool Partitioned(const pb::Config& c, semantics::ReductionPath path) {
  return path == semantics::ReductionPath::kZero3ReduceScatter ||
         (path == semantics::ReductionPath::kZeroPartitioned && semantics::RecordedZeroSettings(c).reduce_scatter);
}

// The divisor of a bucket reduced over `group` ranks on `path`: the policy's
// plan, or under divide_as_expected what the recorded layout needs.
Expected<double> Divisor(const SynthSpec& s, const pb::Config& c, int group, bool expert,
                         semantics::ReductionPath path) {
  if (s.divide_as_expected) return semantics::ExpectedDivisor(c, expert ? pb::EXPERT : pb::DENSE, group);
  auto policy = semantics::ResolvePolicy(s.scaling);
  if (!policy.ok()) return policy.status();
  semantics::BucketContext b;
  b.path = path;
  b.reduce_scatter = semantics::RecordedZeroSettings(c).reduce_scatter;
  b.group_size = group;
  b.sp = s.sp;
  b.has_moe = expert;
  return semantics::PlanBucketScaling(*policy, b).Divisor();
}

struct Layout {
  int64_t bucket_numel = 0;
  bool expert = false;
  std::vector<std::pair<int, int64_t>> members;  // (param index, offset of the param in the flat bucket)
};

// Whether two records hold the same slices, values included (byte for byte as serialized).
bool SameSlices(const pb::BucketRecord& x, const pb::BucketRecord& y) {
  if (x.slices_size() != y.slices_size()) return false;
  for (int i = 0; i < x.slices_size(); ++i) {
    if (x.slices(i).SerializeAsString() != y.slices(i).SerializeAsString()) return false;
  }
  return true;
}

// final_from_pre: each rank's host name padded (with up to 63 spaces) so that every rank's RunInfo frame has the same
// length; the frames after it then sit at the same offsets, and the ranks' references are byte for byte the same.
// Each pad is tried once per rank (a small file, overwritten); the shortest length all ranks reach is taken.
Status PadHostsToEqualRunInfo(const std::string& dir, std::vector<pb::RunInfo>* runs) {
  WriterOptions trial;
  trial.overwrite = true;
  std::vector<std::map<uint64_t, int>> pad_of_length(runs->size());
  for (size_t r = 0; r < runs->size(); ++r) {
    pb::RunInfo run = (*runs)[r];
    for (int pad = 0; pad < 64; ++pad) {
      run.set_host("localhost" + std::string(static_cast<size_t>(pad), ' '));
      auto w = TraceWriter::Open((fs::path(dir) / RankFileName(static_cast<int>(r))).string(), run, trial);
      if (!w.ok()) return w.status();
      pad_of_length[r].emplace((*w)->bytes_written(), pad);
    }
  }
  for (const auto& [length, unused] : pad_of_length[0]) {
    bool everywhere = true;
    for (const auto& lengths : pad_of_length) everywhere &= lengths.count(length) > 0;
    if (!everywhere) continue;
    for (size_t r = 0; r < runs->size(); ++r) {
      (*runs)[r].set_host("localhost" + std::string(static_cast<size_t>(pad_of_length[r].at(length)), ' '));
    }
    return Status::Ok();
  }
  return Status::InvalidArgument("no host padding gives every rank's RunInfo the same length");
}

}  // namespace

double ReferenceGradient(const std::string& name, int64_t index, int64_t step) {
  uint64_t h = HashName(name) ^ Mix(static_cast<uint64_t>(index) * 2654435761ull + step);
  // Values of mixed sign and magnitude, never exactly zero.
  return (Unit(h) - 0.5) * 0.02 + (index % 7 == 0 ? 1e-3 : -2e-4) * (1 + step);
}

Status WriteSynthSet(const std::string& dir, const SynthSpec& spec) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(dir + ": " + ec.message());
  const int split = spec.sp * spec.cp;
  const int world = spec.dp * split;
  const int ep = std::max(1, spec.ep);
  auto mode = ParseCaptureMode(spec.capture);
  if (!mode.ok()) return mode.status();

  pb::RunInfo run;
  run.set_producer("gradtrace-synth");
  run.set_producer_version("test");
  run.set_run_id(!spec.run_id.empty() ? spec.run_id
                                      : "synth-dp" + std::to_string(spec.dp) + "-sp" + std::to_string(spec.sp) + "-" +
                                            spec.scaling + "-" + spec.loss + "-" + spec.capture);
  pb::Config* c = run.mutable_config();
  c->set_world(world);
  c->set_dp(spec.dp);
  c->set_sp(spec.sp);
  c->set_cp(spec.cp);
  if (!spec.experts.empty()) {
    c->set_moe_experts(static_cast<int>(spec.experts.size()));
    c->set_ep_size(ep);
    c->set_edp(world / ep);
  }
  c->set_zero_stage(spec.zero_stage);
  c->set_scaling(spec.recorded_scaling == "=" ? spec.scaling : spec.recorded_scaling);
  c->set_loss(spec.loss);
  c->set_gas(spec.recorded_gas >= 0 ? spec.recorded_gas : spec.gas);
  c->set_reduce_bucket_size(spec.bucket_elems);
  if (!spec.zero_reduce_scatter) (*c->mutable_extra())["zero_reduce_scatter"] = "false";
  if (!spec.zero_contiguous_gradients) (*c->mutable_extra())["zero_contiguous_gradients"] = "false";
  pb::DType comm = pb::DTYPE_UNSPECIFIED;
  if (!spec.comm_dtype.empty() && !ParseDType(spec.comm_dtype, &comm)) {
    return Status::InvalidArgument("comm dtype '" + spec.comm_dtype + "'");
  }
  if (spec.record_comm_dtype) c->set_comm_dtype(comm);
  c->set_comm_hook(spec.comm_hook);
  c->set_dtype(pb::FP32);
  c->set_seed(1);
  c->set_backend("gloo");
  c->set_capture_mode(spec.capture);
  c->set_seq_len(64);
  c->set_batch(8);
  c->set_steps(spec.steps);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    pb::ParamInfo* p = run.add_params();
    p->set_id(static_cast<int>(i));
    p->set_name(spec.name_prefix + spec.params[i].name);
    for (int64_t d : spec.params[i].shape) p->add_shape(d);
    p->set_dtype(pb::FP32);
    p->set_numel(Numel(spec.params[i]));
    const bool expert = spec.experts.count(spec.params[i].name) > 0;
    p->set_kind(expert ? pb::EXPERT : pb::DENSE);
    p->set_grad_group(expert ? "edp" : "sdp");
    if (!spec.accum_dtype.empty()) {
      pb::DType accum = pb::DTYPE_UNSPECIFIED;
      if (!ParseDType(spec.accum_dtype, &accum))
        return Status::InvalidArgument("accum dtype '" + spec.accum_dtype + "'");
      p->set_accum_dtype(accum);
    }
    if (spec.init_seed != 0) {
      for (int64_t pos : InitSketchPositions(p->numel())) {
        p->add_init_sketch(RoundFp32(Unit(spec.init_seed * 7919 + HashName(p->name()) + pos * 131) - 0.5));
      }
    }
  }
  if (!spec.framework.empty()) run.set_framework(spec.framework);
  run.set_model_fingerprint(ModelFingerprint(run));

  // Buckets: parameters in order, packed up to bucket_elems.
  std::vector<Layout> buckets;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    int64_t n = Numel(spec.params[i]);
    const bool expert = spec.experts.count(spec.params[i].name) > 0;
    if (buckets.empty() || (buckets.back().bucket_numel > 0 && buckets.back().bucket_numel + n > spec.bucket_elems) ||
        buckets.back().expert != expert) {
      buckets.emplace_back();
      buckets.back().expert = expert;
    }
    buckets.back().members.emplace_back(static_cast<int>(i), buckets.back().bucket_numel);
    buckets.back().bucket_numel += n;
  }

  std::vector<std::unique_ptr<TraceWriter>> writers;
  std::vector<pb::RunInfo> runs;
  for (int r = 0; r < world; ++r) {
    pb::RunInfo rr = run;
    rr.set_rank(r);
    rr.set_dp_rank(r / split);
    rr.set_sp_rank(r % split);
    rr.set_host("localhost");
    auto* sdp = rr.add_groups();
    sdp->set_name("sdp");
    for (int k = 0; k < world; ++k) sdp->add_ranks(k);
    auto* spg = rr.add_groups();
    spg->set_name("sp");
    for (int k = 0; k < split; ++k) spg->add_ranks((r / split) * split + k);
    auto* dpg = rr.add_groups();
    dpg->set_name("dp");
    for (int k = 0; k < spec.dp; ++k) dpg->add_ranks(k * split + r % split);
    auto* edp = rr.add_groups();
    edp->set_name("edp");
    for (int k = r % ep; k < world; k += ep) edp->add_ranks(k);
    runs.push_back(std::move(rr));
  }
  if (!spec.final_from_pre.empty()) GT_RETURN_IF_ERROR(PadHostsToEqualRunInfo(dir, &runs));
  WriterOptions replace;
  replace.overwrite = !spec.final_from_pre.empty();  // PadHostsToEqualRunInfo's trials, never a user's trace
  for (int r = 0; r < world; ++r) {
    auto w = TraceWriter::Open((fs::path(dir) / RankFileName(r)).string(), runs[r], replace);
    if (!w.ok()) return w.status();
    writers.push_back(std::move(*w));
  }

  // What the ranks of one reduction add up to, in units of the reference gradient.
  const auto split_share = semantics::SplitShare(spec.loss, split);
  const double share = spec.dp * (split_share ? *split_share : split) * spec.loss_multiplier;
  // The reduction group of each rank for dense and for expert buckets.
  auto members_of = [&](int r, bool expert) {
    std::vector<int> g;
    for (int k = expert ? r % ep : 0; k < world; k += expert ? ep : 1) g.push_back(k);
    return g;
  };
  std::vector<double> divisors;   // per bucket
  std::vector<bool> partitioned;  // per bucket
  for (const Layout& L : buckets) {
    const semantics::ReductionPath path = PathOf(*c, L.bucket_numel);
    auto d = Divisor(spec, *c, L.expert ? world / ep : world, L.expert, path);
    if (!d.ok()) return d.status();
    divisors.push_back(*d);
    partitioned.push_back(Partitioned(*c, path));
  }
  for (int64_t step = 0; step < spec.steps; ++step) {
    for (int r = 0; r < world; ++r) {
      for (int m = 0; m < spec.gas; ++m) {
        pb::StepInfo si;
        si.set_step(step);
        si.set_micro_step(m);
        si.set_loss((2.5 + 0.01 * r) * spec.loss_multiplier);
        si.set_valid_tokens(64 * 8 / (world * spec.gas));
        GT_RETURN_IF_ERROR(writers[r]->WriteStep(si));
      }
      const bool reports_norm = r == 0 && spec.reported_grad_norm >= 0;
      if (spec.data_seed != 0 || reports_norm) {
        pb::StepInfo opt;
        opt.set_step(step);
        opt.set_micro_step(spec.gas - 1);
        opt.set_optimizer_step(true);
        if (reports_norm) opt.set_reported_grad_norm(spec.reported_grad_norm);
        // This rank's share of the step's 512 input ids (token ids 0..999 drawn from the data seed).
        const uint64_t seed = step < spec.data_seed_from_step ? 1 : spec.data_seed;
        for (int64_t t = r; spec.data_seed != 0 && t < 512; t += world) {
          const double id = std::floor(1000 * Unit(seed * 104729 + step * 512 + t));
          opt.set_input_count(opt.input_count() + 1);
          opt.set_input_sum(opt.input_sum() + id);
          opt.set_input_sumsq(opt.input_sumsq() + id * id);
        }
        GT_RETURN_IF_ERROR(writers[r]->WriteStep(opt));
      }
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      const Layout& L = buckets[b];
      // final[e] over the flat bucket, accumulated over micro-steps.
      std::vector<std::vector<float>> final_of(world, std::vector<float>(L.bucket_numel, 0.0f));
      std::vector<std::vector<WrittenFrame>> pre_frames(world);   // the last micro-step's PRE_REDUCE frames
      std::vector<pb::BucketRecord> pre_records(world);           // and its records (final_from_pre)
      std::vector<std::vector<WrittenFrame>> post_frames(world);  // the last micro-step's POST_REDUCE frames
      std::vector<pb::BucketRecord> post_records(world);          // and its records (final_by_reference)
      for (int m = 0; m < spec.gas; ++m) {
        for (auto& f : pre_frames) f.clear();
        std::vector<std::vector<float>> pre(world, std::vector<float>(L.bucket_numel));
        const double divisor = divisors[b];
        const int groups = L.expert ? ep : 1;
        const int cells = (world / groups) * spec.gas;
        for (const auto& [pi, base] : L.members) {
          const SynthParam& P = spec.params[pi];
          int64_t n = Numel(P);
          for (int64_t i = 0; i < n; ++i) {
            double g = ReferenceGradient(P.name, i, step);
            if (spec.scramble.count(P.name)) g = ReferenceGradient(P.name + "#scrambled", i, step);
            // Each reduction group's cells (members x gas) share it: positive weights summing to 1.
            for (int j = 0; j < groups; ++j) {
              const std::vector<int> members = members_of(j, L.expert);
              double wsum = 0;
              std::vector<double> wts(cells);
              for (int k = 0; k < cells; ++k) {
                wts[k] = 0.5 + Unit(spec.split_seed * 1000003 + HashName(P.name) + i * 131 + k + 7919 * j);
                wsum += wts[k];
              }
              for (size_t q = 0; q < members.size(); ++q) {
                pre[members[q]][base + i] = RoundFp32(share * g * wts[q * spec.gas + m] / wsum);
              }
            }
          }
        }
        // Reduction in fp32, in rank order over each rank's group, then the planned division.
        std::vector<std::vector<float>> post_of(world, std::vector<float>(L.bucket_numel));
        for (int r = 0; r < world; ++r) {
          const std::vector<int> members = members_of(r, L.expert);
          for (int64_t e = 0; e < L.bucket_numel; ++e) {
            float sum = 0;
            for (int k : members) sum += pre[k][e];
            post_of[r][e] = RoundFp32(sum / divisor);
            if (comm != pb::DTYPE_UNSPECIFIED) {  // a compression hook: the sum travels in the comm dtype
              uint8_t narrow[8];
              DoubleToElement(comm, post_of[r][e], narrow);
              post_of[r][e] = RoundFp32(ElementToDouble(comm, narrow));
            }
          }
        }
        for (const auto& [pi, base] : L.members) {
          auto it = spec.extra_factor.find(spec.params[pi].name);
          if (it == spec.extra_factor.end() || step < spec.factor_from_step) continue;
          for (auto& post_flat : post_of) {
            for (int64_t i = 0; i < Numel(spec.params[pi]); ++i) post_flat[base + i] *= static_cast<float>(it->second);
          }
        }
        for (int r = 0; r < world; ++r) {
          for (int64_t e = 0; e < L.bucket_numel; ++e) final_of[r][e] += post_of[r][e];
        }
        if (!spec.write_pre_post) continue;
        int64_t part = (L.bucket_numel + world - 1) / world;
        for (int r = 0; r < world; ++r) {
          pb::BucketRecord rec;
          rec.set_step(step);
          rec.set_micro_step(m);
          rec.set_bucket_id(static_cast<int>(b));
          rec.set_phase(pb::PRE_REDUCE);
          rec.set_group(L.expert ? "edp" : "sdp");
          rec.set_bucket_numel(L.bucket_numel);
          for (const auto& [pi, base] : L.members) {
            *rec.add_slices() =
                MakeSlice(run.params(pi), 0, Numel(spec.params[pi]), pb::FP32, pre[r].data() + base, *mode);
          }
          GT_RETURN_IF_ERROR(writers[r]->WriteBucket(rec, &pre_frames[r]));
          pre_records[r] = rec;
          // POST_REDUCE: the whole bucket (stage 0, all-reduce paths) or this rank's partition.
          int64_t lo = 0, hi = L.bucket_numel;
          if (partitioned[b]) {
            lo = std::min(L.bucket_numel, r * part);
            hi = std::min(L.bucket_numel, lo + part);
          }
          pb::BucketRecord post;
          post.set_step(step);
          post.set_micro_step(m);
          post.set_bucket_id(static_cast<int>(b));
          post.set_phase(pb::POST_REDUCE);
          post.set_group(L.expert ? "edp" : "sdp");
          post.set_bucket_numel(L.bucket_numel);
          post.set_partition_offset(lo);
          post.set_partition_count(hi - lo);
          if (spec.declare_divisor) post.set_divisor(divisor);
          for (const auto& [pi, base] : L.members) {
            int64_t n = Numel(spec.params[pi]);
            int64_t a = std::max(lo, base), z = std::min(hi, base + n);
            if (a >= z) continue;
            *post.add_slices() = MakeSlice(run.params(pi), a - base, z - a, pb::FP32, post_of[r].data() + a, *mode);
          }
          post_frames[r].clear();
          GT_RETURN_IF_ERROR(writers[r]->WriteBucket(post, &post_frames[r]));
          post_records[r] = post;
        }
      }
      // FINAL: every rank holds the full gradient (stage 0) or its partition (ZeRO-1/2).
      int64_t part = (L.bucket_numel + world - 1) / world;
      for (int r = 0; r < world; ++r) {
        std::vector<float> mine = final_of[r];
        if (r == spec.disagree_rank) {
          for (auto& v : mine) v *= 1.01f;
        }
        int64_t lo = 0, hi = L.bucket_numel;
        if (spec.zero_stage > 0) {
          lo = std::min(L.bucket_numel, r * part);
          hi = std::min(L.bucket_numel, lo + part);
        }
        pb::BucketRecord fin;
        fin.set_step(step);
        fin.set_micro_step(spec.gas - 1);
        fin.set_bucket_id(static_cast<int>(b));
        fin.set_phase(pb::FINAL);
        for (const auto& [pi, base] : L.members) {
          int64_t n = Numel(spec.params[pi]);
          int64_t a = std::max(lo, base), z = std::min(hi, base + n);
          if (a >= z) continue;
          *fin.add_slices() = MakeSlice(run.params(pi), a - base, z - a, pb::FP32, mine.data() + a, *mode);
        }
        if (spec.final_from_pre == "reference") {
          fin.clear_slices();
          GT_RETURN_IF_ERROR(writers[r]->WriteBucketValuesOf(fin, pre_frames[r]));
          continue;
        }
        if (spec.final_from_pre == "full") fin.mutable_slices()->CopyFrom(pre_records[r].slices());
        if (spec.final_by_reference && spec.gas == 1 && !post_frames[r].empty() && SameSlices(fin, post_records[r])) {
          fin.clear_slices();
          GT_RETURN_IF_ERROR(writers[r]->WriteBucketValuesOf(fin, post_frames[r]));
          continue;
        }
        if (fin.slices_size() > 0) GT_RETURN_IF_ERROR(writers[r]->WriteBucket(fin));
      }
    }
  }
  for (auto& w : writers) GT_RETURN_IF_ERROR(w->Close());
  return Status::Ok();
}

Status TruncateFile(const std::string& path, uint64_t new_size) {
  std::error_code ec;
  fs::resize_file(path, new_size, ec);
  if (ec) return Status::IoError(path + ": " + ec.message());
  return Status::Ok();
}

Status FlipByte(const std::string& path, uint64_t offset) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  if (f == nullptr) return Status::IoError(path + ": cannot open");
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  int c = std::fgetc(f);
  std::fseek(f, static_cast<long>(offset), SEEK_SET);
  std::fputc((c ^ 0x5a) & 0xff, f);
  std::fclose(f);
  return Status::Ok();
}

}  // namespace gradtrace::testing
