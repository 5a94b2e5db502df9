// Op registration for the histogram AUC update.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("Tfps>HistogramAucUpdate")
    .Input("histogram: resource")
    .Input("labels: float")
    .Input("predictions: float")
    .Input("weights: float")
    .Input("first_bucket: int64")
    .Attr("num_buckets: int >= 2")
    .Attr("metric_name: string = 'AUC'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      for (int i = 1; i <= 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return c->WithRank(c->input(4), 0, &unused);
    })
    .Doc(R"doc(
Adds weighted examples (an empty weights tensor weighs each example 1) to an AUC histogram variable of shape [num_buckets, 2] (float64):
column 0 gets weight * label, column 1 weight * (1 - label), in bucket
min(floor(prediction * num_buckets), num_buckets - 1). Validates every input first and
changes nothing if any prediction or label is outside [0, 1] or NaN, or a weight is
negative or not finite.
A histogram split over several variables (a partitioned variable) is updated with one op
per part: the part holds buckets [first_bucket, first_bucket + rows) of num_buckets, and
examples in other buckets are left to the other parts.
)doc");

}  // namespace tfps
