// The quantities of a configuration a finding follows: the parallel degrees,
// gas, the pipeline's micro-batches and the predivide factor. One enum from the
// rules to the JSON writer; its names (the report's `dimension` values and the
// atoms of candidate expressions such as "sp(B)") are made here only.
#pragma once

#include <optional>
#include <string_view>

namespace gradtrace::semantics {

enum class Dimension {
  kNone,            // no dimension ("")
  kOne,             // the candidate "1": B matches A
  kSp,              // Ulysses sequence parallel
  kCp,              // context parallel
  kSpCp,            // a split over both sp and cp ("sp x cp")
  kDp,              // data parallel
  kTp,              // tensor parallel
  kReplicate,       // HSDP's replicate degree
  kWorld,           // every rank
  kGas,             // gradient-accumulation steps
  kPpMicrobatches,  // a pipeline schedule's micro-batches
  kPredivide,       // DeepSpeed's gradient_predivide_factor
  kEp,              // expert parallel
  kEdp,             // expert data parallel
  kExperts,         // the number of experts
};

// "", "one", "sp", "cp", "sp x cp", "dp", "tp", "replicate", "world", "gas",
// "pp_microbatches", "predivide", "ep", "edp", "experts".
const char* DimensionName(Dimension d);

// The Dimension named `name` (DimensionName's inverse); nullopt for any other text.
std::optional<Dimension> DimensionNamed(std::string_view name);

// sp, cp or both: the dimensions a sequence is split over.
bool IsSplit(Dimension d);

}  // namespace gradtrace::semantics
