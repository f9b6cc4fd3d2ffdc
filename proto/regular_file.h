// Opening outside input without blocking. A FIFO named like a trace (or a
// report, or given directly) blocks a plain open() for reading until some
// process opens it for writing: forever, if none does. So readers open with
// O_NONBLOCK, check with fstat that they got a regular file, and only then
// read.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "status.h"

namespace gradtrace {

// Opens `path` for reading ("rb") when it is a regular file (symbolic links
// followed); the caller owns the FILE. Errors name `name` (what the user gave,
// `path` when empty), both IoError: "<name>: cannot open: <errno text>", or
// "<name>: not a regular file (a FIFO)" -- or a directory, a character device,
// a block device, a socket -- without blocking on any of them.
Expected<std::FILE*> OpenRegularFile(const std::string& path, const std::string& name = "");

// The whole of a regular file of at most `max_bytes` (opened as above):
// LimitExceeded "<name>: N bytes, more than the limit of M" before reading.
Expected<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes, const std::string& name = "");

}  // namespace gradtrace
