// Report files are written to a temporary sibling and renamed into place, so
// a later error (or a crash) never leaves a half-written or destroyed output.
#pragma once

#include <string>

#include "status.h"

namespace gradtrace::diff {

// Writes `content` to `path` atomically (temp file in the same directory, then
// rename). On failure `path` is untouched and the temp file removed.
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace gradtrace::diff
