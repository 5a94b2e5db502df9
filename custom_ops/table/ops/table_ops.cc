// Op registrations for the dynamic table. Every op but create takes the table's resource
// handle; dim and num_slots attributes give static shapes and are checked against the
// table at run time.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

absl::Status ScalarInput(InferenceContext* c, int index) {
  ShapeHandle unused;
  return c->WithRank(c->input(index), 0, &unused);
}

int64_t DimAttr(InferenceContext* c) {
  int64_t dim = 0;
  if (!c->GetAttr("dim", &dim).ok()) return InferenceContext::kUnknownDim;
  return dim;
}

// keys of any shape -> keys.shape + [dim].
absl::Status KeysByDim(InferenceContext* c, ShapeHandle keys, ShapeHandle* out) {
  return c->Concatenate(keys, c->Vector(DimAttr(c)), out);
}

// keys [n], rows [n, dim].
absl::Status KeyedRows(InferenceContext* c, int keys_index, int rows_index) {
  ShapeHandle keys, rows;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(keys_index), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(rows_index), 2, &rows));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(rows, 0), &unused));
  return c->Merge(c->Dim(rows, 1), c->MakeDim(DimAttr(c)), &unused);
}

// find / find_or_insert: values keys.shape + [dim] (and the exists mask, if the op has it).
absl::Status LookupShape(InferenceContext* c) {
  ShapeHandle values;
  TF_RETURN_IF_ERROR(ScalarInput(c, 0));
  TF_RETURN_IF_ERROR(KeysByDim(c, c->input(1), &values));
  c->set_output(0, values);
  if (c->num_outputs() > 1) c->set_output(1, c->input(1));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfps>TableCreate")
    .Output("table_handle: resource")
    .Attr("dim: int >= 1")
    .Attr("optimizer: string")
    .Attr("learning_rate: float")
    .Attr("optimizer_params: list(float) = []")
    .Attr("optimizer_param_names: list(string) = []")
    .Attr("initializer: {'zeros', 'uniform', 'truncated_normal'}")
    .Attr("initializer_params: list(float) = []")
    .Attr("seed: int = 0")
    .Attr("huge_pages: bool = false")
    .Attr("admission: string = 'none'")
    .Attr("min_count: int = 1")
    .Attr("admission_probability: float = 1.0")
    .Attr("sketch_bytes: int = 0")
    .Attr("eviction: string = 'none'")
    .Attr("ttl_steps: int = 0")
    .Attr("ttl_seconds: float = 0.0")
    .Attr("decay: float = 1.0")
    .Attr("threshold: float = 0.0")
    .Attr("max_rows: int = 0")
    .Attr("tier_memory_rows: int = 0")
    .Attr("tier_directory: string = ''")
    .Attr("tier_cache_bytes: int = 33554432")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc(R"doc(
Creates (or finds, by shared_name) a dynamic embedding table.
optimizer: a name in custom_ops/core/optimizer.h's TFPS_OPTIMIZERS.
optimizer_params: the optimizer's hyperparameters after learning_rate, each named by the
  same index of optimizer_param_names (empty: in the registry's order).
initializer_params: uniform [low, high]; truncated_normal [mean, stddev]; zeros [].
admission: a name in custom_ops/core/policies.h's TFPS_ADMISSION_POLICIES: min_count (a key
  gets a row after min_count occurrences) or probability (each occurrence admits it with
  admission_probability); absent keys are counted in a sketch of sketch_bytes, or exactly
  when it is 0.
eviction: a name in TFPS_EVICTION_POLICIES: ttl (rows unseen for ttl_steps of the clock, or
  ttl_seconds, go), decayed_frequency (rows whose score, decayed by `decay` per step, is
  under `threshold` go), lru or lfu (the order max_rows evicts in; ttl evicts as lru,
  decayed_frequency by score).
max_rows: this table's cap on rows (0: none).
)doc");

REGISTER_OP("Tfps>TableFind")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Output("values: float")
    .Output("exists: bool")
    .Attr("Tkey: {int64, uint64}")
    .Attr("dim: int >= 1")
    .SetShapeFn(LookupShape);

// occurrences: how many times each key occurred in the data (its count grows by that), or
// empty: once each. admitted: whether the key has a row after the call (false only for
// keys an admission policy still counts; they read their initial value).
REGISTER_OP("Tfps>TableFindOrInsert")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("occurrences: int64")
    .Output("values: float")
    .Output("admitted: bool")
    .Attr("Tkey: {int64, uint64}")
    .Attr("dim: int >= 1")
    .SetShapeFn(LookupShape);

// learning_rate: the optimizer's learning rate for this call (a schedule's value at this
// step, or a variable's); negative: the one the table was created with.
REGISTER_OP("Tfps>TableApplyGradients")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("gradients: float")
    .Input("step: int64")
    .Input("learning_rate: float")
    .Attr("Tkey: {int64, uint64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      TF_RETURN_IF_ERROR(ScalarInput(c, 3));
      TF_RETURN_IF_ERROR(ScalarInput(c, 4));
      return KeyedRows(c, 1, 2);
    });

