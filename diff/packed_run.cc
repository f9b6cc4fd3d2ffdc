#include "packed_run.h"

#include "archive.h"

namespace gradtrace::diff {

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
  if (out.mode != "diff" && out.mode != "self") return Status::Corruption(where + "diff.mode is not diff or self");
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
  return out;
}

}  // namespace gradtrace::diff
