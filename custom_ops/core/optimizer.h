// Per-row sparse optimizer updates, applied by the parameter server under the row's lock.
// The formulas are TensorFlow's own (ResourceSparseApplyAdagradV2, ResourceApplyAdam with
// a per-row step, ApplyFtrlV2), so a pre-sized Keras embedding trained with the same
// optimizer is an exact oracle.
#ifndef TFPS_CORE_OPTIMIZER_H_
#define TFPS_CORE_OPTIMIZER_H_

#include <cmath>
#include <cstdint>

#include "custom_ops/core/hashing.h"  // TFPS_HOST_DEVICE

namespace tfps {

enum class OptimizerKind : int { kSgd = 0, kAdagrad = 1, kAdam = 2, kFtrl = 3 };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float learning_rate = 0.01f;
  float initial_accumulator = 0.1f;  // Adagrad, Ftrl
  float epsilon = 1e-7f;             // Adagrad, Adam
  float beta1 = 0.9f;                // Adam
  float beta2 = 0.999f;              // Adam
  float l1 = 0.0f;                   // Ftrl
  float l2 = 0.0f;                   // Ftrl (beta already folded in by the caller)
  float lr_power = -0.5f;            // Ftrl
};

// Float slots of dim values each: Adagrad {accumulator}, Adam {m, v}, Ftrl {accumulator,
// linear}.
TFPS_HOST_DEVICE int NumSlots(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return 0;
    case OptimizerKind::kAdagrad: return 1;
    case OptimizerKind::kAdam: return 2;
    case OptimizerKind::kFtrl: return 2;
  }
  return 0;
}

TFPS_HOST_DEVICE float InitialSlotValue(const OptimizerConfig& opt, int slot) {
  if ((opt.kind == OptimizerKind::kAdagrad || opt.kind == OptimizerKind::kFtrl) && slot == 0) {
    return opt.initial_accumulator;
  }
  return 0.0f;
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
  }
}

}  // namespace tfps

#endif  // TFPS_CORE_OPTIMIZER_H_
