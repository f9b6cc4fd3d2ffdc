// The gradtrace-train binary end to end: --nproc launches real ranks, trace
// sets are read back with the codec's TraceReader, exit codes follow the
// command-line contract.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "rank_file.h"
#include "slice_codec.h"
#include "trace_reader.h"

namespace gradtrace {
namespace {

namespace fs = std::filesystem;

struct RunOutput {
  int exit_code = -1;  // 128+signal when killed
  std::string err;
  double seconds = 0;
};

// Runs gradtrace-train with `args` (and extra environment), capturing stderr.
RunOutput Train(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  static int n = 0;
  const fs::path err_path =
      fs::temp_directory_path() / ("gt-e2e-" + std::to_string(getpid()) + "-" + std::to_string(n++) + ".err");
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::fopen(err_path.c_str(), "w");
    dup2(fileno(f), 2);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(GRADTRACE_TRAIN_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(GRADTRACE_TRAIN_BIN, argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  RunOutput out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  out.err = ss.str();
  fs::remove(err_path);
  return out;
}

fs::path FreshDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("gt-e2e-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(d);
  return d;
}

std::vector<std::string> Tiny(const fs::path& out) {
  return {"--vocab", "32",        "--hidden", "16",        "--heads",
          "4",       "--layers",  "2",        "--seq-len", "8",
          "--batch", "4",         "--dtype",  "fp64",      "--reduce-bucket-size",
          "1500",    "--timeout", "20",       "--out",     out.string()};
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Full values of one phase at one step, per parameter name, assembled from
// every rank's slices. Replicas (every rank holds FINAL) must agree exactly.
struct PhaseValues {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::vector<bool>> seen;
  pb::RunInfo run;
  std::vector<std::string> run_ids;
  std::string error;
};

PhaseValues ReadPhase(const fs::path& dir, int world, pb::Phase phase, int64_t step) {
  PhaseValues pv;
  for (int r = 0; r < world; ++r) {
    const fs::path path = dir / gradtrace::RankFileName(r);
    Status verified = VerifyFile(path.string());
    if (!verified.ok()) {
      pv.error += "verify " + path.string() + ": " + verified.message() + "; ";
      continue;
    }
    auto reader = TraceReader::Open(path.string());
    if (!reader.ok()) {
      pv.error += reader.status().message() + "; ";
      continue;
    }
    const pb::RunInfo& run = reader.value()->run_info();
    pv.run = run;
    pv.run_ids.push_back(run.run_id());
    if (run.rank() != r)
      pv.error += "rank field " + std::to_string(run.rank()) + " in " + path.filename().string() + "; ";
    Frame frame;
    while (reader.value()->Next(&frame)) {
      if (!frame.bucket || frame.bucket->phase() != phase || frame.bucket->step() != step) continue;
      for (const auto& slice : frame.bucket->slices()) {
        const auto& param = run.params(slice.param_id());
        auto& vals = pv.values[param.name()];
        auto& seen = pv.seen[param.name()];
        vals.resize(param.numel());
        seen.resize(param.numel());
        if (slice.has_sketch()) {
          for (int i = 0; i < slice.sketch().positions_size(); ++i) {
            vals[slice.sketch().positions(i)] = slice.sketch().values(i);
            seen[slice.sketch().positions(i)] = true;
          }
          continue;
        }
        auto decoded = DecodeFullValues(slice);
        if (!decoded.ok()) {
          pv.error += decoded.status().message() + "; ";
          continue;
        }
        for (size_t i = 0; i < decoded->size(); ++i) {
          const int64_t at = slice.offset() + static_cast<int64_t>(i);
          if (seen[at] && vals[at] != (*decoded)[i] && phase == pb::FINAL) {
            pv.error += "replicas of " + param.name() + " disagree; ";
          }
          vals[at] = (*decoded)[i];
          seen[at] = true;
        }
      }
    }
    if (!reader.value()->status().ok()) pv.error += reader.value()->status().message() + "; ";
  }
  return pv;
}

double Ratio(const std::vector<double>& a, const std::vector<double>& b) {  // <a,b>/<a,a>: b ~ s*a
  double ab = 0, aa = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
  }
  return aa == 0 ? 0 : ab / aa;
}

TEST(TrainBinary, BadArgumentsExit2WithOneLine) {
  const std::vector<std::vector<std::string>> bad = {
      {"--out", "/tmp/x", "--sp", "3"},
      {"--out", "/tmp/x", "--scaling", "nope"},
      {"--out", "/tmp/x", "--loss", "nope"},
      {"--out", "/tmp/x", "--dp", "0"},
      {"--out", "/tmp/x", "--backend", "nccl"},
      {"--out", "/tmp/x", "--bogus"},
      {"--steps", "1"},
      {"--out", "/tmp/x", "--dp", "2"},  // world 2 without --nproc or a launcher environment
  };
  for (const auto& args : bad) {
    RunOutput r = Train(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("gradtrace-train: error: ", 0), 0u) << joined << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << "\n" << r.err;
  }
}

// The DESIGN's command line (the "done" check) on a tiny model: a
// complete, verifiable trace set whose FINAL gradient is exactly sp = 2 times
// the one-rank run's, the #5248 effect.
TEST(TrainBinary, DoneCommandWritesVerifiableTraceSetShowingSpTimes) {
  const fs::path ref_dir = FreshDir("ref"), dir = FreshDir("dp2sp2");
  RunOutput ref = Train(Concat({"--scaling", "ds-4530", "--loss", "local-mean", "--steps", "2"}, Tiny(ref_dir)));
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  RunOutput run = Train(Concat({"--nproc", "4", "--dp", "2", "--sp", "2", "--zero-stage", "2", "--scaling", "ds-4530",
                                "--loss", "local-mean", "--steps", "2"},
                               Tiny(dir)));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("[rank 0] gradtrace-train: step 2/2"), std::string::npos) << run.err;

  PhaseValues a = ReadPhase(ref_dir, 1, pb::FINAL, 0), b = ReadPhase(dir, 4, pb::FINAL, 0);
  ASSERT_EQ(a.error, "");
  ASSERT_EQ(b.error, "");
  for (const auto& id : b.run_ids) EXPECT_EQ(id, b.run_ids[0]);
  EXPECT_EQ(b.run.config().world(), 4);
  EXPECT_EQ(b.run.producer(), "gradtrace-train");
  ASSERT_EQ(a.values.size(), b.values.size());
  for (const auto& [name, va] : a.values) {
    const auto& vb = b.values.at(name);
    EXPECT_NEAR(Ratio(va, vb), 2.0, 1e-9) << name;  // fp64; summation order only
  }
  // POST_REDUCE partitions of step 1 exist for every rank with their layout.
  PhaseValues post = ReadPhase(dir, 4, pb::POST_REDUCE, 1);
  EXPECT_EQ(post.error, "");
  EXPECT_EQ(post.values.size(), a.values.size());
  fs::remove_all(ref_dir);
  fs::remove_all(dir);
}

// Format 1.6: with --capture-references on (the default) a POST_REDUCE or FINAL record whose values are byte for byte
// the bucket's values last written in full is a reference to those frames. Read back, every record of every rank is
// the one --capture-references off writes, byte for byte. On one rank every POST and FINAL is a reference (nothing
// to reduce); on two (data parallel) every FINAL is (POST's values) and no POST is (each rank's own PRE differs
// from the average).
TEST(TrainBinary, ReferencesReadBackAsTheRecordsWrittenInFull) {
  for (const std::string nproc : {"1", "2"}) {
    SCOPED_TRACE("nproc " + nproc);
    const fs::path on = FreshDir("refs-on-" + nproc), off = FreshDir("refs-off-" + nproc);
    for (const auto& [dir, refs] : {std::pair{on, "on"}, std::pair{off, "off"}}) {
      RunOutput run =
          Train(Concat({"--nproc", nproc, "--dp", nproc, "--steps", "2", "--capture-references", refs}, Tiny(dir)));
      ASSERT_EQ(run.exit_code, 0) << run.err;
    }
    for (int r = 0; r < std::stoi(nproc); ++r) {
      const std::string name = RankFileName(r);
      ASSERT_TRUE(VerifyFile((on / name).string()).ok());
      auto a = TraceReader::Open((on / name).string()), b = TraceReader::Open((off / name).string());
      ASSERT_TRUE(a.ok() && b.ok());
      Frame fa, fb;
      std::map<pb::Phase, int> records, references;
      while ((*a)->Next(&fa)) {
        ASSERT_TRUE((*b)->Next(&fb));
        ASSERT_EQ(fa.bucket != nullptr, fb.bucket != nullptr);
        if (!fa.bucket) continue;
        ++records[fa.bucket->phase()];
        if (fa.bucket->values_from() != 0) ++references[fa.bucket->phase()];
        EXPECT_EQ(fb.bucket->values_from(), 0u);
        fa.bucket->clear_values_from();
        EXPECT_EQ(fa.bucket->SerializeAsString(), fb.bucket->SerializeAsString()) << "offset " << fa.offset;
      }
      EXPECT_TRUE((*a)->status().ok()) << (*a)->status().message();
      EXPECT_FALSE((*b)->Next(&fb));
      ASSERT_GT(records[pb::PRE_REDUCE], 0);
      EXPECT_EQ(references[pb::PRE_REDUCE], 0);
      EXPECT_EQ(references[pb::POST_REDUCE], nproc == "1" ? records[pb::POST_REDUCE] : 0);
      EXPECT_EQ(references[pb::FINAL], records[pb::FINAL]);
      EXPECT_LT(fs::file_size(on / name), fs::file_size(off / name));
    }
    fs::remove_all(on);
    fs::remove_all(off);
  }
}

TEST(TrainBinary, SketchValuesEqualFullValuesAtTheSamePositions) {
  const fs::path full_dir = FreshDir("full"), sketch_dir = FreshDir("sketch");
  const std::vector<std::string> common = {"--nproc", "2",         "--sp",    "2",      "--zero-stage",
                                           "1",       "--scaling", "ds-4530", "--loss", "token-weighted"};
  ASSERT_EQ(Train(Concat(common, Tiny(full_dir))).exit_code, 0);
  RunOutput s = Train(Concat(Concat(common, Tiny(sketch_dir)), {"--capture", "sketch:7"}));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  for (pb::Phase phase : {pb::PRE_REDUCE, pb::FINAL}) {
    PhaseValues f = ReadPhase(full_dir, 2, phase, 0), k = ReadPhase(sketch_dir, 2, phase, 0);
    ASSERT_EQ(f.error, "");
    ASSERT_EQ(k.error, "");
    for (const auto& [name, seen] : k.seen) {
      const auto pos = SketchPositions(name, static_cast<int64_t>(seen.size()), 7);
      for (int64_t p : pos) {
        EXPECT_TRUE(seen[p]) << name << " position " << p;
        // Exact: same run, same bits, widened exactly to double.
        if (phase == pb::FINAL) {
          EXPECT_EQ(k.values.at(name)[p], f.values.at(name)[p]) << name << "[" << p << "]";
        }
      }
    }
  }
  fs::remove_all(full_dir);
  fs::remove_all(sketch_dir);
}

// Rank 0's per-step progress without the timings, and its final-loss line:
// what must not change when capture is switched off.
std::vector<std::string> LossLines(const std::string& err) {
  std::vector<std::string> out;
  std::stringstream ss(err);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.find("loss(rank 0)") == std::string::npos) continue;
    if (line.find("final loss") != std::string::npos) {
      out.push_back(line.substr(0, line.find(';')));  // "... final loss(rank 0) <%.17g>"
    } else {
      out.push_back(line.substr(0, line.find("buckets")));  // drop the step time
    }
  }
  return out;
}

TEST(TrainBinary, CaptureOffTrainsIdenticallyAndWritesNoTrace) {
  const fs::path full_dir = FreshDir("cap-full"), off_dir = FreshDir("cap-off");
  const std::vector<std::string> common = {"--nproc", "2", "--sp", "2", "--zero-stage", "2", "--steps", "3"};
  RunOutput full = Train(Concat(common, Tiny(full_dir)));
  ASSERT_EQ(full.exit_code, 0) << full.err;
  RunOutput off = Train(Concat(Concat(common, Tiny(off_dir)), {"--capture", "off"}));
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_FALSE(fs::exists(off_dir)) << "--capture off must not create --out";
  EXPECT_NE(off.err.find("--capture off: no trace written"), std::string::npos) << off.err;
  const std::vector<std::string> a = LossLines(full.err), b = LossLines(off.err);
  ASSERT_EQ(a.size(), 4u) << full.err;  // three steps and the final loss at full precision
  EXPECT_EQ(a, b) << full.err << "\n---\n" << off.err;
  // Without --out at all.
  RunOutput bare =
      Train({"--vocab", "32", "--hidden", "16", "--heads", "4", "--layers", "1", "--seq-len", "8", "--capture", "off"});
  EXPECT_EQ(bare.exit_code, 0) << bare.err;
  fs::remove_all(full_dir);
}

TEST(TrainBinary, KilledRankMakesNprocExitNonZeroWithinTheTimeout) {
  const fs::path dir = FreshDir("killed");
  RunOutput r = Train(Concat({"--nproc", "2", "--dp", "2", "--steps", "3"}, Tiny(dir)), {"GRADTRACE_TEST_KILL=1:1"});
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.seconds, 20.0) << r.err;  // --timeout 20: the launcher must not wait for it
  EXPECT_NE(r.err.find("rank 1 was killed by signal"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gradtrace
