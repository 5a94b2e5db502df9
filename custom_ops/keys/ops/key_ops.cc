// Ops that turn feature IDs into table keys and route keys to parameter-server shards.
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

}  // namespace tfps
