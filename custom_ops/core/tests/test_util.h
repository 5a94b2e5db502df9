// What the plain C++ tests of the core share: a check that counts instead of stopping, the
// table configuration most tests start from, and the ways of running a batch.
#ifndef TFPS_CORE_TESTS_TEST_UTIL_H_
#define TFPS_CORE_TESTS_TEST_UTIL_H_

#include <cstdio>

#include "custom_ops/core/table.h"

namespace tfps {

inline int failures = 0;
inline int checks = 0;

#define CHECK_TRUE(cond)                                                    \
  do {                                                                      \
    ++::tfps::checks;                                                       \
    if (!(cond)) {                                                          \
      ++::tfps::failures;                                                   \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                       \
  } while (0)

inline TableConfig Config(int dim, OptimizerKind opt, InitializerKind init, int log2_stripes = 4) {
  TableConfig c;
  c.dim = dim;
  c.optimizer.kind = opt;
  c.optimizer.learning_rate = 0.5f;
  c.initializer.kind = init;
  c.initializer.a = init == InitializerKind::kUniform ? -1.0f : 0.0f;
  c.initializer.b = init == InitializerKind::kUniform ? 1.0f : 0.5f;
  c.seed = 42;
  c.log2_stripes = log2_stripes;
  return c;
}

inline const ParallelFor kSerial = SerialParallelFor();
inline const ParallelFor kThreads = ThreadedParallelFor(4);

// Prints the tally and gives main's exit status.
inline int Report(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace tfps

#endif  // TFPS_CORE_TESTS_TEST_UTIL_H_
