#include "custom_ops/table/kernels/table_resource.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tensorflow/core/framework/op_requires.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tfps {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;

std::string TableResource::DebugString() const {
  return absl::StrCat("tfps dynamic table (dim ", table_->dim(), ", ", table_->Size(), " keys)");
}

absl::Status OutOfMemory(const std::string& op, const std::string& table, int64_t bytes,
                         const std::string& outcome) {
  return absl::ResourceExhaustedError(absl::StrCat(
      op, " on table '", table, "': out of memory",
      bytes >= 0 ? absl::StrCat(" allocating ", bytes, " bytes") : std::string(), "; ", outcome,
      ". Cap the table (max_rows), admit fewer keys, or give this process more memory"));
}

absl::Status DiskTierFailed(const std::string& op, const std::string& table, const std::string& what,
                            const std::string& outcome) {
  return absl::InternalError(absl::StrCat(op, " on table '", table, "': its disk tier failed: ", what,
                                          "; ", outcome));
}

std::string DescribeTableConfig(const TableConfig& c) {
  static const char* kInitializers[] = {"zeros", "uniform", "truncated_normal"};
  const AdmissionConfig& a = c.admission;
  const EvictionConfig& e = c.eviction;
  return absl::StrCat(
      "dim ", c.dim, ", optimizer ", DescribeOptimizer(c.optimizer), ", initializer ",
      kInitializers[static_cast<int>(c.initializer.kind)], " (", c.initializer.a, ", ",
      c.initializer.b, "), seed ", c.seed, ", admission ", AdmissionPolicyName(a.kind),
      " (min_count ", a.min_count, ", probability ", a.probability, ", sketch_bytes ",
      a.sketch_bytes, "), eviction ",
      EvictionPolicyName(e.kind), " (ttl_steps ", e.ttl_steps, ", ttl_seconds ",
      e.ttl_seconds, ", decay ", e.decay, ", threshold ", e.threshold, ", max_rows ", e.max_rows,
      ")");
}

namespace {

absl::Status ExpectParams(const std::string& what, const std::vector<float>& params,
                          size_t expected, const std::string& meaning) {
  if (params.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Tfps>TableCreate: ", what, " takes ", expected, " parameters (", meaning, "), got ",
        params.size(), ": [", absl::StrJoin(params, ", "), "]"));
  }
  return absl::OkStatus();
}

// Admission and eviction attributes; the error names the bad value.
absl::Status ParsePolicies(OpKernelConstruction* ctx, TableConfig* config) {
  std::string admission, eviction;
  AdmissionConfig& a = config->admission;
  EvictionConfig& e = config->eviction;
  float ttl_seconds = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("admission", &admission));
  TF_RETURN_IF_ERROR(ctx->GetAttr("min_count", &a.min_count));
  TF_RETURN_IF_ERROR(ctx->GetAttr("admission_probability", &a.probability));
  TF_RETURN_IF_ERROR(ctx->GetAttr("sketch_bytes", &a.sketch_bytes));
  TF_RETURN_IF_ERROR(ctx->GetAttr("eviction", &eviction));
  TF_RETURN_IF_ERROR(ctx->GetAttr("ttl_steps", &e.ttl_steps));
  TF_RETURN_IF_ERROR(ctx->GetAttr("ttl_seconds", &ttl_seconds));
  TF_RETURN_IF_ERROR(ctx->GetAttr("decay", &e.decay));
  TF_RETURN_IF_ERROR(ctx->GetAttr("threshold", &e.threshold));
  TF_RETURN_IF_ERROR(ctx->GetAttr("max_rows", &e.max_rows));
  e.ttl_seconds = ttl_seconds;
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: ", parts...));
  };
  if (!ParseAdmissionPolicy(admission, &a.kind)) {
    return invalid("unknown admission policy '", admission, "'; known: ", AdmissionPolicyNames());
  }
  if (a.kind == AdmissionKind::kMinCount && !(a.min_count >= 1 && a.min_count <= 0xffffffffLL)) {
    return invalid("min_count must be in [1, 2^32), got ", a.min_count);
  }
  if (a.kind == AdmissionKind::kProbability && !(a.probability > 0.0f && a.probability <= 1.0f)) {
    return invalid("admission_probability must be in (0, 1], got ", a.probability);
  }
  if (a.sketch_bytes < 0 || a.sketch_bytes > (int64_t{1} << 40)) {
    return invalid("sketch_bytes must be in [0, 2^40] (0: exact counts), got ", a.sketch_bytes);
  }
  if (!ParseEvictionPolicy(eviction, &e.kind)) {
    return invalid("unknown eviction policy '", eviction, "'; known: ", EvictionPolicyNames());
  }
  if (e.kind == EvictionKind::kTtl &&
      ((e.ttl_steps > 0) == (e.ttl_seconds > 0) || e.ttl_steps < 0 || !(e.ttl_seconds >= 0) ||
       !std::isfinite(e.ttl_seconds))) {
    return invalid("ttl needs exactly one of ttl_steps > 0 or ttl_seconds > 0, got ttl_steps ",
                   e.ttl_steps, " and ttl_seconds ", e.ttl_seconds);
  }
  if (e.kind == EvictionKind::kDecayedFrequency &&
      !(e.decay > 0.0f && e.decay <= 1.0f && e.threshold > 0.0f && std::isfinite(e.threshold))) {
    return invalid("decayed_frequency needs decay in (0, 1] and a finite threshold > 0, got decay ",
                   e.decay, " and threshold ", e.threshold);
  }
  if (e.max_rows < 0) return invalid("max_rows must be >= 0 (0: no cap), got ", e.max_rows);
  // A capped table of few rows takes fewer stripes, so each still holds at least 16 rows.
  if (e.max_rows > 0) {
    int log2_stripes = 0;
    while (log2_stripes < config->log2_stripes && (e.max_rows >> (log2_stripes + 1)) >= 16) {
      ++log2_stripes;
    }
    config->log2_stripes = log2_stripes;
  }
  return absl::OkStatus();
}

