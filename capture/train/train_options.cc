#include "train_options.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <regex>
#include <sstream>

#include "dtype.h"
#include "loss_recipes.h"
#include "name_pattern.h"
#include "scaling_policy.h"
#include "slice_codec.h"

namespace gradtrace::capture {

using semantics::ResolvePolicy;

namespace {

std::vector<std::string> DTypeNames() {
  std::vector<std::string> out;
  for (const DTypeInfo& row : DTypes()) out.push_back(row.name);
  return out;
}

// How many ranks, and how they talk.
void AddLaunchOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--nproc", o.nproc, "start N local ranks of this binary (0: join from environment)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--dp", o.dp, "data-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--sp", o.sp, "sequence-parallel (Ulysses) degree")->check(CLI::PositiveNumber);
  app.add_option("--backend", o.backend, "collective backend")->check(CLI::IsMember({"gloo", "nccl"}));
  app.add_option("--timeout", o.timeout_s, "collective and rendezvous timeout in seconds")->check(CLI::PositiveNumber);
}

// How gradients are bucketed, reduced and scaled (the DeepSpeed settings).
void AddReductionOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--zero-stage", o.zero_stage, "ZeRO stage")->check(CLI::IsMember({0, 1, 2, 3}));
  app.add_option("--scaling", o.scaling, "scaling policy: mean, sum, ds-4530, ds-pre-4957, deepspeed@VERSION");
  app.add_option("--reduce-bucket-size", o.reduce_bucket_size, "bucket size in elements")->check(CLI::PositiveNumber);
  app.add_option("--zero-reduce-scatter", o.zero_reduce_scatter,
                 "ZeRO-1/2: reduce each bucket to its partition owners (true) or all-reduce it (false); ZeRO-3: "
                 "false all-reduces the buckets of at most --reduce-bucket-size elements");
  app.add_option("--gradient-predivide-factor", o.gradient_predivide_factor, "DeepSpeed gradient_predivide_factor")
      ->check(CLI::PositiveNumber);
  app.add_flag("--prescale-gradients", o.prescale_gradients, "DeepSpeed prescale_gradients");
}

// The loss and the optimizer loop.
void AddTrainingOptions(CLI::App& app, TrainOptions& o) {
  // The recipes capture/train/loss.cc implements, by name or by an alias (semantics/loss_recipes.h), held as the name.
  app.add_option("--loss", o.loss, "loss recipe")
      ->transform(CLI::IsMember(std::vector<std::string>{"local-mean", "local-mean-div-sp", "token-weighted",
                                                         "global-token-weighted", "full-sequence"},
                                [](std::string s) { return semantics::ResolveLossRecipe(s).value_or(s); }));
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--gas", o.gas, "gradient accumulation steps (loss scaled by 1/gas)")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", o.optimizer, "optimizer")->check(CLI::IsMember({"sgd", "adam"}));
  app.add_option("--lr", o.lr, "learning rate")->check(CLI::NonNegativeNumber);
}

// The model and its data.
void AddModelOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--seed", o.seed, "seed of weights and data");
  app.add_option("--seq-len", o.seq_len, "global sequence length T")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "global batch rows per micro-step")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::NonNegativeNumber);
  app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--vocab", o.vocab, "vocabulary size")->check(CLI::PositiveNumber);
  app.add_option("--moe-experts", o.moe_experts, "experts per MoE MLP (0: dense)")->check(CLI::NonNegativeNumber);
  // proto/dtype.h's names in any spelling, held as the canonical name.
  app.add_option("--dtype", o.dtype, "parameter dtype: " + DTypeNamesInWords() + " (any case, or fp32, bfloat16, ...)")
      ->transform(CLI::IsMember(DTypeNames(), [](std::string s) {
        pb::DType d = pb::DTYPE_UNSPECIFIED;
        return ParseDType(s, &d) ? std::string(DTypeName(d)) : s;
      }));

  app.add_option("--ignore-frac", o.ignore_frac, "fraction of labels masked to -100")->check(CLI::Range(0.0, 0.99));
  app.add_option("--data", o.data_file, "file of whitespace-separated token ids")->check(CLI::ExistingFile);
}

