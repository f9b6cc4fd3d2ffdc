// gradtrace-pack: one archive for a bug report -- one or two trace sets, the
// diff of what was packed, the environment, attachments and a README -- under
// a bug tracker's attachment limit. Exit 0 when the archive is written (the
// diff's verdict is in it), 2 on bad input or when it cannot fit, with one
// line "gradtrace-pack: <file>: <what>" on stderr and the output untouched.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

#include "byte_size.h"
#include "fidelity.h"
#include "packer.h"
#include "text_escape.h"

namespace {

// One line on stderr: line breaks as spaces, other control bytes (from a path or a name) escaped.
int Fail(std::string message) {
  for (char& c : message) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "gradtrace-pack: %s\n", gradtrace::TerminalSafe(message).c_str());
  return 2;
}

// The command line into `o`; --limit and --step as text, parsed after.
void AddOptions(CLI::App& app, gradtrace::pack::PackOptions& o, std::string& limit_text, std::string& step_text) {
  app.add_option("SETS", o.sets, "trace set A (the reference), and B (the suspect); one set packs a --self check")
      ->required()
      ->expected(1, 2);
  app.add_option("-o,--output", o.output, "archive to write (e.g. bug.gtpack)")->required();
  app.add_option("--limit", limit_text,
                 "largest archive: 25M (default; k, M, G decimal; KiB, MiB, GiB binary); traces are re-encoded "
                 "(sketch:K, stats) when they do not fit");
  app.add_option("--attach", o.attachments,
                 "a file to include under attached/ (repeatable), e.g. the DeepSpeed config");
  // The diff options are checked by diff::ValidateDiffOptions, as gradtrace-diff and a pack.json's are.
  app.add_option("--phase", o.diff.phase, "diff option: phase to compare (final, post, pre)");
  app.add_option("--step", step_text, "diff option: step to compare (default: the first both sets recorded)");
  app.add_option("--rtol", o.diff.rtol, "diff option: relative tolerance");
  app.add_option("--rename", o.diff.renames, "diff option: rename rule 'REGEX=REPL' (repeatable)");
  app.add_option("--threads", o.threads, "worker threads (default: all cores)")->check(CLI::NonNegativeNumber);
}

// --step's text as a step number; nullopt when it is not one.
std::optional<int64_t> ParseStep(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || *end != '\0' || n < 0) return std::nullopt;
  return n;
}

// Two lines on stdout: what was written, and the packed diff's verdict with the command that repeats it.
void PrintPacked(const gradtrace::pack::PackOptions& o, const gradtrace::pack::PackResult& r) {
  using gradtrace::pack::HumanBytes;
  std::printf("%s: %s in %zu members (limit %s); traces %s\n", o.output.c_str(),
              HumanBytes(static_cast<double>(r.archive_bytes)).c_str(), r.members,
              HumanBytes(static_cast<double>(o.limit)).c_str(),
              r.reencoded ? ("re-encoded from " + HumanBytes(static_cast<double>(r.captured_bytes)) + " to " +
                             HumanBytes(static_cast<double>(r.packed_trace_bytes)) +
                             " (README.md lists what each parameter kept)")
                                .c_str()
                          : "byte for byte as captured");
  std::printf("packed diff (exit %d): %s\nrerun: gradtrace-diff %s\n", r.diff_exit,
              gradtrace::TerminalSafe(r.headline).c_str(), o.output.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradtrace;
  CLI::App app{"gradtrace-pack: pack trace sets, their diff and the environment into one archive for a bug report",
               "gradtrace-pack"};
  pack::PackOptions o;
  std::string limit_text = "25M", step_text;
  AddOptions(app, o, limit_text, step_text);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(e.what());
  }
  auto limit = pack::ParseByteSize(limit_text);
  if (!limit.ok()) return Fail(limit.status().message());
  o.limit = *limit;
  if (!step_text.empty()) {
    o.diff.step = ParseStep(step_text);
    if (!o.diff.step) return Fail("--step: expected a step number, got '" + step_text + "'");
  }
  if (o.sets.size() == 1) o.diff.mode = "self";  // one trace set packs a --self check
  if (Status st = diff::ValidateDiffOptions(o.diff, diff::OptionSource::kCommandLine); !st.ok()) {
    return Fail(st.message());
  }
  for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);

  // An exception caught here unwinds Pack's frames, whose destructors remove the temporaries
  // (X.gtpack.tmp.PID, .fit.PID, .reencode.PID); uncaught, it aborts and leaves them behind.
  std::optional<Expected<pack::PackResult>> packed;
  try {
    packed.emplace(pack::Pack(o));
  } catch (const std::exception& e) {
    return Fail(o.output + ": " + e.what());
  }
  if (!packed->ok()) return Fail(packed->status().message());
  PrintPacked(o, **packed);
  return 0;
}
