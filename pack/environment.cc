#include "environment.h"

#include <map>

namespace gradtrace::pack {

diff::Json EnvironmentJson(const std::vector<PackedSet>& sets, const std::vector<std::string>& argv,
                           int64_t created_unix) {
  using diff::Json;
  Json j = Json::object();
  j["schema_version"] = "1.0";
  j["pack"] = {{"tool", "gradtrace-pack"},
               {"version", GRADTRACE_VERSION},
               {"command_line", argv},
               {"created_unix", created_unix}};
  j["sets"] = Json::object();
  for (const PackedSet& p : sets) {
    const pb::RunInfo& run = p.set->run();
    Json s = Json::object();
    s["source"] = p.source;
    s["framework"] = run.framework();
    s["framework_version"] = run.framework_version();
    // Sorted by component: protobuf maps have no order of their own.
    Json versions = Json::object();
    for (const auto& [k, v] : std::map<std::string, std::string>(run.versions().begin(), run.versions().end())) {
      versions[k] = v;
    }
    s["versions"] = versions;
    s["producer"] = run.producer();
    s["producer_version"] = run.producer_version();
    s["run_id"] = run.run_id();
    s["host"] = run.host();  // rank 0's
    s["world"] = p.set->world();
    s["params"] = run.params_size();
    s["model_fingerprint"] = run.model_fingerprint();
    s["config"] = diff::ConfigToJson(run.config());
    Json extra = Json::object();
    for (const auto& [k, v] : std::map<std::string, std::string>(run.extra().begin(), run.extra().end())) extra[k] = v;
    s["extra"] = extra;
    j["sets"][p.name] = s;
  }
  return j;
}

}  // namespace gradtrace::pack