// What is recorded, where, and what a write error does.
void AddCaptureOptions(CLI::App& app, TrainOptions& o) {
  app.add_option("--out", o.out, "trace directory (one rank-NNNNN.gtrace per rank)");
  app.add_option("--capture", o.capture,
                 "capture mode: full, sketch:K, stats, or off (train without recording: no trace, --out optional); "
                 "guard checks every step live and writes no trace (its log goes to --out), MODE+guard does both");
  app.add_option("--guard-on-violation", o.guard_on_violation,
                 "the guard's answer to a violation: warn (the default: a line on stderr, the run goes on) or raise "
                 "(stop at the violating step, exit 1)")
      ->check(CLI::IsMember({"warn", "raise"}));
  app.add_option("--guard-every", o.guard_every, "after the first 4 steps the guard checks every k-th step")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--guard-reference", o.guard_reference,
                 "a trusted run's trace (stats suffice): at each step it recorded, this run's FINAL is compared with "
                 "it as gradtrace-diff would");
  app.add_option("--guard-timeout", o.guard_timeout_s, "seconds the guard's exchange waits for a rank")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--capture-steps", o.capture_steps, "steps to capture, e.g. 0,2-4 (default: all)");
  app.add_option("--capture-params", o.capture_params, "regex (RE2) on parameter names to capture (default: all)");
  app.add_option("--on-capture-error", o.on_capture_error,
                 "on a write error (disk full, EFBIG, permission, I/O): disable (the default: warn once, keep the "
                 "trace written so far, train on without capture) or abort (exit 1)")
      ->check(CLI::IsMember({"abort", "disable"}));
  app.add_flag("--overwrite", o.overwrite,
               "replace the rank-NNNNN.gtrace files a finished run left in --out (a run still writing is refused)");
  app.add_option("--zstd-level", o.zstd_level, "zstd level of trace frames")->check(CLI::Range(1, 19));
  app.add_option("--capture-references", o.capture_references,
                 "full mode: on (the default) writes a POST_REDUCE or FINAL record whose values are byte for byte "
                 "an earlier phase's of the same bucket as a reference to those frames (format 1.6); off writes "
                 "them again, for readers older than 1.6")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--capture-direct-io", o.capture_direct_io,
                 "on (the default) writes the 4 KiB blocks inside large trace frames with O_DIRECT where the file "
                 "system takes it, past the page cache; off writes everything through it. The file is the same")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--writer-threads", o.writer_threads, "recorder threads that encode, compress and write")
      ->check(CLI::Range(1, 64));
  app.add_option("--capture-queue-mb", o.capture_queue_mb,
                 "MB of gradient copies that may wait for the writer before training blocks")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--final", o.final_mode, "FINAL phase: full gradient (gather) or owned partition slices")
      ->check(CLI::IsMember({"gather", "partition"}));
  app.add_option("--export-init", o.export_init,
                 "write the initial parameters and the global batches to FILE (torch.load-able); without --out, "
                 "write it and exit");
}

