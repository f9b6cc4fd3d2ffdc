// What the human reports (text, Markdown, HTML) show of the parameters: a
// person reads the groups, the worst parameters and the problems, not 100,000
// rows (issue 42: a 100,000-parameter diff wrote a 62 MB HTML page). The JSON
// report keeps every parameter.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "report/report.h"

namespace gradtrace::diff {

// Rows by default: text and Markdown, and the HTML page (--top N sets all three).
inline constexpr size_t kTextRows = 50, kHtmlRows = 500;
// Problem parameters (mismatch, missing, nonfinite; --self: wrong-divisor, inconsistent) are shown past `top`, up
// to this many in all.
inline constexpr size_t kMaxProblemRows = 1000;

struct ShownRows {
  std::vector<size_t> index;  // into params (self_params in --self), report order (worst first)
  size_t hidden = 0;          // rows not shown
  std::string rest;           // "" when none is hidden, else what they are: "99,950 more: 99,900 scaled, 50 match"
};

// The first `top` rows of the report (0: `fallback`), and every problem row after them up to kMaxProblemRows.
ShownRows RowsForPeople(const Report& r, size_t top, size_t fallback);

// `name` for a table or chart: whole when at most `width` bytes, else its head and tail around "…" (the tail is
// the specific part: layers.31.mlp.experts.117.down_proj.weight), cut on UTF-8 boundaries. Not escaped.
std::string ShortName(const std::string& name, size_t width);

// 1234567 -> "1,234,567".
std::string Thousands(size_t n);

}  // namespace gradtrace::diff
