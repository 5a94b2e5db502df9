// Op registrations for checkpointing a dynamic table: each shard streams its rows to its
// own file and restores from any set of such files (see kernels/row_file.h).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// Inputs at `scalars` are scalars, those at `vectors` vectors; the output is a scalar.
absl::Status ScalarResult(InferenceContext* c, std::initializer_list<int> scalars,
                          std::initializer_list<int> vectors) {
  ShapeHandle unused;
  for (int i : scalars) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  for (int i : vectors) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("Tfps>TableSave")
    .Input("table_handle: resource")
    .Input("path: string")
    .Input("shard_index: int64")
    .Input("num_shards: int64")
    .Input("save_id: int64")
    .Output("rows: int64")
    .Output("kind: int64")
    .Output("stamp: int64")
    .Attr("changes_only: bool = false")
    .Attr("snapshot: bool = false")
    .Attr("chain: string = ''")
    .Attr("max_chunk_bytes: int = 4194304")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarResult(c, {0, 1, 2, 3, 4}, {}));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Writes the table (shard `shard_index` of `num_shards`) to the row file `path`, chunk by
chunk, through a temporary file renamed into place at the end: every row, or with
`changes_only` the rows inserted or changed and the keys removed since the last save of
its chain (`chain`, by default the directory of `path`); every row when the table knows
no such save or cannot tell all changes since (a clear or restore came after it). Saves
of one chain never affect another's. With `snapshot`, a whole copy in no chain (a Keras
archive). `save_id` (shared by the shards of one save; 0 for a snapshot) goes into the
header, with, for changes, the id of the save they follow. The chain continues from this
save only once Tfps>TableCommitSave records it (after every file of the checkpoint is
written), so a failed save changes no chain. Returns the rows written, the file's kind
(0: whole shard, 1: changes) and the change clock's stamp the save read the table at.
)doc");

REGISTER_OP("Tfps>TableCommitSave")
    .Input("table_handle: resource")
    .Input("path: string")
    .Input("save_id: int64")
    .Input("stamp: int64")
    .Attr("chain: string = ''")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i < 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Records the save Tfps>TableSave wrote to `path` (its `save_id` and `stamp`) as the last save
of its chain (`chain`, by default the directory of `path`): the chain's next save of
changes holds what changed after it. The table also records that its rows equal this save
(beside the saves and restore they equalled already, unless a row changed since): a restore
of changes must follow a save or restore the rows still equal.
)doc");

REGISTER_OP("Tfps>RowFilesVisible")
    .Input("paths: string")
    .Input("writers: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &unused));
      return c->WithRank(c->input(1), 1, &unused);
    })
    .Doc(R"doc(
Fails with FailedPrecondition, naming the file and `writers[i]` (the task that wrote it),
when a file of `paths` does not exist as seen from the task this op runs on.
)doc");

REGISTER_OP("Tfps>RowFilesCheck")
    .Input("table_handle: resource")
    .Input("paths: string")
    .Input("expected_rows: int64")
    .Output("clock: int64")
    .Attr("dim: int >= 1")
    .Attr("num_slots: int >= 0")
    .Attr("optimizer: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarResult(c, {0}, {1, 2}); })
    .Doc(R"doc(
Reads every row file in `paths` whole, checking its format version, checksums, layout
(dim, slots, optimizer) and row count (`expected_rows`, -1 for any), and that a file of
changes follows the save the table was last saved or restored as. Returns the largest
clock they record.
)doc");

REGISTER_OP("Tfps>TableRestore")
    .Input("table_handle: resource")
    .Input("paths: string")
    .Input("expected_rows: int64")
    .Input("shard_index: int64")
    .Input("num_shards: int64")
    .Output("rows: int64")
    .Attr("records_verified: bool = false")
    .Attr("chain: string = ''")
    .Attr("continue_chain: bool = true")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return ScalarResult(c, {0, 3, 4}, {1, 2}); })
    .Doc(R"doc(
Restores the rows of the files in `paths` whose keys route to shard `shard_index` of
`num_shards`, in order: a whole-shard file replaces the rows of the keys its saved shard
held (when every file is whole, the table is cleared first), a file of changes removes its
removed keys and writes its rows. The clock becomes the largest saved one. The headers are
checked against the table before it is touched; run Tfps>RowFilesCheck over the same files
first to check every row; with records_verified (it has) the records' checksums are not
computed again. With `continue_chain`, the chain of the files (`chain`, by default their
directory) continues from the save restored. Returns the rows restored.
)doc");

}  // namespace tfps