// The disk tier's attributes (TierConfig).
absl::Status ParseTier(OpKernelConstruction* ctx, TableConfig* config) {
  TierConfig& tier = config->tier;
  TF_RETURN_IF_ERROR(ctx->GetAttr("tier_memory_rows", &tier.memory_rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("tier_directory", &tier.directory));
  TF_RETURN_IF_ERROR(ctx->GetAttr("tier_cache_bytes", &tier.cache_bytes));
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: ", parts...));
  };
  if (tier.memory_rows < 0) {
    return invalid("tier_memory_rows must be >= 0 (0: every row in memory), got ", tier.memory_rows);
  }
  if ((tier.memory_rows > 0) != !tier.directory.empty()) {
    return invalid("a tiered table needs both tier_memory_rows > 0 and a tier_directory, got ",
                   tier.memory_rows, " and '", tier.directory, "'");
  }
  if (tier.cache_bytes < 0) return invalid("tier_cache_bytes must be >= 0, got ", tier.cache_bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTableConfig(OpKernelConstruction* ctx, TableConfig* config) {
  int64_t dim = 0, seed = 0;
  std::string optimizer, initializer;
  std::vector<std::string> opt_param_names;
  std::vector<float> opt_params, init_params;
  float lr = 0;
  TF_RETURN_IF_ERROR(ctx->GetAttr("dim", &dim));
  TF_RETURN_IF_ERROR(ctx->GetAttr("optimizer", &optimizer));
  TF_RETURN_IF_ERROR(ctx->GetAttr("learning_rate", &lr));
  TF_RETURN_IF_ERROR(ctx->GetAttr("optimizer_params", &opt_params));
  TF_RETURN_IF_ERROR(ctx->GetAttr("optimizer_param_names", &opt_param_names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer", &initializer));
  TF_RETURN_IF_ERROR(ctx->GetAttr("initializer_params", &init_params));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("huge_pages", &config->huge_pages));
  if (dim > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: dim must be <= 65536, got ", dim));
  }
  if (!(lr > 0.0f) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Tfps>TableCreate: learning_rate must be a positive finite number, got ", lr));
  }
  config->dim = static_cast<int>(dim);
  config->seed = static_cast<uint64_t>(seed);
  OptimizerConfig& opt = config->optimizer;
  opt.learning_rate = lr;
  if (!ParseOptimizerKind(optimizer, &opt.kind)) {
    return absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: unknown optimizer '",
                                                   optimizer, "'; known: ", OptimizerNames()));
  }
  const std::string params_error = SetOptimizerParams(opt_param_names, opt_params, &opt);
  if (!params_error.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("Tfps>TableCreate: ", params_error));
  }
  InitializerConfig& init = config->initializer;
  ParseInitializerKind(initializer, &init.kind);
  switch (init.kind) {
    case InitializerKind::kZeros:
      TF_RETURN_IF_ERROR(ExpectParams("zeros", init_params, 0, "none"));
      break;
    case InitializerKind::kUniform:
      TF_RETURN_IF_ERROR(ExpectParams("uniform", init_params, 2, "low, high"));
      if (!(init_params[0] < init_params[1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Tfps>TableCreate: uniform needs low < high, got [", init_params[0], ", ",
            init_params[1], ")"));
      }
      break;
    case InitializerKind::kTruncatedNormal:
      TF_RETURN_IF_ERROR(ExpectParams("truncated_normal", init_params, 2, "mean, stddev"));
      if (!(init_params[1] > 0.0f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Tfps>TableCreate: truncated_normal stddev must be > 0, got ", init_params[1]));
      }
      break;
  }
  if (!init_params.empty()) {
    init.a = init_params[0];
    init.b = init_params[1];
  }
  TF_RETURN_IF_ERROR(ParsePolicies(ctx, config));
  return ParseTier(ctx, config);
}

absl::Status ParseResourceName(OpKernelConstruction* ctx, const std::string& prefix,
                               std::string* container, std::string* shared_name) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("container", container));
  TF_RETURN_IF_ERROR(ctx->GetAttr("shared_name", shared_name));
  if (shared_name->empty()) {
    static std::atomic<int64_t> counter{0};
    *shared_name = absl::StrCat(prefix, ctx->def().name(), "_", counter++);
  }
  return absl::OkStatus();
}

