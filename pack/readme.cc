#include "readme.h"

namespace gradtrace::pack {

std::string RenderReadme(const ReadmeFacts& f) {
  const bool two = f.sources.size() > 1;
  std::string s = "# gradtrace bug report\n\n";
  s += "Packed by gradtrace-pack " GRADTRACE_VERSION " from `" + f.sources[0] + "`" +
       (two ? " (A, the reference) and `" + f.sources[1] + "` (B)" : "") + ".\n\n";
  s += "**" + f.headline + "** (gradtrace-diff exit " + std::to_string(f.exit_code) + ")\n\n";
  s += "## Rerun\n\n```sh\n";
  s += "gradtrace-diff " + f.archive + "     # the packed comparison" +
       (f.diff_options.empty() ? "" : " (" + f.diff_options + ")") + "; reproduces report.json\n";
  if (two) {
    s += "gradtrace-diff " + f.archive + ":a " + f.archive + ":b --phase post --step 0   # any other comparison\n";
  } else {
    s += "gradtrace-diff --self " + f.archive + ":a --step 0   # any other step\n";
  }
  s += "gradtrace-inspect --verify " + f.archive + "   # what each trace holds; every checksum\n```\n\n";
  s += "Both read the archive in place; `tar xf " + f.archive + "` also unpacks it (a plain ustar file).\n\n";
  s += "## What is inside\n\n| member | what |\n| --- | --- |\n";
  s += "| `a/rank-NNNNN.gtrace` | trace set A, one file per rank (`" + f.sources[0] + "`) |\n";
  if (two) s += "| `b/rank-NNNNN.gtrace` | trace set B (`" + f.sources[1] + "`) |\n";
  s +=
      "| `report.json`, `report.md`, `report.html` | the diff of the packed traces (schema: diff/REPORT_SCHEMA.md) |\n";
  if (f.original_report) {
    s += "| `original-report.json` | the diff of the traces as captured, before re-encoding |\n";
  }
  s += "| `environment.json` | per set: framework, versions (torch, CUDA, NCCL, ...), producer, configuration, host, "
       "world; the pack's command line |\n";
  s += "| `pack.json` | the comparison to rerun, the size limit and the fidelity per parameter |\n";
  for (const std::string& a : f.attachments) s += "| `attached/" + a + "` | attached by the reporter |\n";
  s += "\n## Fidelity\n\n";
  if (f.fidelity.empty()) {
    s += "Every trace is byte for byte the file captured (" + HumanBytes(f.captured_bytes) + ", limit " +
         HumanBytes(f.limit) + ").\n";
    return s;
  }
  s += "The traces as captured (" + HumanBytes(f.captured_bytes) + ") did not fit the limit of " + HumanBytes(f.limit) +
       ": they were re-encoded to " + HumanBytes(f.packed_trace_bytes) +
       " with the gradtrace codec, the same choice for every set, spending the budget on the parameters "
       "that differ first. `sketch:K` keeps K values per parameter at positions that depend on its name and K "
       "only, so A and B still align; `stats` keeps count, sum, sum of squares, abs-max and non-finite count. "
       "The scale factors in report.json are measured on what was kept; original-report.json has the "
       "full-value diff.\n\n";
  s += "| parameter | kept as | why |\n| --- | --- | --- |\n";
  for (const Choice& c : f.fidelity) s += "| `" + c.name + "` | " + c.mode.ToString() + " | " + c.why + " |\n";
  return s;
}

}  // namespace gradtrace::pack
