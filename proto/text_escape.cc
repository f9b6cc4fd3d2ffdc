#include "text_escape.h"

#include <algorithm>
#include <cstdio>

namespace gradtrace {
namespace {

// Appends the visible escape of a control at s[*i] and returns true, advancing
// *i past a two-byte C1; false (nothing appended) for any other byte.
bool AppendControl(std::string_view s, size_t* i, std::string* out) {
  const auto c = static_cast<unsigned char>(s[*i]);
  char buf[8];
  if (c < 0x20 || c == 0x7f) {
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
  } else if (c == 0xc2 && *i + 1 < s.size() && static_cast<unsigned char>(s[*i + 1]) >= 0x80 &&
             static_cast<unsigned char>(s[*i + 1]) <= 0x9f) {
    std::snprintf(buf, sizeof buf, "\\u00%02x", static_cast<unsigned char>(s[++*i]));
  } else {
    return false;
  }
  *out += buf;
  return true;
}

size_t LongestBacktickRun(std::string_view s) {
  size_t longest = 0, run = 0;
  for (char c : s) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

}  // namespace

std::string TerminalSafe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (!AppendControl(s, &i, &out)) out += s[i];
  }
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string MarkdownText(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (AppendControl(s, &i, &out)) continue;
    const char c = s[i];
    if (c == '&') {
      out += "&amp;";
    } else if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '@') {
      out += "&#64;&#8203;";
    } else if (c == '#') {
      out += "&#35;&#8203;";
    } else if (std::string_view("\\`*_[]~|").find(c) != std::string_view::npos) {
      out += '\\';
      out += c;
    } else {
      out += c;
    }
  }
  return out;
}

std::string MarkdownCode(std::string_view s, MarkdownPlace place) {
  const std::string text = TerminalSafe(s);
  if (text.empty()) return "` `";  // "``" would open a span, not hold an empty one
  const std::string fence(LongestBacktickRun(text) + 1, '`');
  // CommonMark strips one space from each end when both have one (and the span is not all spaces).
  const bool all_spaces = text.find_first_not_of(' ') == std::string::npos;
  const bool pad =
      text.front() == '`' || text.back() == '`' || (!all_spaces && text.front() == ' ' && text.back() == ' ');
  std::string out = fence + (pad ? " " : "");
  for (char c : text) {
    if (c == '|' && place == MarkdownPlace::kTableCell) out += '\\';
    out += c;
  }
  return out + (pad ? " " : "") + fence;
}

std::string MarkdownCodeBlock(std::string_view info, std::string_view body) {
  const std::string fence(std::max<size_t>(3, LongestBacktickRun(body) + 1), '`');
  std::string out = fence + std::string(info) + "\n" + std::string(body);
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out + fence + "\n";
}

}  // namespace gradtrace