REGISTER_OP("Tfps>TableInsert")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("values: float")
    .Attr("Tkey: {int64, uint64}")
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      return KeyedRows(c, 1, 2);
    });

REGISTER_OP("Tfps>TableRemove")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Output("removed: int64")
    .Attr("Tkey: {int64, uint64}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("Tfps>TableSize")
    .Input("table_handle: resource")
    .Output("size: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

// The table's clock: how many ApplyGradients calls it has run (the step a negative step
// records). Checkpoints carry it in their files; other copies of a table use these.
REGISTER_OP("Tfps>TableClock")
    .Input("table_handle: resource")
    .Output("clock: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

// [rows, memory bytes (index, row blocks, admission counts, a tiered table's payloads
// and its store's caches), row block bytes, clock, admitted, pending, rejected, evicted,
// skipped steps, rows in memory, payload memory bytes, disk bytes, lookup hits, lookup
// misses, payloads read from disk, payloads demoted]: one small tensor, so statistics of a
// table on a parameter server cost one round trip.
REGISTER_OP("Tfps>TableStats")
    .Input("table_handle: resource")
    .Output("stats: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      c->set_output(0, c->Vector(16));
      return absl::OkStatus();
    });

// Counts an optimizer step that included the table and was skipped for a non-finite
// gradient (its statistic skipped_steps); the rows are left as they are.
REGISTER_OP("Tfps>TableCountSkippedStep")
    .Input("table_handle: resource")
    .SetShapeFn([](InferenceContext* c) { return ScalarInput(c, 0); });

// Sweeps the whole table now, removing the rows its eviction policy says go; returns how
// many went.
REGISTER_OP("Tfps>TableEvict")
    .Input("table_handle: resource")
    .Output("evicted: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("Tfps>TableSetClock")
    .Input("table_handle: resource")
    .Input("clock: int64")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      return ScalarInput(c, 1);
    });

REGISTER_OP("Tfps>TableClear")
    .Input("table_handle: resource")
    .Attr("keep_memory: bool = false")
    .SetShapeFn([](InferenceContext* c) { return ScalarInput(c, 0); });

REGISTER_OP("Tfps>TableExport")
    .Input("table_handle: resource")
    .Input("cursor: int64")
    .Input("max_rows: int64")
    .Output("keys: int64")
    .Output("values: float")
    .Output("slots: float")
    .Output("metadata: int64")
    .Output("next_cursor: int64")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      TF_RETURN_IF_ERROR(ScalarInput(c, 1));
      TF_RETURN_IF_ERROR(ScalarInput(c, 2));
      int64_t num_slots = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_slots", &num_slots));
      const DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, DimAttr(c)));
      c->set_output(2, c->MakeShape({n, c->MakeDim(num_slots), c->MakeDim(DimAttr(c))}));
      c->set_output(3, c->Matrix(n, 4));
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("Tfps>TableImport")
    .Input("table_handle: resource")
    .Input("keys: int64")
    .Input("values: float")
    .Input("slots: float")
    .Input("metadata: int64")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarInput(c, 0));
      TF_RETURN_IF_ERROR(KeyedRows(c, 1, 2));
      ShapeHandle slots, metadata;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 3, &slots));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &metadata));
      return absl::OkStatus();
    });

}  // namespace tfps
