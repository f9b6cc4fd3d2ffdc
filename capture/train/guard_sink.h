// gradtrace-train's live guard (--capture guard, docs/user/guard.md): each checked step is recorded in sketch
// mode into a private file, the ranks' files are gathered on a gloo group of the guard's own, and every rank
// runs gradtrace-diff --self on the step (diff/evidence/self_check.h): the same measuring, judging and words as
// --self, read as violations by the one reading the Python guard uses too (diff/report/violations.h). Every rank
// judges the whole step, so every rank stops at the same step under "raise"; rank 0 says the lines on stderr,
// every rank appends them to DIR/rank-NNNNN.guard.jsonl.
//
// train/ is a command: like pack/ it sits above diff/ (recorder/ never includes diff/; tests/python/test_rooms.py).
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "explain/reference_judge.h"
#include "grad_sink.h"
#include "load/trace_set.h"
#include "process_groups.h"
#include "recorder.h"
#include "report/violations.h"

namespace gradtrace::capture {

struct GuardOptions {
  std::string out_dir;                // where rank-NNNNN.guard.jsonl goes (--out)
  std::string on_violation = "warn";  // warn | raise (RunTraining fails at the violating step: exit 1)
  int every = 1;                      // after the first kAlwaysChecked steps, every `every`-th step
  double timeout_s = 60;              // the exchange's gloo timeout (the group's)
  int sketch_k = 16;                  // positions per parameter, as the Python guard's SKETCH_K
  std::string reference;              // a trusted run's trace: FINAL compared at each of its steps ("" none)
};

class GuardSink : public GradSink {
 public:
  static constexpr int64_t kAlwaysChecked = 4;  // the first steps are checked whatever `every` says

  // `exchange`: a gloo group of every rank, the guard's own (CreateGlooGroup); `inner` (may be null) gets every
  // call as well: a trace written beside the guard (--capture stats+guard). Writes the attach event. A reference
  // that cannot be read is InvalidArgument naming it.
  static Expected<std::unique_ptr<GuardSink>> Open(const GuardOptions& options, const pb::RunInfo& run, int rank,
                                                   int world, NamedGroup exchange, GradSink* inner);
  ~GuardSink() override;

  bool WantsStep(int64_t step) const override;
  Status OnStep(const pb::StepInfo& step) override;
  Status OnBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices) override;

  // The summary event, and on rank 0 the summary line; removes the private files. Idempotent.
  void Close();
  int violations() const { return violations_; }

 private:
  GuardSink() = default;
  bool Checking(int64_t step) const;
  Status BeginStep(int64_t step);
  Status EndStep(int64_t step);
  // What an error of the guard's own does: returned to the training under "raise" (or a violation), else the
  // guard is disabled with one warning and Ok returned.
  Status Contained(const Status& st);
  bool Comparing(int64_t step) const;
  Expected<std::vector<diff::Violation>> GatherAndJudge(int64_t step, const std::string& mine);
  Expected<std::vector<diff::Violation>> AgainstReference(int64_t step, const std::vector<std::string>& finals,
                                                          const diff::Report& self, const diff::TraceSet& steps);
  Status Said(int64_t step, const std::vector<diff::Violation>& found);
  void Scope(const std::string& check, const std::string& why);
  void Disable(const std::string& why);
  void Log(const std::string& event, nlohmann::ordered_json fields);

  GuardOptions options_;
  pb::RunInfo run_;
  int rank_ = 0, world_ = 1;
  NamedGroup exchange_;
  GradSink* inner_ = nullptr;
  std::string tmp_dir_;  // this rank's private files: the step's sketch trace, the gathered set
  std::string log_path_;
  std::ofstream log_;
  std::unique_ptr<Recorder> step_recorder_;
  std::unique_ptr<Recorder> final_recorder_;  // FINAL in stats mode, for the reference's moments
  int64_t open_step_ = -1;
  std::optional<diff::ReferenceRun> reference_;
  std::optional<int64_t> left_reference_;  // the step this run first differed from the reference at
  std::optional<std::string> disabled_;
  std::set<std::pair<std::string, std::string>> said_;  // (check, message) said on stderr
  std::set<std::string> scoped_;
  int64_t steps_checked_ = 0, bytes_sent_ = 0;
  int violations_ = 0;
  std::map<std::string, int> by_check_;
  nlohmann::ordered_json first_;
  bool closed_ = false;
};

}  // namespace gradtrace::capture
