// Temporaries that a signal must not leave behind. Regression, issue 20:
// Ctrl-C during gradtrace-pack left X.gtpack.tmp.PID (and .fit.PID,
// .reencode.PID/) next to the archive. Destructors remove them on every
// return and exception; a signal that ends the process runs no destructor, so
// the paths are also kept here, for a handler that removes them.
#pragma once

#include <string>

namespace gradtrace::pack {

// Registers `path` (a file, or a directory tree at most four levels deep) to be
// removed if SIGINT, SIGTERM or SIGHUP arrives. The first call installs the
// handlers (a signal the process inherited as ignored stays ignored). The
// handler uses async-signal-safe calls only: it removes every registered path,
// restores the signal's default action and raises it again, so the process
// ends with the signal's status (130 for SIGINT in a shell) as it would have
// without the handler. At most 8 paths at a time, each shorter than 4096 bytes;
// a path beyond that is not registered (false), and only its destructor
// removes it.
bool RemoveOnSignal(const std::string& path);

// Forgets `path` (once it is removed, or renamed into place). A path not
// registered is ignored.
void ForgetOnSignal(const std::string& path);

}  // namespace gradtrace::pack
