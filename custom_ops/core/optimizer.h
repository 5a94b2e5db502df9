// Per-row sparse optimizer updates, applied by the parameter server under the row's lock.
// The formulas are TensorFlow's own (ResourceSparseApplyAdagradV2, ResourceApplyAdam with
// a per-row step, ApplyFtrlV2, ResourceSparseApplyRMSProp), so a pre-sized Keras embedding
// trained with the same optimizer is an exact oracle.
//
// TFPS_OPTIMIZERS is the one list of optimizers: everything that parses, describes, sizes or
// checkpoints an optimizer reads it, and tfps/table/optimizers.py is checked against it by a test.
// Adding one is a line there, a case in ApplyRow (and in InitialSlotValue when a slot does
// not start at 0, DividesByLearningRate when it divides by the rate), and a Python class
// (docs/extending.md).
#ifndef TFPS_CORE_OPTIMIZER_H_
#define TFPS_CORE_OPTIMIZER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "custom_ops/core/hashing.h"  // TFPS_HOST_DEVICE

namespace tfps {

// X(enum, name, float slots per row (dim floats each), keeps a per-row step,
//   hyperparameters after learning_rate as OptimizerConfig fields, comma-separated).
// The enum's values are stored in checkpoints: append, never reorder. The hyperparameters'
// order is the one graphs that pass them without names (optimizer_params alone) use.
#define TFPS_OPTIMIZERS(X)                                               \
  X(kSgd, "sgd", 0, false, "")                                           \
  X(kAdagrad, "adagrad", 1, false, "initial_accumulator,epsilon")        \
  X(kAdam, "adam", 2, true, "beta1,beta2,epsilon")                       \
  X(kFtrl, "ftrl", 2, false, "initial_accumulator,l1,l2,lr_power")       \
  X(kRmsprop, "rmsprop", 2, false, "rho,momentum,epsilon")

// The values a hyperparameter may take; every one must also be finite.
enum class ParamRange : int { kPositive, kNonNegative, kNonPositive, kFraction /* [0, 1) */ };

// X(OptimizerConfig field, default, ParamRange): every hyperparameter any optimizer takes.
#define TFPS_OPTIMIZER_PARAMS(X)                 \
  X(initial_accumulator, 0.1f, kPositive)        \
  X(epsilon, 1e-7f, kNonNegative)                \
  X(beta1, 0.9f, kFraction)                      \
  X(beta2, 0.999f, kFraction)                    \
  X(l1, 0.0f, kNonNegative)                      \
  X(l2, 0.0f, kNonNegative) /* beta folded in */ \
  X(lr_power, -0.5f, kNonPositive)               \
  X(rho, 0.9f, kFraction)                        \
  X(momentum, 0.0f, kFraction)

#define TFPS_OPTIMIZER_ENUM(kind, name, slots, keeps_step, params) kind,
enum class OptimizerKind : int { TFPS_OPTIMIZERS(TFPS_OPTIMIZER_ENUM) };
#undef TFPS_OPTIMIZER_ENUM

#define TFPS_OPTIMIZER_COUNT(kind, name, slots, keeps_step, params) +1
constexpr int kNumOptimizers = 0 TFPS_OPTIMIZERS(TFPS_OPTIMIZER_COUNT);
#undef TFPS_OPTIMIZER_COUNT

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
#define TFPS_OPTIMIZER_FIELD(field, default_value, range) float field = default_value;
  TFPS_OPTIMIZER_PARAMS(TFPS_OPTIMIZER_FIELD)
#undef TFPS_OPTIMIZER_FIELD
};

TFPS_HOST_DEVICE int NumSlots(OptimizerKind kind) {
#define TFPS_OPTIMIZER_SLOTS(k, name, slots, keeps_step, params) \
  case OptimizerKind::k: return slots;
  switch (kind) { TFPS_OPTIMIZERS(TFPS_OPTIMIZER_SLOTS) }
#undef TFPS_OPTIMIZER_SLOTS
  return 0;
}

// Whether a row counts its own updates (Adam's bias correction of rarely seen rows).
TFPS_HOST_DEVICE bool KeepsRowStep(OptimizerKind kind) {
#define TFPS_OPTIMIZER_STEP(k, name, slots, keeps_step, params) \
  case OptimizerKind::k: return keeps_step;
  switch (kind) { TFPS_OPTIMIZERS(TFPS_OPTIMIZER_STEP) }
#undef TFPS_OPTIMIZER_STEP
  return false;
}

