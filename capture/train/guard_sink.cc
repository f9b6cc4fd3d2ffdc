#include "guard_sink.h"

#include <ATen/ATen.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <iterator>

#include "evidence/self_check.h"
#include "load/trace_set.h"
#include "rank_file.h"
#include "slice_codec.h"
#include "text_escape.h"

namespace gradtrace::capture {

namespace fs = std::filesystem;

namespace {

Expected<std::string> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::IoError(path + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Every rank's `mine` on every rank: the sizes, then the bytes padded to the largest. Throws c10::Error when a
// rank fails or does not send within the group's timeout.
std::vector<std::string> AllGatherBytes(const NamedGroup& g, const std::string& mine) {
  const size_t world = g.ranks.size();
  std::vector<at::Tensor> size_in{at::full({1}, static_cast<int64_t>(mine.size()), at::kLong)};
  std::vector<std::vector<at::Tensor>> size_out(1);
  for (size_t r = 0; r < world; ++r) size_out[0].push_back(at::empty({1}, at::kLong));
  g.pg->allgather(size_out, size_in)->wait();
  int64_t longest = 0;
  for (const at::Tensor& t : size_out[0]) longest = std::max(longest, t.item<int64_t>());
  at::Tensor padded = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(padded.data_ptr(), mine.data(), mine.size());
  std::vector<at::Tensor> in{padded};
  std::vector<std::vector<at::Tensor>> out(1);
  for (size_t r = 0; r < world; ++r) out[0].push_back(at::empty_like(padded));
  g.pg->allgather(out, in)->wait();
  std::vector<std::string> all;
  for (size_t r = 0; r < world; ++r) {
    all.emplace_back(static_cast<const char*>(out[0][r].data_ptr()), size_out[0][r].item<int64_t>());
  }
  return all;
}

// One rank's payload: the step's sketch trace, then its FINAL stats trace (empty without a reference), with the
// first's length ahead (8 bytes, little-endian).
std::string Pack(const std::string& sketch, const std::string& finals) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((static_cast<uint64_t>(sketch.size()) >> (8 * i)) & 0xff);
  return out + sketch + finals;
}

std::optional<std::pair<std::string, std::string>> Unpack(const std::string& blob) {
  if (blob.size() < 8) return std::nullopt;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(blob[i])) << (8 * i);
  if (n > blob.size() - 8) return std::nullopt;
  return std::make_pair(blob.substr(8, n), blob.substr(8 + n));
}

// The ranks' traces (`traces[r]` rank r's) written one after the other into `path` and loaded as a set of windows.
Expected<diff::TraceSet> LoadGathered(const std::string& path, const std::string& name,
                                      const std::vector<std::string>& traces) {
  std::vector<TraceSource> sources;
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    uint64_t at = 0;
    for (size_t r = 0; r < traces.size(); ++r) {
      f.write(traces[r].data(), static_cast<std::streamsize>(traces[r].size()));
      sources.push_back(TraceSource::Window(path, at, traces[r].size(), name + "/" + RankFileName(int(r))));
      at += traces[r].size();
    }
    if (!f.flush()) return Status::IoError(path + ": cannot write the gathered step");
  }
  diff::LoadOptions lo;
  lo.threads = 1;
  return diff::TraceSet::LoadSources(name, std::move(sources), lo);
}

nlohmann::ordered_json JsonOf(const diff::Violation& v, int64_t step) {
  return {{"step", step},
          {"check", v.check},
          {"cause", v.cause},
          {"message", v.message},
          {"params", v.params},
          {"buckets", v.buckets},
          {"divisor", v.divisor ? nlohmann::ordered_json(*v.divisor) : nullptr}};
}

}  // namespace

