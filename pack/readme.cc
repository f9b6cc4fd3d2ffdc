#include "readme.h"

#include <map>

#include "text_escape.h"

namespace gradtrace::pack {

// Paths, names, the headline and the rename rules come from the user's traces and command line: every one goes
// out escaped for where it lands (text_escape.h). Regression, issue 20: they went out as raw Markdown and HTML.
std::string RenderReadme(const ReadmeFacts& f) {
  const bool two = f.sources.size() > 1;
  const auto cell = MarkdownPlace::kTableCell;
  std::string s = "# gradtrace bug report\n\n";
  s += "Packed by gradtrace-pack " GRADTRACE_VERSION " from " + MarkdownCode(f.sources[0]) +
       (two ? " (A, the reference) and " + MarkdownCode(f.sources[1]) + " (B)" : "") + ".\n\n";
  s += "**" + MarkdownText(f.headline) + "** (gradtrace-diff exit " + std::to_string(f.exit_code) + ")\n\n";
  s += "## Rerun\n\n";
  const std::string archive = TerminalSafe(f.archive);  // one line in the code block, whatever the name holds
  std::string sh = "gradtrace-diff " + archive + "     # the packed comparison" +
                   (f.diff_options.empty() ? "" : " (" + TerminalSafe(f.diff_options) + ")") +
                   "; reproduces report.json\n";
  if (two) {
    sh += "gradtrace-diff " + archive + ":a " + archive + ":b --phase post --step 0   # any other comparison\n";
  } else {
    sh += "gradtrace-diff --self " + archive + ":a --step 0   # any other step\n";
  }
  sh += "gradtrace-inspect --verify " + archive + "   # what each trace holds; every checksum\n";
  s += MarkdownCodeBlock("sh", sh) + "\n";
  s += "Both read the archive in place; " + MarkdownCode("tar xf " + f.archive) +
       " also unpacks it (a plain ustar file).\n\n";
  s += "## What is inside\n\n| member | what |\n| --- | --- |\n";
  s += "| `a/rank-NNNNN.gtrace` | trace set A, one file per rank (" + MarkdownCode(f.sources[0], cell) + ") |\n";
  if (two) s += "| `b/rank-NNNNN.gtrace` | trace set B (" + MarkdownCode(f.sources[1], cell) + ") |\n";
  const std::string zst = f.compressed_json ? ".zst" : "";
  s += "| `report.json" + zst +
       "`, `report.md`, `report.html` | the diff of the packed traces (schema: "
       "diff/REPORT_SCHEMA.md" +
       (f.compressed_json ? "; the JSON, every parameter of it, zstd-compressed: `zstd -d report.json.zst`" : "") +
       ") |\n";
  if (f.original_report) {
    s += "| `original-report.json" + zst + "` | the diff of the traces as captured, before re-encoding |\n";
  }
  s += "| `environment.json` | per set: framework, versions (torch, CUDA, NCCL, ...), producer, configuration, host, "
       "world; the pack's command line |\n";
  s += "| `pack.json` | the comparison to rerun, the size limit and the fidelity per parameter |\n";
  for (const std::string& a : f.attachments) {
    s += "| " + MarkdownCode("attached/" + a, cell) + " | attached by the reporter |\n";
  }
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
  std::map<std::string, size_t> rest;  // mode -> parameters past the table
  for (size_t i = 0; i < f.fidelity.size(); ++i) {
    const Choice& c = f.fidelity[i];
    if (i >= kReadmeFidelityRows) {
      ++rest[c.mode.ToString()];
      continue;
    }
    s += "| " + MarkdownCode(c.name, cell) + " | " + MarkdownText(c.mode.ToString()) + " | " + MarkdownText(c.why) +
         " |\n";
  }
  if (!rest.empty()) {
    s += "\n" + std::to_string(f.fidelity.size() - kReadmeFidelityRows) + " more parameters:";
    const char* sep = " ";
    for (const auto& [mode, n] : rest) s += sep + std::to_string(n) + " " + MarkdownText(mode), sep = ", ";
    s += " (`pack.json` lists every parameter's).\n";
  }
  return s;
}

}  // namespace gradtrace::pack
