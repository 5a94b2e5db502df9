// Op registration for exporting a table shard: to serving, its rows written straight into
// a TensorFlow tensor bundle (the variables of a SavedModel); for a vector index, its keys
// and vectors as NumPy arrays. Neither holds the shard whole in memory.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Tfps>TableExportForServing")
    .Input("table_handle: resource")
    .Input("prefix: string")
    .Output("rows: int64")
    .Output("stamp: int64")
    .Attr("hashes_key: string")
    .Attr("values_key: string")
    .Attr("value_dtype: {float, half} = DT_FLOAT")
    .Attr("min_count: int = 0")
    .Attr("slice_rows: int = 65536")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the shard's rows whose occurrence count is at least `min_count` as a tensor bundle
at `prefix` (`prefix.index`, `prefix.data-00000-of-00001`) holding two tensors: under
`hashes_key` int64 [n], the TableHash of each row's key with its top bit flipped
(ascending as int64, so stock tf.searchsorted finds a key), and under `values_key` the
rows' values [n, dim] in the same order: float32, or for `value_dtype` half the int16 bit
patterns of float16 values (bundles cannot read float16 tensors written in slices).
Written stripe after stripe as slices of the two tensors of at most `slice_rows` rows each
(memory: at most 20 bytes per row of one stripe, and one slice); a float16 export refuses values float16 rounds to inf
(magnitude 65520 and up) before writing anything. Returns n and the change clock's stamp
the export read the table at, which Tfps>TableCommitSave records to start a chain of
exports of changes (Tfps>TableExportChangesForServing).
)doc");

REGISTER_OP("Tfps>TableExportChangesForServing")
    .Input("table_handle: resource")
    .Input("prefix: string")
    .Input("follows_export_id: int64")
    .Output("rows: int64")
    .Output("removed: int64")
    .Output("written: bool")
    .Output("stamp: int64")
    .Attr("hashes_key: string")
    .Attr("values_key: string")
    .Attr("removed_key: string")
    .Attr("value_dtype: {float, half} = DT_FLOAT")
    .Attr("min_count: int = 0")
    .Attr("chain: string")
    .Attr("chunk_rows: int = 65536")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      for (int i = 0; i < 4; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes, as a tensor bundle at `prefix`, the shard's rows changed since the last export of
`chain`, which must be the export `follows_export_id`: under `hashes_key` and `values_key`
the rows inserted or changed whose occurrence count is at least `min_count`, in the order
and format of Tfps>TableExportForServing, and under `removed_key` (int64 [r], ascending)
the hashes, in the same form, of the keys removed since and of changed rows now under
`min_count`, which serving must no longer find in the exports before. Memory and time
follow the rows changed. Writes nothing and returns written=false when the chain's last
export is not `follows_export_id` or its changes cannot all be told (a restore, a clear or
dropped removal records since): the shard must then be exported whole. Returns the rows,
the removals, whether it wrote, and the stamp Tfps>TableCommitSave records.
)doc");

REGISTER_OP("Tfps>TableExportForRetrieval")
    .Input("table_handle: resource")
    .Input("prefix: string")
    .Output("rows: int64")
    .Output("removed: int64")
    .Output("kind: int64")
    .Output("stamp: int64")
    .Output("follows_export_id: int64")
    .Attr("changes_only: bool = false")
    .Attr("chain: string")
    .Attr("chunk_rows: int = 65536")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      for (int i = 0; i < 5; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the shard's keys and values as NumPy arrays: `prefix.keys.npy` (int64 [n]) and
`prefix.vectors.npy` (float32 [n, dim]), every row, or with `changes_only` the rows
inserted or changed since the last export of `chain`, with `prefix.removed_keys.npy`
(int64 [r]) the keys removed since (empty for a whole export). Whole when the chain is
unknown to the table or cannot tell every change. The chain moves on only when
Tfps>TableCommitSave records this export (with its `stamp`), so a failed export loses
nothing. Returns n, r, the kind (0: whole, 1: changes), the stamp and, for changes, the
id of the export they follow (0 for a whole export).
)doc");

}  // namespace tfps
