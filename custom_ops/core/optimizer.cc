#include "custom_ops/core/optimizer.h"

#include <cmath>
#include <sstream>

#include "custom_ops/core/registry.h"

namespace tfps {
namespace {

struct ParamEntry {
  const char* name;
  float OptimizerConfig::*field;
  ParamRange range;
};

#define TFPS_OPTIMIZER_ENTRY(k, name, slots, keeps_step, params) {OptimizerKind::k, name},
constexpr NamedKind<OptimizerKind> kOptimizers[] = {TFPS_OPTIMIZERS(TFPS_OPTIMIZER_ENTRY)};
#undef TFPS_OPTIMIZER_ENTRY

#define TFPS_OPTIMIZER_PARAM_LIST(k, name, slots, keeps_step, params) params,
constexpr const char* kParamLists[] = {TFPS_OPTIMIZERS(TFPS_OPTIMIZER_PARAM_LIST)};  // by kind
#undef TFPS_OPTIMIZER_PARAM_LIST

#define TFPS_PARAM_ENTRY(field, default_value, range) \
  {#field, &OptimizerConfig::field, ParamRange::range},
constexpr ParamEntry kParamEntries[] = {TFPS_OPTIMIZER_PARAMS(TFPS_PARAM_ENTRY)};
#undef TFPS_PARAM_ENTRY

const ParamEntry* FindParam(const std::string& name) {
  for (const ParamEntry& p : kParamEntries) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

bool InRange(float value, ParamRange range) {
  if (!std::isfinite(value)) return false;
  switch (range) {
    case ParamRange::kPositive: return value > 0.0f;
    case ParamRange::kNonNegative: return value >= 0.0f;
    case ParamRange::kNonPositive: return value <= 0.0f;
    case ParamRange::kFraction: return value >= 0.0f && value < 1.0f;
  }
  return false;
}

const char* DescribeRange(ParamRange range) {
  switch (range) {
    case ParamRange::kPositive: return "a finite number > 0";
    case ParamRange::kNonNegative: return "a finite number >= 0";
    case ParamRange::kNonPositive: return "a finite number <= 0";
    case ParamRange::kFraction: return "in [0, 1)";
  }
  return "";
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

}  // namespace

const char* OptimizerName(OptimizerKind kind) { return NameOf(kOptimizers, kind); }

bool ParseOptimizerKind(const std::string& name, OptimizerKind* kind) {
  return ParseName(kOptimizers, name, kind);
}

std::string OptimizerNames() { return JoinNames(kOptimizers); }

std::vector<std::string> OptimizerParamNames(OptimizerKind kind) {
  std::vector<std::string> names;
  const int index = static_cast<int>(kind);
  if (index < 0 || index >= kNumOptimizers) return names;
  std::stringstream list(kParamLists[index]);
  for (std::string name; std::getline(list, name, ',');) names.push_back(name);
  return names;
}

std::string SetOptimizerParams(const std::vector<std::string>& names,
                               const std::vector<float>& values, OptimizerConfig* config) {
  const std::vector<std::string> expected = OptimizerParamNames(config->kind);
  const std::string optimizer = OptimizerName(config->kind);
  const std::vector<std::string>& given = names.empty() ? expected : names;
  if (given.size() != values.size()) {
    std::ostringstream out;
    out << optimizer << " got " << values.size() << " hyperparameter values for "
        << given.size() << " names (" << Join(given) << ")";
    return out.str();
  }
  std::vector<bool> seen(expected.size(), false);
  for (size_t i = 0; i < given.size(); ++i) {
    size_t j = 0;
    while (j < expected.size() && expected[j] != given[i]) ++j;
    if (j == expected.size()) {
      return optimizer + " has no hyperparameter '" + given[i] + "'; it takes: " +
             (expected.empty() ? std::string("none") : Join(expected));
    }
    if (seen[j]) return optimizer + " got hyperparameter '" + given[i] + "' twice";
    seen[j] = true;
    const ParamEntry* param = FindParam(given[i]);
    if (!InRange(values[i], param->range)) {
      std::ostringstream out;
      out << optimizer << " " << given[i] << " must be " << DescribeRange(param->range)
          << ", got " << values[i];
      return out.str();
    }
    config->*(param->field) = values[i];
  }
  for (size_t j = 0; j < expected.size(); ++j) {
    if (!seen[j]) {
      return optimizer + " needs hyperparameter '" + expected[j] + "' (it takes: " +
             Join(expected) + ")";
    }
  }
  // Both divide by a root of a slot that stays 0 while a row's gradients are 0 (a padded
  // or masked ID's), so epsilon 0 would write 0 / 0 into the row.
  if ((config->kind == OptimizerKind::kAdam || config->kind == OptimizerKind::kRmsprop) &&
      !(config->epsilon > 0.0f)) {
    std::ostringstream out;
    out << optimizer << " epsilon must be > 0 (a row whose gradients are all 0 would "
        << "become NaN), got " << config->epsilon;
    return out.str();
  }
  return "";
}

std::string DescribeOptimizer(const OptimizerConfig& config) {
  std::ostringstream out;
  out << OptimizerName(config.kind) << " (learning_rate " << config.learning_rate;
  for (const std::string& name : OptimizerParamNames(config.kind)) {
    out << ", " << name << " " << config.*(FindParam(name)->field);
  }
  out << ")";
  return out.str();
}

}  // namespace tfps
