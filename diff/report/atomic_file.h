// Report files are written to a temporary sibling and renamed into place, so
// a later error (or a crash) never leaves a half-written or destroyed output.
#pragma once

#include <string>

#include "status.h"

namespace gradtrace::diff {

// Writes `content` to `path` atomically (temp file in the same directory, then
// rename). On failure `path` is untouched and the temp file removed. A path
// that exists and is not a regular file (/dev/null, /dev/stdout, a FIFO) is
// written directly: renaming over it would replace the device with a file.
Status WriteFileAtomic(const std::string& path, const std::string& content);
Status WriteFileAtomic(const std::string& path, const std::string& content);

}  // namespace gradtrace::diff
