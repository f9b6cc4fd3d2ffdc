#include "values_from.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

namespace gradtrace {

std::string ValuesFromMismatch(const pb::BucketRecord& ref, const std::vector<std::string_view>* ref_data,
                               const pb::BucketRecord& target) {
  if (target.values_from() != 0) return "it is a reference itself (references are one deep)";
  if (ref.slices_size() != target.slices_size()) {
    return "it holds " + std::to_string(target.slices_size()) + " slices, the reference " +
           std::to_string(ref.slices_size());
  }
  for (int i = 0; i < ref.slices_size(); ++i) {
    const pb::Slice& r = ref.slices(i);
    const pb::Slice& t = target.slices(i);
    const std::string where = "slice " + std::to_string(i) + ": ";
    if (r.param_id() != t.param_id() || r.offset() != t.offset() || r.count() != t.count() || r.dtype() != t.dtype()) {
      return where + "param " + std::to_string(t.param_id()) + ", elements [" + std::to_string(t.offset()) + ", +" +
             std::to_string(t.count()) + "), dtype " + std::to_string(t.dtype()) + " against the reference's param " +
             std::to_string(r.param_id()) + ", elements [" + std::to_string(r.offset()) + ", +" +
             std::to_string(r.count()) + "), dtype " + std::to_string(r.dtype());
    }
    if (t.payload_case() != pb::Slice::kFull) return where + "not full values";
    const size_t held = ref_data != nullptr ? (*ref_data)[static_cast<size_t>(i)].size() : r.full().data().size();
    if (r.payload_case() != pb::Slice::kFull || held != 0 || r.full().shuffled()) {
      return where + "the reference's slice is not an empty full payload";
    }
  }
  return "";
}

std::string WithoutValuesFrom(const pb::BucketRecord& ref) {
  pb::BucketRecord copy = ref;
  copy.clear_values_from();
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    copy.SerializeToCodedStream(&coded);
  }
  return out;
}

}  // namespace gradtrace
