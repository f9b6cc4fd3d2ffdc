// Re-encoding one trace file with fewer values per parameter, through the one
// codec: TraceReader in, TraceWriter out, MakeSlice for the sketch and stats
// payloads. Steps, record layout and RunInfo are kept; only full slices of
// parameters whose choice is not full change.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "slice_codec.h"
#include "status.h"
#include "trace_reader.h"

namespace gradtrace::pack {

// Writes `source` to `out_path` with each full slice of parameter NAME in
// modes[NAME] (absent: kept). Returns the bytes written. A truncated source
// gives a trace of its complete frames; other damage is an error naming it.
Expected<uint64_t> ReencodeTrace(const TraceSource& source, const std::string& out_path,
                                 const std::unordered_map<std::string, CaptureMode>& modes);

}  // namespace gradtrace::pack
