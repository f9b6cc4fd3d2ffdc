// Temporaries an earlier gradtrace-pack left behind. A signal handler removes
// them on SIGINT, SIGTERM and SIGHUP (signal_cleanup.h), but nothing runs on
// SIGKILL or a power cut: X.gtpack.tmp.PID stayed next to the archive
// (issue 42). Their names carry the writer's process id, so the next run for
// the same output removes those whose process is gone.
#pragma once

#include <string>
#include <vector>

namespace gradtrace::pack {

// The suffixes of a pack's temporaries: OUT.tmp.PID, OUT.fit.PID, OUT.reencode.PID/.
inline const char* const kTemporaryKinds[] = {"tmp", "fit", "reencode"};

// Removes every OUT.KIND.PID beside `out` (KIND in kTemporaryKinds, PID decimal) whose process no longer
// exists (kill(PID, 0) fails with ESRCH), files or directory trees. A live process's, this process's and
// anything else are left. Returns the paths removed, for one line each on stderr.
std::vector<std::string> RemoveStaleTemporaries(const std::string& out);

}  // namespace gradtrace::pack
