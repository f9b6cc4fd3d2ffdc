// gradtrace-train: parse the command line, launch or join the job, build the
// process groups, train and record. Exit codes: 0 success, 1 runtime failure
// (a rank died, a collective timed out, capture failed), 2 bad usage.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "guard_sink.h"
#include "init_sketch.h"
#include "launcher.h"
#include "loss.h"
#include "rank_file.h"
#include "recorder.h"
#include "recorder_sink.h"
#include "reducer.h"
#include "scaling_policy.h"
#include "slice_codec.h"
#include "trainer.h"

#ifndef GRADTRACE_VERSION
#define GRADTRACE_VERSION "0.0.0"
#endif

namespace gc = gradtrace::capture;
namespace pb = gradtrace::pb;

namespace {

// The options' dtype names are the codec's (proto/dtype.h), validated at parse time: an unknown one is a bug here.
pb::DType ProtoDTypeOf(const std::string& name) {
  pb::DType d = pb::DTYPE_UNSPECIFIED;
  TORCH_CHECK(gradtrace::ParseDType(name, &d), "unknown dtype '", name, "' passed ValidateTrainOptions");
  return d;
}

int UsageError(const std::string& message) {
  std::cerr << "gradtrace-train: error: " << message << "\n";
  return 2;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string SelfExe(const char* argv0) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(argv0) : p.string();
}

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

void FillConfig(const gc::TrainOptions& o, pb::Config* c) {
  c->set_world(o.dp * o.sp);
  c->set_dp(o.dp);
  c->set_sp(o.sp);
  c->set_zero_stage(o.zero_stage);
  c->set_scaling(o.scaling);
  c->set_loss(o.loss);
  c->set_gas(o.gas);
  c->set_reduce_bucket_size(o.reduce_bucket_size);
  c->set_dtype(ProtoDTypeOf(o.dtype));
  c->set_seed(o.seed);
  c->set_backend(o.backend);
  c->set_capture_mode(o.capture);
  c->set_moe_experts(o.moe_experts);
  // Every rank holds every expert: ep 1, and the expert-data-parallel group is the world.
  c->set_ep_size(1);
  c->set_edp(o.moe_experts > 0 ? o.dp * o.sp : 0);
  c->set_tp(1);
  c->set_pp(1);
  c->set_cp(1);
  c->set_loss_description(gc::LossDescription(o.loss));
  c->set_gradient_predivide_factor(o.gradient_predivide_factor);
  c->set_prescale_gradients(o.prescale_gradients);
  c->set_seq_len(o.seq_len);
  c->set_batch(o.batch);
  c->set_layers(o.layers);
  c->set_hidden(o.hidden);
  c->set_heads(o.heads);
  c->set_vocab(o.vocab);
  c->set_ignore_frac(o.ignore_frac);
  c->set_optimizer(o.optimizer);
  c->set_lr(o.lr);
  c->set_steps(o.steps);
  auto& extra = *c->mutable_extra();
  extra["zero_reduce_scatter"] = o.zero_reduce_scatter ? "true" : "false";
  extra["final"] = o.final_mode;
  if (!o.data_file.empty()) extra["data"] = o.data_file;
}

void AddGroup(const gc::NamedGroup& g, pb::RunInfo* run) {
  auto* pg = run->add_groups();
  pg->set_name(g.name);
  for (int r : g.ranks) pg->add_ranks(r);
}

// Creates --out and opens this rank's recorder. Returns 0, or the exit code
// after printing why. Under --on-capture-error disable a write error at open
// (--out cannot be created, the file cannot be written) is one warning and
// training goes on without capture (`recorder` empty, or one that records
// nothing); a trace already in --out (without --overwrite, or one a live run
// writes) is refused either way.
int OpenRecorder(const gc::TrainOptions& o, int rank, const pb::RunInfo& run, std::unique_ptr<gc::Recorder>* recorder) {
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec && o.on_capture_error == "disable") {  // as the recorder reports a write error: train on without capture
    std::cerr << "gradtrace: WARNING: rank " << rank << ": capture disabled after a write error: cannot create --out "
              << o.out << ": " << ec.message() << "; training continues without capture (no trace is written for "
              << "this rank)\n";
    return 0;
  }
  if (ec) {
    std::cerr << "gradtrace-train: rank " << rank << ": cannot create --out " << o.out << ": " << ec.message() << "\n";
    return 1;
  }
  gc::RecorderOptions ro;
  ro.path = (std::filesystem::path(o.out) / gradtrace::RankFileName(rank)).string();
  ro.mode = gradtrace::ParseCaptureMode(o.capture).value();
  if (!o.capture_steps.empty()) {
    auto steps = gc::ParseStepList(o.capture_steps).value();
    ro.steps = std::set<int64_t>(steps.begin(), steps.end());
  }
  ro.param_regex = o.capture_params;
  ro.on_error = o.on_capture_error == "disable" ? gc::OnCaptureError::kDisable : gc::OnCaptureError::kAbort;
  ro.overwrite = o.overwrite;
  ro.zstd_level = o.zstd_level;
  ro.values_by_reference = o.capture_references == "on";
  ro.direct_io = o.capture_direct_io == "on";
  ro.writer_threads = o.writer_threads;
  ro.max_queue_bytes = o.capture_queue_mb << 20;
  auto opened = gc::Recorder::Open(ro, run);
  if (!opened.ok()) {
    std::cerr << "gradtrace-train: rank " << rank << ": " << opened.status().message() << "\n";
    return 1;
  }
  *recorder = std::move(opened).value();
  return 0;
}