Expected<std::unique_ptr<GuardSink>> GuardSink::Open(const GuardOptions& options, const pb::RunInfo& run, int rank,
                                                     int world, NamedGroup exchange, GradSink* inner) {
  std::unique_ptr<GuardSink> g(new GuardSink());
  if (!options.reference.empty()) {
    auto ref = diff::ReferenceRun::Load(options.reference);
    if (!ref.ok()) return Status::InvalidArgument("--guard-reference: " + ref.status().message());
    g->reference_ = std::move(ref).value();
  }
  g->options_ = options;
  g->run_ = run;
  g->rank_ = rank;
  g->world_ = world;
  g->exchange_ = std::move(exchange);
  g->inner_ = inner;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gradtrace-guard-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return Status::IoError(pattern + ": cannot create the guard's directory");
  g->tmp_dir_ = pattern;
  fs::create_directories(fs::path(pattern) / "final");
  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  const std::string name = RankFileName(rank);
  g->log_path_ = (fs::path(options.out_dir) / (name.substr(0, name.size() - 7) + ".guard.jsonl")).string();
  g->log_.open(g->log_path_, std::ios::app);
  if (!g->log_) return Status::IoError(g->log_path_ + ": cannot open the guard's log");
  std::vector<std::string> checks = {"divisor", "replicas", "grad-norm", "non-finite", "skipped-step"};
  if (g->reference_) checks.push_back("reference");
  g->Log("attach", {{"world", world},
                    {"sketch_k", options.sketch_k},
                    {"every", options.every},
                    {"timeout_s", options.timeout_s},
                    {"on_violation", options.on_violation},
                    {"checks", checks},
                    {"reference_steps", g->reference_ ? g->reference_->steps() : std::vector<int64_t>{}}});
  if (options.every > 1) {
    g->Log("scope", {{"check", "sampling"},
                     {"message", "from step " + std::to_string(kAlwaysChecked) + " on, one step in " +
                                     std::to_string(options.every) + " is checked (those divisible by " +
                                     std::to_string(options.every) + ")"}});
  }
  if (world == 1) g->Scope("replicas", "one rank: no replica to compare");
  g->Scope("grad-norm", "gradtrace-train reports no grad norm (it does not clip)");
  return g;
}

GuardSink::~GuardSink() { Close(); }

bool GuardSink::Checking(int64_t step) const {
  return !disabled_ && (step < kAlwaysChecked || step % options_.every == 0);
}

bool GuardSink::Comparing(int64_t step) const {
  if (!reference_ || left_reference_) return false;
  const auto& steps = reference_->steps();
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

bool GuardSink::WantsStep(int64_t step) const {
  return Checking(step) || (inner_ != nullptr && inner_->WantsStep(step));
}

Status GuardSink::OnBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices) {
  if (inner_ != nullptr && inner_->WantsStep(meta.step)) GT_RETURN_IF_ERROR(inner_->OnBucket(meta, slices));
  if (!Checking(meta.step)) return Status::Ok();
  Status st = open_step_ == meta.step ? Status::Ok() : BeginStep(meta.step);
  if (st.ok()) st = step_recorder_->RecordBucket(meta, slices);
  if (st.ok() && final_recorder_ && meta.phase == pb::FINAL) st = final_recorder_->RecordBucket(meta, slices);
  return Contained(st);
}

Status GuardSink::OnStep(const pb::StepInfo& info) {
  if (inner_ != nullptr && inner_->WantsStep(info.step())) GT_RETURN_IF_ERROR(inner_->OnStep(info));
  if (!Checking(info.step())) return Status::Ok();
  Status st = open_step_ == info.step() ? Status::Ok() : BeginStep(info.step());
  if (st.ok()) st = step_recorder_->RecordStep(info);
  if (st.ok() && final_recorder_) st = final_recorder_->RecordStep(info);
  if (st.ok() && info.optimizer_step()) st = EndStep(info.step());
  return Contained(st);
}

Status GuardSink::Contained(const Status& st) {
  // Ok, a violation under "raise" (Mismatch), or any error under "raise" goes to the training; else the guard stops.
  if (st.ok() || st.code() == Status::Code::kMismatch || options_.on_violation == "raise") return st;
  Disable("internal error: " + st.message());
  return Status::Ok();
}

