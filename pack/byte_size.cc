#include "byte_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace gradtrace::pack {

Expected<uint64_t> ParseByteSize(const std::string& text) {
  auto bad = [&] {
    return Status::InvalidArgument("--limit: expected a size such as 25M, 500k or 25MiB, got '" + text + "'");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  char* end = nullptr;
  const std::string number = text.substr(0, i);
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return bad();
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "k" || unit == "kb") scale = 1e3;
  if (unit == "m" || unit == "mb") scale = 1e6;
  if (unit == "g" || unit == "gb") scale = 1e9;
  if (unit == "kib") scale = 1024.0;
  if (unit == "mib") scale = 1024.0 * 1024;
  if (unit == "gib") scale = 1024.0 * 1024 * 1024;
  if (scale == 0) return bad();
  const double bytes = std::floor(v * scale);
  if (!(bytes >= 1) || bytes > 1e15) return bad();
  return static_cast<uint64_t>(bytes);
}

}  // namespace gradtrace::pack