// Rank 0's capture cost in one line (tools/bench/capture_overhead reads it).
std::string CaptureSummary(const gc::Recorder::Stats& s) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "capture(rank 0): %llu frames, %.1f MB raw, %.1f MB file; training thread %.3f s in capture "
                "(%.3f s waiting for the writer); writer threads CPU %.3f s encode, %.3f s write",
                static_cast<unsigned long long>(s.frames), s.raw_bytes / 1e6, s.file_bytes / 1e6, s.record_seconds,
                s.producer_wait_seconds, s.encode_cpu_seconds, s.write_cpu_seconds);
  return line;
}

// Identical on every rank: rank 0 draws it from the configuration and the
// clock and publishes it through the store.
std::string RunId(c10d::Store& store, int rank, const gc::TrainOptions& o) {
  const std::string key = "gradtrace/run_id";
  if (rank == 0) {
    std::ostringstream cfg;
    cfg << o.seed << '/' << o.dp << '/' << o.sp << '/' << o.zero_stage << '/' << o.scaling << '/' << o.loss << '/'
        << std::chrono::system_clock::now().time_since_epoch().count() << '/' << getpid();
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(gc::SeedFor(o.seed, cfg.str())));
    store.set(key, std::vector<uint8_t>(hex, hex + 16));
    return hex;
  }
  auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

// The parameter table: one ParamInfo per model parameter, in the model's order.
void AddParams(const gc::TrainOptions& o, const gc::Groups& groups, const gc::TransformerLM& model, pb::RunInfo* run) {
  for (size_t i = 0; i < model.params().size(); ++i) {
    const auto& p = model.params()[i];
    auto* info = run->add_params();
    info->set_id(static_cast<int32_t>(i));
    info->set_name(p.name);
    for (int64_t d : p.tensor.sizes()) info->add_shape(d);
    info->set_dtype(ProtoDTypeOf(o.dtype));
    info->set_numel(p.tensor.numel());
    info->set_kind(p.expert ? pb::EXPERT : pb::DENSE);
    info->set_grad_group(gc::GradGroup(groups, o.zero_stage, p.expert).name);
    // Gradients are computed and reduced in the parameters' dtype; the initial values tell another seed apart.
    info->set_grad_dtype(info->dtype());
    const at::Tensor flat = p.tensor.detach().reshape(-1).to(at::kCPU, at::kDouble);
    for (int64_t pos : gradtrace::InitSketchPositions(flat.numel())) info->add_init_sketch(flat[pos].item<double>());
  }
}