Status GuardSink::BeginStep(int64_t step) {
  RecorderOptions ro;
  ro.path = (fs::path(tmp_dir_) / RankFileName(rank_)).string();
  ro.mode.kind = CaptureMode::Kind::kSketch;
  ro.mode.k = options_.sketch_k;
  ro.steps = std::set<int64_t>{step};
  ro.on_error = OnCaptureError::kAbort;
  ro.overwrite = true;
  ro.direct_io = false;
  step_recorder_.reset();  // a step left open (never reached its optimizer step) is dropped
  final_recorder_.reset();
  auto opened = Recorder::Open(ro, run_);
  if (!opened.ok()) return opened.status();
  step_recorder_ = std::move(opened).value();
  if (Comparing(step)) {
    ro.path = (fs::path(tmp_dir_) / "final" / RankFileName(rank_)).string();
    ro.mode.kind = CaptureMode::Kind::kStats;
    auto finals = Recorder::Open(ro, run_);
    if (!finals.ok()) return finals.status();
    final_recorder_ = std::move(finals).value();
  }
  open_step_ = step;
  return Status::Ok();
}

Status GuardSink::EndStep(int64_t step) {
  GT_RETURN_IF_ERROR(step_recorder_->Close());
  step_recorder_.reset();
  open_step_ = -1;
  auto sketch = ReadAll((fs::path(tmp_dir_) / RankFileName(rank_)).string());
  if (!sketch.ok()) return sketch.status();
  std::string finals;
  if (final_recorder_) {
    GT_RETURN_IF_ERROR(final_recorder_->Close());
    final_recorder_.reset();
    auto read = ReadAll((fs::path(tmp_dir_) / "final" / RankFileName(rank_)).string());
    if (!read.ok()) return read.status();
    finals = std::move(read).value();
  }
  auto mine = Pack(*sketch, finals);
  std::vector<diff::Violation> found;
  try {
    auto judged = GatherAndJudge(step, mine);
    if (!judged.ok()) return judged.status();
    found = std::move(judged).value();
  } catch (const c10::Error& e) {  // the exchange: a rank died or did not send within the timeout
    const std::string why = "the exchange of step " + std::to_string(step) + " failed (" +
                            std::string(e.what_without_backtrace()).substr(0, 200) + ")";
    if (options_.on_violation == "raise") return Status::IoError(why);
    Disable(why);
    return Status::Ok();
  }
  ++steps_checked_;
  bytes_sent_ = std::max<int64_t>(bytes_sent_, static_cast<int64_t>(mine.size()));
  return Said(step, found);
}

Expected<std::vector<diff::Violation>> GuardSink::GatherAndJudge(int64_t step, const std::string& mine) {
  const std::vector<std::string> all = world_ > 1 ? AllGatherBytes(exchange_, mine) : std::vector<std::string>{mine};
  std::vector<std::string> sketches, finals;
  for (const std::string& blob : all) {
    auto parts = Unpack(blob);
    if (!parts) return Status::Corruption("guard step " + std::to_string(step) + ": a rank sent a damaged payload");
    sketches.push_back(std::move(parts->first));
    if (!parts->second.empty()) finals.push_back(std::move(parts->second));
  }
  auto set = LoadGathered(tmp_dir_ + "/gathered", "guard-step-" + std::to_string(step), sketches);
  if (!set.ok()) return set.status();
  diff::SelfOptions so;
  so.step = step;
  so.threads = 1;
  auto report = diff::SelfCheckSet(*set, so);
  if (!report.ok()) return report.status();
  std::vector<diff::Violation> found = diff::SelfViolations(*report);
  if (finals.size() == all.size()) {
    auto against = AgainstReference(step, finals, *report, *set);
    if (!against.ok()) return against.status();
    for (auto& v : *against) found.push_back(std::move(v));
  } else if (reference_ && !left_reference_ && !reference_->steps().empty() && step > reference_->steps().back()) {
    std::string steps;
    for (size_t i = 0; i < std::min<size_t>(reference_->steps().size(), 8); ++i) {
      steps += (i ? ", " : "") + std::to_string(reference_->steps()[i]);
    }
    Scope("reference", "the reference recorded FINAL at steps [" + steps + "]: later steps are not compared");
  }
  return found;
}