// Slots start at 0 except an accumulator that starts at initial_accumulator.
TFPS_HOST_DEVICE float InitialSlotValue(const OptimizerConfig& opt, int slot) {
  if ((opt.kind == OptimizerKind::kAdagrad || opt.kind == OptimizerKind::kFtrl) && slot == 0) {
    return opt.initial_accumulator;
  }
  return 0.0f;
}

// Whether the update divides by the learning rate, so that an apply at rate 0 is refused.
TFPS_HOST_DEVICE bool DividesByLearningRate(OptimizerKind kind) {
  return kind == OptimizerKind::kFtrl;
}

// Updates one row in place. `value` and `slots` hold dim floats each (slots: NumSlots
// blocks back to back); `step` is the row's own update count after this update (Adam).
TFPS_HOST_DEVICE void ApplyRow(const OptimizerConfig& opt, int dim, const float* grad,
                               float* value, float* slots, uint32_t step) {
  const float lr = opt.learning_rate;
  switch (opt.kind) {
    case OptimizerKind::kSgd:
      for (int i = 0; i < dim; ++i) value[i] -= lr * grad[i];
      return;
    case OptimizerKind::kAdagrad: {
      float* acc = slots;
      for (int i = 0; i < dim; ++i) {
        const float g = grad[i];
        acc[i] += g * g;
        value[i] -= lr * g / (sqrtf(acc[i]) + opt.epsilon);
      }
      return;
    }
    case OptimizerKind::kAdam: {
      float* m = slots;
      float* v = slots + dim;
      const double t = static_cast<double>(step);
      const float lr_t = static_cast<float>(lr * sqrt(1.0 - pow(static_cast<double>(opt.beta2), t)) /
                                            (1.0 - pow(static_cast<double>(opt.beta1), t)));
      for (int i = 0; i < dim; ++i) {
        const float g = grad[i];
        m[i] += (g - m[i]) * (1.0f - opt.beta1);
        v[i] += (g * g - v[i]) * (1.0f - opt.beta2);
        value[i] -= lr_t * m[i] / (sqrtf(v[i]) + opt.epsilon);
      }
      return;
    }
    case OptimizerKind::kFtrl: {
      float* acc = slots;
      float* linear = slots + dim;
      const bool sqrt_power = opt.lr_power == -0.5f;
      for (int i = 0; i < dim; ++i) {
        const float g = grad[i];
        const float new_acc = acc[i] + g * g;
        const float new_pow = sqrt_power ? sqrtf(new_acc) : powf(new_acc, -opt.lr_power);
        const float old_pow = sqrt_power ? sqrtf(acc[i]) : powf(acc[i], -opt.lr_power);
        linear[i] += g - (new_pow - old_pow) / lr * value[i];
        const float quadratic = new_pow / lr + 2.0f * opt.l2;
        const float l = linear[i];
        value[i] = fabsf(l) > opt.l1 ? ((l > 0 ? opt.l1 : -opt.l1) - l) / quadratic : 0.0f;
        acc[i] = new_acc;
      }
      return;
    }
    case OptimizerKind::kRmsprop: {
      float* ms = slots;
      float* mom = slots + dim;
      for (int i = 0; i < dim; ++i) {
        const float g = grad[i];
        ms[i] = ms[i] * opt.rho + g * g * (1.0f - opt.rho);
        mom[i] = mom[i] * opt.momentum + lr * g / sqrtf(ms[i] + opt.epsilon);
        value[i] -= mom[i];
      }
      return;
    }
  }
}

// Host-side lookups in the registry (optimizer.cc).
const char* OptimizerName(OptimizerKind kind);
// False if the name is not in TFPS_OPTIMIZERS.
bool ParseOptimizerKind(const std::string& name, OptimizerKind* kind);
// "sgd, adagrad, ..." for error messages.
std::string OptimizerNames();
std::vector<std::string> OptimizerParamNames(OptimizerKind kind);
// Sets config's hyperparameters of config->kind from names[i] = values[i] (names empty:
// values in OptimizerParamNames' order). The error names an unknown, missing, repeated or
// out-of-range hyperparameter; empty on success.
std::string SetOptimizerParams(const std::vector<std::string>& names,
                               const std::vector<float>& values, OptimizerConfig* config);
// "adagrad (learning_rate 0.1, initial_accumulator 0.1, epsilon 1e-07)".
std::string DescribeOptimizer(const OptimizerConfig& config);

}  // namespace tfps

#endif  // TFPS_CORE_OPTIMIZER_H_