// This rank's RunInfo: producer, configuration, groups and parameter table, written at the head of its trace.
pb::RunInfo MakeRunInfo(const gc::TrainOptions& o, const gc::DistEnv& env, const gc::Topology& topo,
                        const gc::Groups& groups, const gc::TransformerLM& model, const std::string& run_id) {
  pb::RunInfo run;
  run.set_producer("gradtrace-train");
  run.set_producer_version(GRADTRACE_VERSION);
  run.set_framework("gradtrace-train");
  run.set_framework_version(GRADTRACE_VERSION);
  (*run.mutable_versions())["torch"] = TORCH_VERSION;
  (*run.mutable_versions())["gradtrace"] = GRADTRACE_VERSION;
  run.set_run_id(run_id);
  FillConfig(o, run.mutable_config());
  run.set_rank(env.rank);
  run.set_dp_rank(topo.dp_rank());
  run.set_sp_rank(topo.sp_rank());
  run.set_host(Hostname());
  AddGroup(groups.world, &run);
  AddGroup(groups.sdp, &run);
  AddGroup(groups.sp, &run);
  AddGroup(groups.dp, &run);
  if (o.moe_experts > 0) AddGroup(groups.edp, &run);
  AddParams(o, groups, model, &run);
  run.set_created_unix_ns(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  auto policy = gradtrace::semantics::ResolvePolicy(o.scaling);
  (*run.mutable_extra())["scaling_engine_cite"] = policy->engine_cite;
  (*run.mutable_extra())["scaling_zero_cite"] = policy->zero_cite;
  (*run.mutable_extra())["launcher"] = env.source;
  (*run.mutable_extra())["reference"] =
      "FINAL equals the mean over DP replicas of each replica's full-sequence token-mean gradient when the "
      "recipe and policy are consistent";
  return run;
}

// Progress lines from rank 0, and the test-only fault injection.
gc::TrainHooks MakeHooks(int rank) {
  gc::TrainHooks hooks;
  if (rank == 0) hooks.progress = [](const std::string& line) { std::cerr << "gradtrace-train: " << line << "\n"; };
  // Test-only fault injection: GRADTRACE_TEST_KILL=RANK:STEP makes that rank
  // die by SIGKILL before that step, as an OOM-killed rank would.
  if (const char* kill_spec = std::getenv("GRADTRACE_TEST_KILL")) {
    int kill_rank = -1;
    long long kill_step = -1;
    if (std::sscanf(kill_spec, "%d:%lld", &kill_rank, &kill_step) == 2 && kill_rank == rank) {
      hooks.before_step = [kill_step](int64_t step) {
        if (step == kill_step) raise(SIGKILL);
      };
    }
  }
  return hooks;
}

// Rank 0's last lines: the final loss, and what was written where (or why nothing was).
void PrintSummary(const gc::TrainOptions& o, int world, const std::string& run_id, const gc::TrainResult& result,
                  const gc::Recorder* recorder) {
  char loss[64];
  std::snprintf(loss, sizeof(loss), "%.17g", result.losses.empty() ? 0.0 : result.losses.back());
  if (!gc::CaptureOff(o) && (!recorder || !recorder->enabled())) {
    std::cerr << "gradtrace-train: final loss(rank 0) " << loss << "; rank 0's capture was disabled after a write "
              << "error (its warning above says what " << o.out << " holds; run " << run_id << ")\n";
  } else if (recorder) {
    std::cerr << "gradtrace-train: " << CaptureSummary(recorder->stats()) << "\n";
    std::cerr << "gradtrace-train: final loss(rank 0) " << loss << "; wrote " << world << " trace file(s) to " << o.out
              << " (run " << run_id << ")\n";
  } else {
    std::cerr << "gradtrace-train: final loss(rank 0) " << loss << "; "
              << (o.guard ? "--capture guard: no trace written (the guard's log is in " + o.out + ")"
                          : std::string("--capture off: no trace written"))
              << "\n";
  }
}

int Run(const gc::TrainOptions& o, const gc::DistEnv& env) {
  gc::Topology topo{o.dp, o.sp, env.rank};
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  // Ranks share the machine's cores; one intra-op thread each keeps gloo runs fair.
  if (env.world > 1) at::set_num_threads(1);

  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = env.world;
  so.timeout = timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  gc::Groups groups = gc::CreateGroups(store, topo, o.backend, timeout, env.local_rank);
  const std::string run_id = RunId(*store, env.rank, o);

  gc::TransformerLM model(gc::ModelConfigFrom(o), groups.device);
  if (!o.export_init.empty() && env.rank == 0) {
    if (auto st = gc::ExportInit(o); !st.ok()) {
      std::cerr << "gradtrace-train: " << st.message() << "\n";
      return 1;
    }
  }
  const pb::RunInfo run = MakeRunInfo(o, env, topo, groups, model, run_id);

  std::unique_ptr<gc::Recorder> recorder;
  if (!gc::CaptureOff(o)) {
    if (int rc = OpenRecorder(o, env.rank, run, &recorder); rc != 0) return rc;
  }
  std::unique_ptr<gc::RecorderSink> sink;
  if (recorder) sink = std::make_unique<gc::RecorderSink>(recorder.get());

  std::unique_ptr<gc::GuardSink> guard;
  if (o.guard) {
    gc::NamedGroup exchange;
    const auto guard_timeout = std::chrono::milliseconds(static_cast<int64_t>(o.guard_timeout_s * 1000));
    if (env.world > 1) exchange = gc::CreateGlooGroup(store, "guard", groups.world.ranks, env.rank, guard_timeout);
    gc::GuardOptions go;
    go.out_dir = o.out;
    go.on_violation = o.guard_on_violation;
    go.every = o.guard_every;
    go.timeout_s = o.guard_timeout_s;
    go.reference = o.guard_reference;
    auto opened = gc::GuardSink::Open(go, run, env.rank, env.world, std::move(exchange), sink.get());
    if (!opened.ok()) {  // a reference that cannot be read is bad input
      std::cerr << "gradtrace-train: rank " << env.rank << ": " << opened.status().message() << "\n";
      return opened.status().code() == gradtrace::Status::Code::kInvalidArgument ? 2 : 1;
    }
    guard = std::move(opened).value();
  }

  gc::TrainResult result;
  gradtrace::Status st = gc::RunTraining(o, groups, guard ? static_cast<gc::GradSink*>(guard.get()) : sink.get(),
                                         MakeHooks(env.rank), &result, &model);
  if (guard) guard->Close();
  if (!st.ok()) {
    std::cerr << "gradtrace-train: rank " << env.rank << ": " << st.message() << "\n";
    return 1;
  }
  if (recorder) {
    st = recorder->Close();
    if (!st.ok()) {
      std::cerr << "gradtrace-train: rank " << env.rank << ": closing trace: " << st.message() << "\n";
      if (o.on_capture_error == "abort") return 1;
    }
  }
  // Nobody leaves before every trace is closed (so rank 0's summary is true).
  if (groups.world.ranks.size() > 1) groups.world.pg->barrier()->wait();
  if (env.rank == 0) PrintSummary(o, env.world, run_id, result, recorder.get());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (RLIMIT_FSIZE) makes a trace write fail with EFBIG, a write error like a full disk,
  // instead of killing the rank with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  auto parsed = gc::ParseTrainOptions(argc, argv);
  if (!parsed.ok()) {
    if (parsed.status().message().empty()) return 0;  // --help
    return UsageError(parsed.status().message());
  }
  const gc::TrainOptions& o = parsed.value();
  if (!o.export_init.empty() && o.out.empty()) {  // export only: one process, no training
    try {
      auto st = gc::ExportInit(o);
      if (!st.ok()) {
        std::cerr << "gradtrace-train: " << st.message() << "\n";
        return 1;
      }
    } catch (const std::exception& e) {
      std::cerr << "gradtrace-train: " << FirstLine(e.what()) << "\n";
      return 1;
    }
    std::cerr << "gradtrace-train: wrote " << o.export_init << "\n";
    return 0;
  }
  if (o.nproc > 0 && std::getenv("GRADTRACE_TRAIN_CHILD") == nullptr) {
    setenv("GRADTRACE_TRAIN_CHILD", "1", 1);
    return gc::LaunchLocal(o.nproc, SelfExe(argv[0]), gc::ArgsWithoutNproc(argc, argv));
  }
  auto env = gc::DistEnvFromEnvironment();
  if (!env.ok()) return UsageError(env.status().message());
  if (env->world != o.dp * o.sp) {
    return UsageError("the " + env->source + " world has " + std::to_string(env->world) + " rank(s) but --dp " +
                      std::to_string(o.dp) + " x --sp " + std::to_string(o.sp) + " = " + std::to_string(o.dp * o.sp) +
                      (env->source == "standalone" ? " (use --nproc N, torchrun or srun)" : ""));
  }
  try {
    return Run(o, env.value());
  } catch (const std::exception& e) {
    const auto* ce = dynamic_cast<const c10::Error*>(&e);
    std::cerr << "gradtrace-train: rank " << env->rank << ": "
              << FirstLine(ce ? ce->what_without_backtrace() : e.what()) << "\n";
    return 1;
  }
}
