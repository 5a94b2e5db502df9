// Ops that turn feature IDs into table keys, number a batch's distinct keys and route keys
// to parameter-server shards.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

REGISTER_OP("Tfps>NamespacedKeys")
    .Input("ids: Tid")
    .Input("namespaces: int64")
    .Output("keys: int64")
    .Attr("Tid: {int32, int64, uint64}")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
64-bit table keys of feature IDs, each in its namespace (0: the ID itself).
namespaces: a scalar, or one namespace per ID (same shape as ids).
)doc");

REGISTER_OP("Tfps>ShardOf")
    .Input("keys: int64")
    .Output("shards: int32")
    .Attr("num_shards: int >= 1")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc("The parameter-server shard of each key, by a well-mixed hash of the key.");

REGISTER_OP("Tfps>UniqueKeys")
    .Input("keys: int64")
    .Output("unique: int64")
    .Output("index: int64")
    .Output("counts: int64")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, keys);
      c->set_output(2, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
tf.unique_with_counts of int64 keys [m] with int64 outputs: the distinct keys in order of
first occurrence, each key's position among them, and how often each occurs.
)doc");

REGISTER_OP("Tfps>SumByKey")
    .Input("keys: int64")
    .Input("values: float")
    .Output("unique: int64")
    .Output("sums: float")
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle keys, values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &values));
      ::tensorflow::shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(values, 0), &rows));
      c->set_output(0, c->Vector(c->UnknownDim()));
      c->set_output(1, c->Matrix(c->UnknownDim(), c->Dim(values, 1)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The rows of values [m, d] summed per key of keys [m]: the distinct keys in order of first
occurrence and their sums [n, d], each added up in the order its rows come (the result
of tf.unique and tf.math.unsorted_segment_sum, bit for bit).
)doc");

}  // namespace tfps
