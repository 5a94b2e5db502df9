// Op registrations for the histogram AUC: the update and the curve sum behind result().
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
    .Attr("buckets_per_octave: int")
    .Attr("octaves: int")
    .Attr("metric_name: string = 'AUC'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      for (int i = 1; i <= 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return c->WithRank(c->input(4), 0, &unused);
    })
    .Doc(R"doc(
Adds weighted examples (an empty weights tensor weighs each example 1) to an AUC histogram
variable of shape [num_buckets, 2] (float64), num_buckets = 2 * octaves * buckets_per_octave:
column 0 gets weight * label, column 1 weight * (1 - label). Buckets are log-linear in the
distance d = min(p, 1 - p) to the nearer end: each octave of d ([1/4, 1/2), [1/8, 1/4), ...,
[2^-(octaves + 1), 2^-octaves)) holds buckets_per_octave equal buckets, smaller d joining the
end bucket; predictions below 1/2 fill buckets [0, num_buckets / 2) in ascending order and
the rest mirror them in [num_buckets / 2, num_buckets). Validates every input first and
changes nothing if any prediction or label is outside [0, 1] or NaN, or a weight is
negative or not finite.
A histogram split over several variables (a partitioned variable) is updated with one op
per part: the part holds buckets [first_bucket, first_bucket + rows) of num_buckets, and
examples in other buckets are left to the other parts.
)doc");

REGISTER_OP("Tfps>HistogramCurveSum")
    .Input("histogram: resource")
    .Input("positives_above: double")
    .Input("negatives_above: double")
    .Output("partial_sum: double")
    .Output("positives_through: double")
    .Output("negatives_through: double")
    .Attr("curve: {'ROC', 'PR'}")
    .SetIsStateful()  // reads a variable
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      for (int i = 0; i <= 2; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
      for (int i = 0; i <= 2; ++i) c->set_output(i, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
One part's share of the area under a histogram's curve, walking buckets from the highest
prediction down, given the positive and negative weight in all higher buckets (in parts
of a partitioned histogram that hold higher buckets). ROC: sum over buckets of
negatives * (positives above + positives / 2), to be divided by P * N. PR: sum over
buckets of positives * precision at that bucket's threshold, to be divided by P. Also
returns the weights above plus this part's, for the next lower part. Runs where the
variable lives, so only three scalars leave a parameter server.
)doc");

REGISTER_OP("Tfps>GroupAucUpdate")
    .Input("table: resource")
    .Input("groups: int64")
    .Input("labels: float")
    .Input("predictions: float")
    .Input("weights: float")
    .Attr("buckets_per_octave: int")
    .Attr("octaves: int")
    .Attr("metric_name: string = 'GroupAUC'")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      for (int i = 1; i <= 4; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Adds weighted examples (an empty weights tensor weighs each example 1) to per-group AUC
histograms, each the row of a group key in a dynamic table of dim 2 * num_buckets (SGD at
learning rate 1), laid out [bucket][positive weight, negative weight], with the buckets of
Tfps>HistogramAucUpdate. Validates every input first and changes nothing if any prediction
or label is outside [0, 1] or NaN, or a weight is negative or not finite. Each group's row
is added to atomically, so concurrent updates lose nothing.
)doc");

REGISTER_OP("Tfps>GroupAucSum")
    .Input("table: resource")
    .Output("weighted_auc: double")
    .Output("impressions: double")
    .Attr("num_buckets: int")
    .Attr("metric_name: string = 'GroupAUC'")
    .SetIsStateful()  // reads a table
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
Over the groups of a Tfps>GroupAucUpdate table that have both positive and negative
weight, the sum of each group's ROC AUC (pairs in the same bucket counting one half) times
its weight, and the sum of those weights. Runs where the table lives, a chunk of rows at a
time, so only two scalars leave a parameter server.
)doc");

}  // namespace tfps