Expected<std::vector<diff::Violation>> GuardSink::AgainstReference(int64_t step, const std::vector<std::string>& finals,
                                                                   const diff::Report& self,
                                                                   const diff::TraceSet& steps) {
  auto set = LoadGathered(tmp_dir_ + "/gathered-final", "guard-final-" + std::to_string(step), finals);
  if (!set.ok()) return set.status();
  auto moments = diff::FinalMoments(*set, step);
  if (!moments.ok()) return moments.status();
  auto compared = reference_->Judge(step, run_, world_, *moments, &self, &steps);
  if (!compared.ok()) return compared.status();
  std::vector<diff::Violation> found = diff::ReferenceViolations(*compared);
  if (!found.empty()) {
    left_reference_ = step;
    Scope("reference", "the run differs from the reference at step " + std::to_string(step) +
                           ": later steps start from other weights and are not compared");
  }
  return found;
}

Status GuardSink::Said(int64_t step, const std::vector<diff::Violation>& found) {
  for (const diff::Violation& v : found) {
    Log("violation", JsonOf(v, step));
    ++violations_;
    ++by_check_[v.check];
    if (first_.is_null()) first_ = {{"step", step}, {"check", v.check}, {"message", v.message}};
    const bool repeat = !said_.insert({v.check, v.message}).second;  // a repeat is logged and counted, not said
    if (rank_ == 0 && !(repeat && options_.on_violation == "warn"))
      std::cerr << diff::ViolationLine(0, step, v) << "\n";
  }
  if (found.empty() || options_.on_violation != "raise") return Status::Ok();
  return Status::Mismatch("the guard found " + std::to_string(found.size()) + " violation" +
                          (found.size() != 1 ? "s" : "") + " at step " + std::to_string(step) +
                          " (--guard-on-violation raise)");
}

void GuardSink::Scope(const std::string& check, const std::string& why) {
  if (!scoped_.insert(check).second) return;
  const std::string message = check + " is not checked: " + why;
  Log("scope", {{"check", check}, {"message", message}});
  if (rank_ == 0) std::cerr << TerminalSafe("gradtrace guard: note: " + message) << "\n";
}

void GuardSink::Disable(const std::string& why) {
  if (disabled_) return;
  disabled_ = why;
  step_recorder_.reset();
  final_recorder_.reset();
  open_step_ = -1;
  Log("disabled", {{"message", why}});
  std::cerr << TerminalSafe("gradtrace guard: WARNING: rank " + std::to_string(rank_) + ": guard disabled: " + why +
                            "; training continues without it")
            << "\n";
}

void GuardSink::Log(const std::string& event, nlohmann::ordered_json fields) {
  if (!log_.is_open()) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::ordered_json line = {{"event", event}, {"rank", rank_}, {"time", std::round(now * 1000) / 1000}};
  line.update(fields);
  log_ << line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  log_.flush();
}

void GuardSink::Close() {
  if (closed_) return;
  closed_ = true;
  step_recorder_.reset();
  final_recorder_.reset();
  Log("summary", {{"steps_checked", steps_checked_},
                  {"violations", violations_},
                  {"by_check", by_check_},
                  {"first", first_},
                  {"bytes_sent_per_step", bytes_sent_},
                  {"every", options_.every},
                  {"disabled", disabled_ ? nlohmann::ordered_json(*disabled_) : nullptr}});
  log_.close();
  if (rank_ == 0) {
    std::string first;
    if (!first_.is_null()) {
      first = " (the first at step " + std::to_string(first_["step"].get<int64_t>()) + ": " +
              first_["message"].get<std::string>() + ")";
    }
    std::cerr << TerminalSafe("gradtrace guard: rank 0: " + std::to_string(steps_checked_) + " step" +
                              (steps_checked_ != 1 ? "s" : "") + " checked, " + std::to_string(violations_) +
                              " violation" + (violations_ != 1 ? "s" : "") + first + "; log " + log_path_)
              << "\n";
  }
  std::error_code ec;
  fs::remove_all(tmp_dir_, ec);
}

}  // namespace gradtrace::capture