absl::Status ScalarInput(::tensorflow::OpKernelContext* ctx, const std::string& op, int index,
                         const char* name, const ::tensorflow::Tensor** out) {
  *out = &ctx->input(index);
  if (!::tensorflow::TensorShapeUtils::IsScalar((*out)->shape())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", name, " must be a scalar, got shape ",
                                                   (*out)->shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status Int64Input(::tensorflow::OpKernelContext* ctx, const std::string& op, int index,
                        const char* name, int64_t* value) {
  const ::tensorflow::Tensor* t;
  TF_RETURN_IF_ERROR(ScalarInput(ctx, op, index, name, &t));
  *value = t->scalar<int64_t>()();
  return absl::OkStatus();
}

absl::Status ParseLearningRate(const ::tensorflow::Tensor& rate, OptimizerKind optimizer, float* out) {
  if (!::tensorflow::TensorShapeUtils::IsScalar(rate.shape())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Tfps>TableApplyGradients: learning_rate must be a scalar, got shape ", rate.shape().DebugString()));
  }
  *out = rate.scalar<float>()();
  // An optimizer that divides by the rate needs it > 0; the others take any finite rate
  // (0: no change).
  const bool divides = DividesByLearningRate(optimizer);
  if (!std::isfinite(*out) || (divides && *out == 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Tfps>TableApplyGradients: learning_rate must be finite",
        divides ? absl::StrCat(" and > 0 (", OptimizerName(optimizer), " divides by it)") : "",
        " (negative: the table's own), got ", *out, "; no row was updated"));
  }
  return absl::OkStatus();
}

absl::Status CheckKeyedRows(const std::string& op, const ::tensorflow::Tensor& keys,
                            const ::tensorflow::Tensor& rows, const char* rows_name, int64_t dim) {
  if (keys.dims() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": keys must be a vector, got shape ", keys.shape().DebugString()));
  }
  if (rows.dims() != 2 || rows.dim_size(0) != keys.dim_size(0) || rows.dim_size(1) != dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", rows_name, " must have shape [num_keys, dim] = [", keys.dim_size(0), ", ", dim,
        "], got ", rows.shape().DebugString()));
  }
  return absl::OkStatus();
}

ParallelFor DeviceParallelFor(OpKernelContext* ctx) {
  ::tensorflow::thread::ThreadPool* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost_per_unit,
                const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    pool->ParallelFor(total, cost_per_unit, fn);
  };
}

}  // namespace tfps
