// --html: one self-contained page (inline CSS and SVG, no scripts, no external
// assets). The chart has two panels sharing the x axis (parameters), one mark
// per parameter in each (past 1,000 parameters, 400 columns each aggregating
// its run): the scale factor B/A (the effective divisor in --self) and the
// residual, both on log axes, the tolerance drawn as a line. The table shows
// the worst parameters and every problem (report/rows.h) and counts the rest.
// --self adds the per-rank x per-bucket view (bucket_view.h) as a table
// coloured by whether each reduction's divisor is the expected one; a two-set
// diff draws each side's view (TraceSide.bucket_view) with the same code.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

#include "report/report.h"
#include "report/rows.h"
#include "slice_codec.h"
#include "text_escape.h"

namespace gradtrace::diff {
namespace {

std::string Esc(const std::string& s) { return HtmlEscape(s); }  // text_escape.h: the one HTML escaping

std::string F(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

const char* VerdictColour(const std::string& v) {
  if (v == "match" || v == "ok") return "#2e7d32";
  if (v == "scaled" || v == "wrong-divisor" || v == "incomplete") return "#e65100";
  if (v == "missing") return "#6a1b9a";
  return "#c62828";
}

struct Point {
  std::string name;
  double scale;
  double residual;
  std::string verdict;
};

bool Plottable(double scale) { return std::isfinite(scale) && scale > 0; }

// Log2 of the scale axis' ends: every positive factor and 1, a quarter octave of margin.
std::pair<double, double> ScaleRange(const std::vector<Point>& pts) {
  double lo = 0, hi = 0;
  for (const auto& p : pts) {
    if (!Plottable(p.scale)) continue;
    lo = std::min(lo, std::log2(p.scale));
    hi = std::max(hi, std::log2(p.scale));
  }
  return {lo - 0.25, std::max(hi, lo + 1) + 0.25};
}

// Names under the x axis: every parameter when they fit, else every k-th (a
// tick marks each labelled one); long names keep their tail, the specific part.
template <typename XOf>
std::string XTicks(const std::vector<Point>& pts, double axis_y, const XOf& x) {
  constexpr size_t kMaxTicks = 48, kMaxChars = 24;
  const size_t every = pts.size() <= kMaxTicks ? 1 : (pts.size() + kMaxTicks - 1) / kMaxTicks;
  std::string s;
  for (size_t i = 0; i < pts.size(); i += every) {
    std::string name = pts[i].name;
    if (name.size() > kMaxChars) {
      size_t cut = name.size() - (kMaxChars - 1);
      while (cut < name.size() && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) ++cut;  // UTF-8 boundary
      name = "\u2026" + name.substr(cut);
    }
    const std::string cx = F(x(i)), cy = F(axis_y + 10);
    s += "<line x1=\"" + cx + "\" x2=\"" + cx + "\" y1=\"" + F(axis_y) + "\" y2=\"" + F(axis_y + 4) +
         "\" stroke=\"#555\"/><text class=\"tick\" x=\"" + cx + "\" y=\"" + cy + "\" transform=\"rotate(-45 " + cx +
         " " + cy + ")\" text-anchor=\"end\" font-size=\"9\">" + Esc(name) + "</text>\n";
  }
  return s;
}

// Past this many parameters the chart draws kBins columns, each aggregating its run of parameters: one mark per
// parameter made a 62 MB page at 100,000 (issue 42).
constexpr size_t kMaxMarks = 1000, kBins = 400;
// Names longer than this are cut for display (ShortName); a cut table name unfolds to its whole name up to
// kWholeNameBytes, and past that points to the JSON report (a 1 MiB name is not a thing to read in a page).
constexpr size_t kNameBytes = 120, kWholeNameBytes = 4096;

int VerdictRank(const std::string& v) {
  if (v == "match" || v == "ok") return 0;
  if (v == "scaled" || v == "wrong-divisor") return 1;
  if (v == "missing") return 2;
  if (v == "mismatch" || v == "inconsistent") return 3;
  return 4;
}

// The chart's columns past kMaxMarks: per column, the range of its plottable scales (a bar from the least to the
// greatest) and of its residuals, in the colour of its worst verdict; its title names the first and last
// parameter, the ranges and the verdict counts.
template <typename X, typename YS, typename YR>
std::string AggregatedMarks(const std::vector<Point>& pts, bool self, const X& x, const YS& ys, const YR& yr,
                            double mid) {
  const size_t n = pts.size(), per = (n + kBins - 1) / kBins;
  std::string s;
  for (size_t lo = 0; lo < n; lo += per) {
    const size_t hi = std::min(n, lo + per);
    double smin = INFINITY, smax = -INFINITY, rmin = INFINITY, rmax = -INFINITY;
    std::map<std::string, size_t> verdicts;
    std::string worst = pts[lo].verdict;
    for (size_t i = lo; i < hi; ++i) {
      const Point& p = pts[i];
      if (Plottable(p.scale)) smin = std::min(smin, p.scale), smax = std::max(smax, p.scale);
      const double r = std::isfinite(p.residual) ? p.residual : 1.0;
      rmin = std::min(rmin, r), rmax = std::max(rmax, r);
      ++verdicts[p.verdict];
      if (VerdictRank(p.verdict) > VerdictRank(worst)) worst = p.verdict;
    }
    std::string counts;
    for (const auto& [v, k] : verdicts) counts += (counts.empty() ? "" : ", ") + Thousands(k) + " " + v;
    const std::string title = "<title>parameters " + Thousands(lo + 1) + "-" + Thousands(hi) + " of " + Thousands(n) +
                              ": " + Esc(ShortName(pts[lo].name, 60)) + " ... " + Esc(ShortName(pts[hi - 1].name, 60)) +
                              "; " + (self ? "divisor " : "scale ") +
                              (smin <= smax ? FormatNumber(smin, 6) + " to " + FormatNumber(smax, 6) : "none") +
                              ", residual " + FormatNumber(rmin, 3) + " to " + FormatNumber(rmax, 3) + " (" + counts +
                              ")</title>";
    const char* colour = VerdictColour(worst);
    const double cx = (x(lo) + x(hi - 1)) / 2, w = std::max(2.0, x(hi - 1) - x(lo) + 1.5);
    if (smin <= smax) {
      const double y0 = ys(smax), h = std::max(4.0, ys(smin) - y0);
      s += "<rect class=\"bin scale\" x=\"" + F(cx - w / 2) + "\" y=\"" + F(y0 - (h == 4.0 ? 2 : 0)) + "\" width=\"" +
           F(w) + "\" height=\"" + F(h) + "\" fill=\"" + colour + "\">" + title + "</rect>\n";
    } else {
      s += "<rect class=\"bin scale nan\" x=\"" + F(cx - w / 2) + "\" y=\"" + F(mid - 8) + "\" width=\"" + F(w) +
           "\" height=\"8\" fill=\"" + colour + "\">" + title + "</rect>\n";
    }
    const double r0 = yr(rmax), rh = std::max(4.0, yr(rmin) - r0);
    s += "<rect class=\"bin residual\" x=\"" + F(cx - w / 2) + "\" y=\"" + F(r0 - (rh == 4.0 ? 2 : 0)) + "\" width=\"" +
         F(w) + "\" height=\"" + F(rh) + "\" fill=\"" + colour + "\">" + title + "</rect>\n";
  }
  return s;
}

// The ring and label that mark where a mismatch enters the model (Group::localisation) on its parameter's mark.
std::string BoundaryMark(double cx, double cy, const Localisation& where) {
  return "<circle class=\"boundary\" cx=\"" + F(cx) + "\" cy=\"" + F(cy) +
         "\" r=\"10\" fill=\"none\" stroke=\"#6a1b9a\" stroke-width=\"2\"><title>differences enter at " +
         Esc(where.module) + "</title></circle>\n<text class=\"boundary\" x=\"" + F(cx) + "\" y=\"" + F(cy - 14) +
         "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#6a1b9a\">enters at " +
         Esc(ShortName(where.module, kNameBytes)) + "</text>\n";
}

std::string Chart(const std::vector<Point>& pts, double rtol, bool self,
                  const std::optional<Localisation>& boundary = std::nullopt) {
  // bottom: room for the parameter names under the axis (rotated, at most kMaxTicks of them).
  const double W = 960, H = 650, left = 84, right = 20, top = 30, mid = 270, gap = 40, bottom = 166;
  const double ph1 = mid - top, ph2 = H - bottom - (mid + gap);
  size_t n = pts.size();
  // Not a structured binding: clang 14 (the fuzz build) refuses to capture those in a lambda.
  const std::pair<double, double> range = ScaleRange(pts);
  const double lo = range.first, hi = range.second;
  auto x = [&](size_t i) { return left + (W - left - right) * (n <= 1 ? 0.5 : (i + 0.5) / n); };
  auto ys = [&](double s) { return top + ph1 * (1 - (std::log2(s) - lo) / (hi - lo)); };
  const double rlo = -12, rhi = 0;
  auto yr = [&](double r) {
    double l = std::clamp(std::log10(std::max(r, 1e-300)), rlo, rhi);
    return mid + gap + ph2 * (1 - (l - rlo) / (rhi - rlo));
  };
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"chart\" width=\"" + F(W) + "\" height=\"" + F(H) +
       "\" viewBox=\"0 0 " + F(W) + " " + F(H) + "\" role=\"img\" aria-label=\"" +
       (self ? "effective divisor" : "scale factor") + " and residual per parameter\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + F(W) + "\" height=\"" + F(H) + "\" fill=\"#ffffff\"/>\n";
  // Gridlines at powers of two (factors are mostly small integers and their reciprocals), at most 9.
  const int first = static_cast<int>(std::ceil(lo)), last = static_cast<int>(std::floor(hi));
  const int every = std::max(1, (last - first) / 8 + 1);
  for (int k = first; k <= last; k += every) {
    double v = std::pow(2.0, k);
    s += "<line x1=\"" + F(left) + "\" x2=\"" + F(W - right) + "\" y1=\"" + F(ys(v)) + "\" y2=\"" + F(ys(v)) +
         "\" stroke=\"#e0e0e0\"/><text x=\"" + F(left - 6) + "\" y=\"" + F(ys(v) + 4) +
         "\" text-anchor=\"end\" font-size=\"11\">" + FormatNumber(v, 4) + "</text>\n";
  }
  s += "<line x1=\"" + F(left) + "\" x2=\"" + F(W - right) + "\" y1=\"" + F(ys(1)) + "\" y2=\"" + F(ys(1)) +
       "\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>\n";
  s += "<text x=\"" + F(left) + "\" y=\"" + F(top - 10) + "\" font-size=\"13\" font-weight=\"bold\">" +
       std::string(self ? "effective divisor per parameter" : "scale factor B/A per parameter") + "</text>\n";
  for (int e = static_cast<int>(rlo); e <= static_cast<int>(rhi); e += 3) {
    s += "<line x1=\"" + F(left) + "\" x2=\"" + F(W - right) + "\" y1=\"" + F(yr(std::pow(10.0, e))) + "\" y2=\"" +
         F(yr(std::pow(10.0, e))) + "\" stroke=\"#e0e0e0\"/><text x=\"" + F(left - 6) + "\" y=\"" +
         F(yr(std::pow(10.0, e)) + 4) + "\" text-anchor=\"end\" font-size=\"11\">1e" + std::to_string(e) + "</text>\n";
  }
  s += "<line x1=\"" + F(left) + "\" x2=\"" + F(W - right) + "\" y1=\"" + F(yr(rtol)) + "\" y2=\"" + F(yr(rtol)) +
       "\" stroke=\"#c62828\" stroke-dasharray=\"4 3\"/><text x=\"" + F(W - right) + "\" y=\"" + F(yr(rtol) - 4) +
       "\" text-anchor=\"end\" font-size=\"11\" fill=\"#c62828\">tolerance " + FormatNumber(rtol, 3) + "</text>\n";
  s += "<text x=\"" + F(left) + "\" y=\"" + F(mid + gap - 10) +
       "\" font-size=\"13\" font-weight=\"bold\">residual per parameter</text>\n";
  // Axis labels: y of each panel (rotated, left of the tick labels), x under both.
  auto ylabel = [&](double y0, double y1, const std::string& text) {
    const double cy = (y0 + y1) / 2;
    return "<text class=\"axis-label\" x=\"14\" y=\"" + F(cy) + "\" transform=\"rotate(-90 14 " + F(cy) +
           ")\" text-anchor=\"middle\" font-size=\"12\">" + text + "</text>\n";
  };
  s += ylabel(top, mid, self ? "effective divisor (log)" : "scale factor B/A (log)");
  s += ylabel(mid + gap, H - bottom, "residual (log)");
  s += "<text class=\"axis-label\" x=\"" + F((left + W - right) / 2) + "\" y=\"" + F(H - 14) +
       "\" text-anchor=\"middle\" font-size=\"12\">parameter (" + Thousands(n) + ", " +
       (self ? "worst first" : "by name") + "; " +
       (n > kMaxMarks ? "each column spans " + Thousands((n + kBins - 1) / kBins) + ": hover it for its range"
                      : std::string("hover a mark for its name")) +
       ")</text>\n";
  s += XTicks(pts, H - bottom, x);
  s += "<line x1=\"" + F(left) + "\" x2=\"" + F(W - right) + "\" y1=\"" + F(H - bottom) + "\" y2=\"" + F(H - bottom) +
       "\" stroke=\"#555\"/>\n";
  if (n > kMaxMarks) return s + AggregatedMarks(pts, self, x, ys, yr, mid) + "</svg>\n";
  // One mark per parameter in each panel.
  for (size_t i = 0; i < n; ++i) {
    const Point& p = pts[i];
    const std::string name = Esc(ShortName(p.name, kNameBytes));
    std::string title = "<title>" + name + ": " + (self ? "divisor " : "scale ") + FormatNumber(p.scale, 6) +
                        ", residual " + FormatNumber(p.residual, 3) + " (" + p.verdict + ")</title>";
    const char* colour = VerdictColour(p.verdict);
    if (Plottable(p.scale)) {
      s += "<circle class=\"mark scale\" data-param=\"" + name + "\" cx=\"" + F(x(i)) + "\" cy=\"" + F(ys(p.scale)) +
           "\" r=\"5\" fill=\"" + colour + "\">" + title + "</circle>\n";
    } else {
      s += "<rect class=\"mark scale nan\" data-param=\"" + name + "\" x=\"" + F(x(i) - 4) + "\" y=\"" + F(mid - 8) +
           "\" width=\"8\" height=\"8\" fill=\"" + colour + "\">" + title + "</rect>\n";
    }
    if (boundary && p.name == boundary->param) {
      s += BoundaryMark(x(i), Plottable(p.scale) ? ys(p.scale) : mid - 4, *boundary);
    }
    double r = std::isfinite(p.residual) ? p.residual : 1.0;
    s += "<rect class=\"mark residual\" data-param=\"" + name + "\" x=\"" + F(x(i) - 3) + "\" y=\"" + F(yr(r) - 3) +
         "\" width=\"6\" height=\"6\" fill=\"" + colour + "\">" + title + "</rect>\n";
  }
  s += "</svg>\n";
  return s;
}

// Cell background by the reduction's verdict (pale versions of the verdict colours).
const char* CellColour(SelfVerdict v) {
  switch (v) {
    case SelfVerdict::kOk:
      return "#c8e6c9";
    case SelfVerdict::kWrongDivisor:
      return "#ffe0b2";
    case SelfVerdict::kInconsistent:
      return "#ffcdd2";
    case SelfVerdict::kMissing:
      break;
  }
  return "#eeeeee";
}

// The bucket views' heading and the legend their cells share.
std::string BucketViewHeading() {
  return "<h2>Reductions per rank and bucket</h2>\n<p>Each cell: the rank's POST_REDUCE against the "
         "sum of PRE_REDUCE over its group: effective divisor d (expected in brackets), then the rank's "
         "||PRE|| and ||POST||. &#8635; marks a bucket whose PRE_REDUCE holds the previous micro-step's "
         "reduced gradient.</p>\n";
}

// Rows ranks, columns the (micro-step, bucket, group) reductions; each cell
// the rank's effective divisor and its PRE/POST norms. `id`: the table's.
std::string BucketView(const std::vector<BucketCell>& cells, const std::string& id) {
  using Column = std::tuple<int32_t, int32_t, std::string>;
  std::map<Column, int> columns;
  std::map<int, std::map<Column, const BucketCell*>> rows;
  bool micros = false;
  for (const BucketCell& c : cells) {
    Column col{c.micro, c.bucket, c.group};
    columns.emplace(col, 0);
    rows[c.rank][col] = &c;
    micros = micros || c.micro > 0;
  }
  std::string h = "<table id=\"" + id + "\"><tr><th>rank</th>";
  for (const auto& [col, unused] : columns) {
    const auto& [micro, bucket, group] = col;
    h += "<th>" + (micros ? "micro " + std::to_string(micro) + ", " : std::string()) + "bucket " +
         std::to_string(bucket) + "<br><small>" + Esc(group) + "</small></th>";
  }
  h += "</tr>\n";
  for (const auto& [rank, row] : rows) {
    h += "<tr><th>" + std::to_string(rank) + "</th>";
    for (const auto& [col, unused] : columns) {
      auto it = row.find(col);
      if (it == row.end()) {
        h += "<td></td>";
        continue;
      }
      const BucketCell& c = *it->second;
      h += "<td class=\"cell\" data-rank=\"" + std::to_string(c.rank) + "\" data-micro=\"" + std::to_string(c.micro) +
           "\" data-bucket=\"" + std::to_string(c.bucket) + "\" style=\"background:" + CellColour(c.verdict) +
           "\" data-verdict=\"" + SelfVerdictName(c.verdict) + "\" title=\"group " + Esc(c.group) + " of " +
           std::to_string(c.group_size) + " ranks, " + std::to_string(c.params) + " parameters, " +
           std::to_string(c.compared) + " elements compared, residual " + FormatNumber(c.residual, 3) +
           "\">d <span class=\"divisor\">" + FormatNumber(c.divisor, 5) + "</span>" +
           (c.expected > 0 ? " (" + FormatNumber(c.expected, 5) + ")" : "") + (c.accumulates ? " &#8635;" : "") +
           "<br><small>PRE <span class=\"pre\">" + FormatNumber(c.pre_norm, 5) +
           "</span> &middot; POST <span class=\"post\">" + FormatNumber(c.post_norm, 5) + "</span></small></td>";
    }
    h += "</tr>\n";
  }
  return h + "</table>\n";
}

// A two-set diff: each side's view under a title naming the side, its producer and configuration (the same
// drawing as --self's; TraceSide.bucket_view is empty unless the diff computed it for this report).
std::string SideBucketViews(const Report& r) {
  if (r.a.bucket_view.empty() && r.b.bucket_view.empty()) return "";
  std::string h = BucketViewHeading();
  for (const auto& [side, name, id] :
       {std::tuple{&r.a, "A (reference)", "bucket-view-a"}, std::tuple{&r.b, "B", "bucket-view-b"}}) {
    if (side->bucket_view.empty()) continue;
    const std::string producer = side->producer.empty() ? "" : ": " + Esc(side->producer);
    h += "<h3 class=\"side\">" + std::string(name) + producer + "</h3>\n<p><code>" + Esc(side->dir) + "</code>, " +
         Esc(ConfigSummary(side->config)) + "</p>\n";
    h += BucketView(side->bucket_view, id);
  }
  return h;
}

// One point per parameter: --self's divisors worst first, a diff's scales in model (name) order,
// which reads better on a chart than worst-first.
std::vector<Point> ChartPoints(const Report& r) {
  std::vector<Point> pts;
  if (r.mode == "self") {
    for (const auto& p : r.self_params) pts.push_back({p.name, p.divisor, p.residual, SelfVerdictName(p.verdict)});
    return pts;
  }
  for (const auto& p : r.params) {
    bool none = p.metrics.basis == Basis::kNone;
    pts.push_back({p.name, none ? NAN : p.metrics.scale, none ? NAN : p.metrics.residual, VerdictName(p.verdict)});
  }
  std::stable_sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.name < b.name; });
  return pts;
}

// The page up to the chart: style, verdict, summary, the sets and their configurations, step and tolerance.
std::string PageHead(const Report& r, bool self) {
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>gradtrace-diff: " + Esc(r.verdict) +
       "</title>\n<style>\nbody{font-family:system-ui,sans-serif;margin:24px;color:#212121;background:#fff}"
       "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
       "td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f5f5f5}"
       ".v{font-weight:bold}code{font-size:12px}.summary{font-size:16px;margin:12px 0}\n</style></head><body>\n";
  h += "<h1>gradtrace-diff: <span class=\"v\" style=\"color:" + std::string(VerdictColour(r.verdict)) + "\">" +
       Esc(r.verdict) + "</span></h1>\n";
  if (!r.summary.empty()) h += "<p class=\"summary\">" + Esc(r.summary) + "</p>\n";
  h += "<table><tr><th></th><th>" + std::string(self ? "trace" : "A (reference)") + "</th>" +
       (self ? "" : "<th>B</th>") + "</tr>\n";
  h += "<tr><th>trace</th><td><code>" + Esc(r.a.dir) + "</code></td>" +
       (self ? "" : "<td><code>" + Esc(r.b.dir) + "</code></td>") + "</tr>\n";
  h += "<tr><th>configuration</th><td>" + Esc(ConfigSummary(r.a.config)) + "</td>" +
       (self ? "" : "<td>" + Esc(ConfigSummary(r.b.config)) + "</td>") + "</tr></table>\n";
  h += "<p>Step " + std::to_string(r.step) + ", phase " + Esc(r.phase) + "; " + Esc(r.tolerance.bound) + ".</p>\n";
  return h;
}

// The groups (a diff's scale factors, --self's divisors) with their explanations; "" without groups.
std::string GroupsTable(const Report& r, bool self) {
  if (r.groups.empty()) return "";
  std::string h = "<h2>" + std::string(self ? "Divisors" : "Groups") + "</h2><table><tr><th>parameters</th><th>" +
                  (self ? "divisor" : "B/A") + "</th><th>explanation</th></tr>\n";
  for (const auto& g : r.groups) {
    h += "<tr><td class=\"n\">" + std::to_string(g.count) + "</td><td class=\"n\">" +
         (g.scale ? FormatNumber(*g.scale, 5) : Esc(g.kind)) + "</td><td>" + Esc(g.explanation) + "</td></tr>\n";
  }
  return h + "</table>\n";
}

// A table's name cell: the name, or when longer than kNameBytes its cut form, unfolding to the whole name.
std::string NameCell(const std::string& name) {
  if (name.size() <= kNameBytes) return "<td><code>" + Esc(name) + "</code></td>";
  const std::string cut = "<code>" + Esc(ShortName(name, kNameBytes)) + "</code>";
  if (name.size() > kWholeNameBytes) {
    return "<td>" + cut + " <small>(a name of " + Thousands(name.size()) +
           " bytes: whole in the JSON report)</small></td>";
  }
  return "<td><details><summary>" + cut + "</summary><code>" + Esc(name) + "</code></details></td>";
}

// What the table leaves out, after it.
std::string RestLine(const ShownRows& shown) {
  if (shown.hidden == 0) return "";
  return "<p class=\"rest\">" + Esc(shown.rest) +
         " (the table shows the worst parameters and every problem; <code>--top N</code> shows more, and the JSON "
         "report, <code>--json</code>, lists every parameter).</p>\n";
}

std::string SelfParamsTable(const Report& r, const ShownRows& shown) {
  std::string h =
      "<h2>Parameters</h2><table>\n<tr><th>verdict</th><th>parameter</th><th>numel</th><th>group</th><th>size</th>"
      "<th>divisor</th><th>expected</th><th>residual</th></tr>\n";
  for (size_t i : shown.index) {
    const SelfParam& p = r.self_params[i];
    const std::string v = SelfVerdictName(p.verdict);
    h += "<tr><td class=\"v\" style=\"color:" + std::string(VerdictColour(v)) + "\">" + v + "</td>" + NameCell(p.name) +
         "<td class=\"n\">" + std::to_string(p.numel) + "</td><td>" + Esc(p.group) + "</td><td class=\"n\">" +
         std::to_string(p.group_size) + "</td><td class=\"n\">" + FormatNumber(p.divisor, 5) + "</td><td class=\"n\">" +
         FormatNumber(p.expected, 5) + "</td><td class=\"n\">" + FormatNumber(p.residual, 3) + "</td></tr>\n";
  }
  return h + "</table>\n" + RestLine(shown);
}

std::string DiffParamsTable(const Report& r, const ShownRows& shown) {
  std::string h =
      "<h2>Parameters</h2><table>\n<tr><th>verdict</th><th>parameter</th><th>numel</th><th>scale</th>"
      "<th>residual</th><th>cosine</th><th>rel. error</th><th>max abs error</th><th>note</th></tr>\n";
  for (size_t i : shown.index) {
    const ParamResult& p = r.params[i];
    const Metrics& m = p.metrics;
    bool none = m.basis == Basis::kNone;
    auto num = [&](double v, int d) { return none ? std::string("-") : FormatNumber(v, d); };
    std::string v = VerdictName(p.verdict);
    h += "<tr><td class=\"v\" style=\"color:" + std::string(VerdictColour(v)) + "\">" + v + "</td>" + NameCell(p.name) +
         "<td class=\"n\">" + std::to_string(p.numel) + "</td><td class=\"n\">" + num(m.scale, 6) +
         "</td><td class=\"n\">" + num(m.residual, 3) + "</td><td class=\"n\">" + num(m.cosine, 6) +
         "</td><td class=\"n\">" + num(m.rel_error, 3) + "</td><td class=\"n\">" + MaxAbsErrorText(m) + "</td><td>" +
         Esc(p.note) + "</td></tr>\n";
  }
  return h + "</table>\n" + RestLine(shown);
}

}  // namespace

std::string RenderHtml(const Report& r, size_t top) {
  const bool self = r.mode == "self";
  const ShownRows shown = RowsForPeople(r, top, kHtmlRows);
  std::string h = PageHead(r, self);
  std::optional<Localisation> boundary;  // where a mismatch enters the model, ringed on its parameter's mark
  for (const Group& g : r.groups) {
    if (g.localisation) boundary = g.localisation;
  }
  h += Chart(ChartPoints(r), r.tolerance.rtol, self, boundary);
  if (!r.bucket_view.empty()) h += BucketViewHeading() + BucketView(r.bucket_view, "bucket-view");
  if (!self) h += SideBucketViews(r);
  h += GroupsTable(r, self);
  h += self ? SelfParamsTable(r, shown) : DiffParamsTable(r, shown);
  if (!r.findings.empty()) {
    h += "<h2>Findings</h2><ul>\n";
    for (const auto& f : r.findings) h += "<li><b>" + Esc(f.kind) + "</b>: " + Esc(f.message) + "</li>\n";
    h += "</ul>\n";
  }
  h += "<p><small>gradtrace-diff, exit code " + std::to_string(r.ExitCode()) + "</small></p>\n</body></html>\n";
  return h;
}

}  // namespace gradtrace::diff
