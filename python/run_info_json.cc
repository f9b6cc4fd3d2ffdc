#include "run_info_json.h"

#include <google/protobuf/util/json_util.h>
#include <pybind11/pybind11.h>

namespace gradtrace {

pb::RunInfo RunInfoFromJson(const std::string& json) {
  pb::RunInfo run;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt key is an error, not a silent default
  const auto st = google::protobuf::util::JsonStringToMessage(json, &run, options);
  if (!st.ok()) throw pybind11::value_error("invalid run_info: " + std::string(st.message()));
  return run;
}

}  // namespace gradtrace
