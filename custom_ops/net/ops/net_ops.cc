// Ops about the network between a cluster's tasks.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfps {

REGISTER_OP("Tfps>CheckReachable")
    .Input("addresses: string")
    .Attr("timeout_seconds: float")
    .Attr("what: string")
    .SetIsStateful()  // never folded, never skipped: it is run for its check
    .SetShapeFn([](::tensorflow::shape_inference::InferenceContext* c) {
      ::tensorflow::shape_inference::ShapeHandle addresses;
      return c->WithRank(c->input(0), 1, &addresses);
    })
    .Doc(R"doc(
Fails unless this task opens a TCP connection to each address within timeout_seconds.

addresses: [n] "host:port" or "protocol://host:port" ("[v6 address]:port" too), as handed
  to this task by another. A refused or failed connection is tried again until the
  deadline (a server may still be starting); then DeadlineExceeded names `what`, the
  address and the last failure.
)doc");

}  // namespace tfps
