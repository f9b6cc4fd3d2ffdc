// The report schema's closed lists against the code that writes them (issue 21 item 3): every cause
// semantics/ can name is in report.schema.json's groups[].cause enum and nothing else is, and the same
// for the per-parameter and self verdicts. A new value is one enum value; this test says when the
// schema (and so REPORT_SCHEMA.md, which report_contract_test.py holds to the schema) lacks it.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cause.h"
#include "compare/metrics.h"
#include "dimension.h"
#include "report/report.h"

namespace gradtrace::diff {
namespace {

nlohmann::json Schema() {
  std::ifstream in(std::string(GRADTRACE_DIFF_DIR) + "/report.schema.json");
  return nlohmann::json::parse(in);
}

// The enum's values except "" (which the schema allows for groups that have no such field).
std::set<std::string> Enum(const nlohmann::json& node) {
  std::set<std::string> out;
  for (const auto& v : node.at("enum")) {
    if (v != "") out.insert(v.get<std::string>());
  }
  return out;
}

TEST(ReportEnums, CausesAreTheSchemasCauses) {
  std::set<std::string> named;
  for (int c = 0; c <= static_cast<int>(semantics::Cause::kUnexplained); ++c) {
    named.insert(semantics::CauseName(static_cast<semantics::Cause>(c)));
  }
  EXPECT_EQ(named, Enum(Schema()["$defs"]["group"]["properties"]["cause"]));
}

// Groups name a dimension by DimensionName, except kOne (the candidate "1": B matches A, no dimension) and kSpCp
// (a group follows sp when the split is over both).
TEST(ReportEnums, DimensionsAreTheSchemasDimensions) {
  std::set<std::string> named;
  for (int d = 0; d <= static_cast<int>(semantics::Dimension::kExperts); ++d) {
    const auto dim = static_cast<semantics::Dimension>(d);
    if (dim == semantics::Dimension::kOne || dim == semantics::Dimension::kSpCp || dim == semantics::Dimension::kNone) {
      continue;
    }
    named.insert(semantics::DimensionName(dim));
    EXPECT_EQ(semantics::DimensionNamed(semantics::DimensionName(dim)), dim);  // names read back
  }
  EXPECT_EQ(named, Enum(Schema()["$defs"]["group"]["properties"]["dimension"]));
  EXPECT_FALSE(semantics::DimensionNamed("sp x tp").has_value());
}

TEST(ReportEnums, VerdictsAreTheSchemasVerdicts) {
  std::set<std::string> params, self;
  for (int v = 0; v <= static_cast<int>(Verdict::kNonfinite); ++v) params.insert(VerdictName(static_cast<Verdict>(v)));
  for (int v = 0; v <= static_cast<int>(SelfVerdict::kInconsistent); ++v) {
    self.insert(SelfVerdictName(static_cast<SelfVerdict>(v)));
  }
  const nlohmann::json schema = Schema();
  EXPECT_EQ(params, Enum(schema["$defs"]["param"]["properties"]["verdict"]));
  EXPECT_EQ(self, Enum(schema["$defs"]["self_param"]["properties"]["verdict"]));
}

}  // namespace
}  // namespace gradtrace::diff
