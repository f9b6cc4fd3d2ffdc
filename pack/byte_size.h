// Sizes on the command line: "25M", "25MB", "500k", "1.5G", "25MiB", "4096".
// Decimal units (k, M, G: 10^3, 10^6, 10^9) are how bug trackers state their
// attachment limits; KiB, MiB and GiB are binary.
#pragma once

#include <cstdint>
#include <string>

#include "status.h"

namespace gradtrace::pack {

Expected<uint64_t> ParseByteSize(const std::string& text);

}  // namespace gradtrace::pack
