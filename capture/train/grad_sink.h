// Where the trainer sends what it observes: the Recorder in gradtrace-train
// (recorder_sink.h), an in-memory sink in tests.
#pragma once

#include <vector>

#include "gradtrace.pb.h"
#include "recorder.h"  // BucketMeta, SliceRef (header only: no link dependency)
#include "status.h"

namespace gradtrace::capture {

class GradSink {
 public:
  virtual ~GradSink() = default;
  virtual bool WantsStep(int64_t step) const = 0;
  virtual Status OnStep(const pb::StepInfo& step) = 0;
  // `slices` values may be views: the sink copies what it keeps before returning.
  virtual Status OnBucket(const BucketMeta& meta, const std::vector<SliceRef>& slices) = 0;
};

}  // namespace gradtrace::capture
