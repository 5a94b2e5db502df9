// The CUDA runtime the GPU table is built against: the real one, or with
// TFPS_GPU_EMULATION defined (a host-compiler build for tests) its emulation on CPU
// threads (host_emulation.h). Host code of a real CUDA build compiled by a host compiler
// (a TensorFlow op's .cc calling the table) gets the real runtime too.
#ifndef TFPS_CORE_GPU_RUNTIME_H_
#define TFPS_CORE_GPU_RUNTIME_H_

#if defined(TFPS_GPU_EMULATION) && !defined(__CUDACC__)
#include "custom_ops/core/gpu/host_emulation.h"
#define TFPS_GPU_EMULATED 1
#else
#include <cuda_runtime.h>
#define TFPS_GPU_EMULATED 0
#endif

#endif  // TFPS_CORE_GPU_RUNTIME_H_
