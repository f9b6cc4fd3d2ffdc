// The GradSink that writes through the Recorder (links gradtrace_recorder).
#pragma once

#include "grad_sink.h"
#include "recorder.h"

namespace gradtrace::capture {

class RecorderSink : public GradSink {
 public:
  explicit RecorderSink(Recorder* recorder) : recorder_(recorder) {}
  bool WantsStep(int64_t step) const override { return recorder_->enabled() && recorder_->WantsStep(step); }
  Status OnStep(const pb::StepInfo& step) override { return recorder_->RecordStep(step); }
  Status OnBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices) override {
    return recorder_->RecordBucket(meta, slices);
  }

 private:
  Recorder* recorder_;
};

}  // namespace gradtrace::capture