// In --help order.
void AddOptions(CLI::App& app, TrainOptions& o) {
  AddLaunchOptions(app, o);
  AddReductionOptions(app, o);
  AddTrainingOptions(app, o);
  AddModelOptions(app, o);
  AddCaptureOptions(app, o);
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

Expected<TrainOptions> ParseTrainOptions(int argc, const char* const* argv) {
  TrainOptions o;
  CLI::App app{"gradtrace-train: instrumented data x sequence parallel training that records gradients"};
  app.name("gradtrace-train");
  AddOptions(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return Status::InvalidArgument("");
  } catch (const CLI::ParseError& e) {
    return Status::InvalidArgument(OneLine(e.what()));
  }
  if (const std::string suffix = "+guard"; o.capture == "guard") {
    o.guard = true;
    o.capture = "off";
  } else if (o.capture.size() > suffix.size() &&
             o.capture.compare(o.capture.size() - suffix.size(), suffix.size(), suffix) == 0) {
    o.guard = true;
    o.capture.resize(o.capture.size() - suffix.size());
  }
  GT_RETURN_IF_ERROR(ValidateTrainOptions(o));
  return o;
}

Status ValidateTrainOptions(const TrainOptions& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  const int world = o.dp * o.sp;
  if (o.nproc > 0 && o.nproc != world) {
    return bad("--nproc " + std::to_string(o.nproc) + " must equal dp x sp = " + std::to_string(world));
  }
  if (pb::DType d = pb::DTYPE_UNSPECIFIED; !ParseDType(o.dtype, &d)) {
    return bad("--dtype " + o.dtype + ": expected " + DTypeNamesInWords() + " (or an alias such as fp32, bfloat16)");
  }
  if (o.heads % o.sp != 0) {
    return bad("--heads " + std::to_string(o.heads) + " is not divisible by --sp " + std::to_string(o.sp) +
               " (Ulysses shards heads over the SP group)");
  }
  if (o.seq_len % o.sp != 0) {
    return bad("--seq-len " + std::to_string(o.seq_len) + " is not divisible by --sp " + std::to_string(o.sp) +
               " (each SP rank holds T/sp tokens)");
  }
  if (o.batch % o.dp != 0) {
    return bad("--batch " + std::to_string(o.batch) + " is not divisible by --dp " + std::to_string(o.dp));
  }
  if (o.hidden % o.heads != 0) {
    return bad("--hidden " + std::to_string(o.hidden) + " is not divisible by --heads " + std::to_string(o.heads));
  }
  if (o.backend == "nccl") {
#ifndef USE_C10D_NCCL
    return bad("--backend nccl: this build has no NCCL support (configure with -DGRADTRACE_CUDA=ON on a CUDA machine)");
#endif
  }
  auto policy = ResolvePolicy(o.scaling);
  if (!policy.ok()) return policy.status();
  if (o.zero_stage == 0 && o.sp > 1 && !policy->engine_unmodelled.empty()) {
    return bad("--scaling " + o.scaling +
               " with --zero-stage 0 and --sp > 1 is not modelled: " + policy->engine_unmodelled);
  }
  if (o.zero_stage == 3 && !policy->zero3_unmodelled.empty()) {
    return bad("--scaling " + o.scaling + " with --zero-stage 3 is not modelled: " + policy->zero3_unmodelled);
  }
  if (o.zero_stage == 3 && (o.gradient_predivide_factor != 1.0 || o.prescale_gradients)) {
    // stage3.py:394-396 refuses both with reduce_scatter; not modelled on the all-reduce path either.
    return bad("--zero-stage 3 with --gradient-predivide-factor or --prescale-gradients is not modelled");
  }
  if (!CaptureOff(o)) {
    if (auto m = ParseCaptureMode(o.capture); !m.ok()) {
      return bad("--capture: " + m.status().message() + "; or off to train without capture");
    }
  }
  if (auto s = ParseStepList(o.capture_steps); !s.ok()) return s.status();
  if (!o.capture_params.empty()) {
    if (auto re = NamePattern::Compile(o.capture_params); !re.ok()) {
      return bad("--capture-params: invalid regex '" + o.capture_params + "': " + re.status().message());
    }
  }
  if (o.out.empty() && o.export_init.empty() && (!CaptureOff(o) || o.guard)) return bad("--out DIR is required");
  if (!o.guard_reference.empty() && !o.guard)
    return bad("--guard-reference needs the guard: --capture guard or MODE+guard");
  return Status::Ok();
}

bool CaptureOff(const TrainOptions& options) { return options.capture == "off"; }

std::vector<std::string> ArgsWithoutNproc(int argc, const char* const* argv) {
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--nproc") {
      ++i;  // skip its value
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    out.push_back(std::move(a));
  }
  return out;
}

Expected<std::vector<int64_t>> ParseStepList(const std::string& text) {
  std::vector<int64_t> steps;
  if (text.empty()) return steps;
  std::stringstream ss(text);
  std::string item;
  const std::regex one(R"(\s*(\d+)\s*)"), range(R"(\s*(\d+)\s*-\s*(\d+)\s*)");
  while (std::getline(ss, item, ',')) {
    std::smatch m;
    if (std::regex_match(item, m, one)) {
      steps.push_back(std::stoll(m[1]));
    } else if (std::regex_match(item, m, range) && std::stoll(m[1]) <= std::stoll(m[2]) &&
               std::stoll(m[2]) - std::stoll(m[1]) < 1000000) {
      for (int64_t s = std::stoll(m[1]); s <= std::stoll(m[2]); ++s) steps.push_back(s);
    } else {
      return Status::InvalidArgument("--capture-steps: cannot parse '" + item + "' (expected e.g. 0,2,4-6)");
    }
  }
  return steps;
}

}  // namespace gradtrace::capture
