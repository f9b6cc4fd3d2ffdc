#include "load/packed_run.h"

#include <cmath>
#include <cstdio>

#include "archive.h"
#include "load/rename.h"

namespace gradtrace::diff {
namespace {

// A value from the command line or a file, quoted in a one-line message: at most 64 bytes (cut at a UTF-8
// boundary). The command line's Fail escapes control bytes.
std::string QuotedValue(const std::string& v) {
  constexpr size_t kMax = 64;
  if (v.size() <= kMax) return "'" + v + "'";
  size_t n = kMax;
  while (n > 0 && (static_cast<unsigned char>(v[n]) & 0xc0) == 0x80) --n;
  return "'" + v.substr(0, n) + "'...";
}

std::string OptionName(OptionSource source, const char* option) {
  if (source == OptionSource::kPackJson) return std::string("diff.") + option;
  return std::string("--") + (std::string(option) == "renames" ? "rename" : option);
}

}  // namespace

Status ValidateDiffOptions(const PackedDiff& d, OptionSource source) {
  auto bad = [&](const char* option, const std::string& what) {
    return Status::InvalidArgument(OptionName(source, option) + ": " + what);
  };
  const bool self = d.mode == "self";
  if (!self && d.mode != "diff") return bad("mode", "expected diff or self, got " + QuotedValue(d.mode));
  if (d.phase != "final" && d.phase != "post" && d.phase != "pre") {
    return bad("phase", "expected final, post or pre, got " + QuotedValue(d.phase));
  }
  if (self && d.phase != "final") {
    return bad("phase", "a self check (one trace set) takes no phase, got " + QuotedValue(d.phase));
  }
  if (d.step && *d.step < 0) return bad("step", "expected a step number >= 0, got " + std::to_string(*d.step));
  if (d.rtol && !(std::isfinite(*d.rtol) && *d.rtol > 0)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", *d.rtol);
    return bad("rtol", std::string("expected a positive number, got ") + got);
  }
  if (self && !d.renames.empty()) return bad("renames", "a self check (one trace set) takes no rename rule");
  for (size_t i = 0; i < d.renames.size(); ++i) {
    auto rule = ParseRenameRule(d.renames[i]);
    if (rule.ok()) continue;
    if (source == OptionSource::kCommandLine) return rule.status();  // "--rename 'RULE': why"
    return Status::InvalidArgument("diff.renames[" + std::to_string(i) + "]: " + rule.status().message());
  }
  return Status::Ok();
}

Json PackedDiffToJson(const PackedDiff& d) {
  Json j = Json::object();
  j["mode"] = d.mode;
  j["phase"] = d.phase;
  j["step"] = d.step ? Json(*d.step) : Json(nullptr);
  j["rtol"] = d.rtol ? Json(*d.rtol) : Json(nullptr);
  j["renames"] = d.renames;
  return j;
}

Expected<PackedDiff> ReadPackedDiff(const std::string& archive_path) {
  auto archive = Archive::Open(archive_path);
  if (!archive.ok()) return archive.status();
  const ArchiveMember* m = archive->Find(kPackManifest);
  if (m == nullptr) {
    return Status::InvalidArgument(archive_path + ": no " + kPackManifest +
                                   " in the archive (not made by gradtrace-pack?): name a set, as " + archive_path +
                                   ":" + kPackSetA);
  }
  auto text = archive->Read(*m);
  if (!text.ok()) return text.status();
  const std::string where = archive->NameOf(*m) + ": ";
  auto parsed = ParseJson(*text);  // the nesting and string limits of every JSON read from a file
  if (!parsed.ok()) return Status::Corruption(where + parsed.status().message());
  Json j = std::move(*parsed);
  if (!j.is_object()) return Status::Corruption(where + "not a JSON object");
  if (!j.contains("format") || j["format"] != kPackFormat) {
    return Status::InvalidArgument(where + "format is not '" + kPackFormat + "': made by another gradtrace-pack");
  }
  if (!j.contains("diff") || !j["diff"].is_object()) return Status::Corruption(where + "no \"diff\" object");
  const Json& d = j["diff"];
  PackedDiff out;
  auto bad = [&](const char* key) { return Status::Corruption(where + "diff." + key + " has the wrong type"); };
  if (!d.contains("mode") || !d["mode"].is_string()) return bad("mode");
  out.mode = d["mode"].get<std::string>();
  if (d.contains("phase")) {
    if (!d["phase"].is_string()) return bad("phase");
    out.phase = d["phase"].get<std::string>();
  }
  if (d.contains("step") && !d["step"].is_null()) {
    if (!d["step"].is_number_integer()) return bad("step");
    out.step = d["step"].get<int64_t>();
  }
  if (d.contains("rtol") && !d["rtol"].is_null()) {
    if (!d["rtol"].is_number()) return bad("rtol");
    out.rtol = d["rtol"].get<double>();
  }
  if (d.contains("renames")) {
    if (!d["renames"].is_array()) return bad("renames");
    for (const Json& r : d["renames"]) {
      if (!r.is_string()) return bad("renames");
      out.renames.push_back(r.get<std::string>());
    }
  }
  // Exactly the command line's checks: rtol 0 or -1 made every parameter a mismatch, and an unknown phase
  // became final.
  if (Status st = ValidateDiffOptions(out, OptionSource::kPackJson); !st.ok()) {
    return Status::InvalidArgument(where + st.message());
  }
  return out;
}

}  // namespace gradtrace::diff
