"""The single place the pip build takes its C++ sources and compile flags from.

Bazel keeps its own copy of the flags in one macro (`custom_ops/build_defs.bzl`); a test
checks that both builds list the same sources.
"""

CORE_SOURCES = [
    "custom_ops/core/block_cache.cc",
    "custom_ops/core/crc32c.cc",
    "custom_ops/core/eviction.cc",
    "custom_ops/core/memory.cc",
    "custom_ops/core/optimizer.cc",
    "custom_ops/core/pending.cc",
    "custom_ops/core/policies.cc",
    "custom_ops/core/table.cc",
    "custom_ops/core/table_save.cc",
    "custom_ops/core/table_serving.cc",
]

OP_SOURCES = [
    "custom_ops/table/ops/table_ops.cc",
    "custom_ops/table/kernels/table_resource.cc",
    "custom_ops/table/kernels/table_kernels.cc",
    "custom_ops/table/ops/checkpoint_ops.cc",
    "custom_ops/table/kernels/row_file.cc",
    "custom_ops/table/kernels/checkpoint_kernels.cc",
    "custom_ops/table/kernels/row_output.cc",
    "custom_ops/table/ops/export_ops.cc",
    "custom_ops/table/kernels/export_kernels.cc",
    "custom_ops/table/kernels/retrieval_kernels.cc",
    "custom_ops/table/kernels/serving_changes_kernels.cc",
    "custom_ops/table/kernels/build_info.cc",
    "custom_ops/metrics/ops/metric_ops.cc",
    "custom_ops/metrics/kernels/histogram_auc_kernel.cc",
    "custom_ops/metrics/kernels/histogram_curve_sum_kernel.cc",
    "custom_ops/metrics/kernels/group_auc_kernels.cc",
    "custom_ops/keys/ops/key_ops.cc",
    "custom_ops/keys/kernels/key_kernels.cc",
    "custom_ops/keys/kernels/dedup_kernels.cc",
]

# Each is a test program of its own.
CORE_TEST_SOURCES = ["custom_ops/core/tests/table_test.cc", "custom_ops/core/tests/policies_test.cc",
                     "custom_ops/core/tests/save_chains_test.cc"]

# CUDA sources: compiled by custom_ops/core/gpu/build.sh (TF-free harness and benchmark)
# and by `bazel build --config=cuda`; CI compiles them with nvcc so they never rot.
CUDA_SOURCES = ["custom_ops/core/gpu/gpu_table.cu.cc"]
# The table ops' GPU kernels: host code, built with the CUDA sources into a library of
# their own by scripts/build_gpu_ops.py (and `bazel build --config=cuda`).
GPU_KERNEL_SOURCES = ["custom_ops/table/kernels/gpu_table_kernels.cc"]
CUDA_TEST_SOURCES = ["custom_ops/core/gpu/tests/gpu_table_harness.cu.cc"]

# -ffp-contract=off: initial values must round the same on every compiler and on the GPU.
# -fno-math-errno: sqrtf becomes one instruction (results unchanged), so optimizer loops
# vectorize; nothing reads errno.
CXXFLAGS = ["-std=c++17", "-O3", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno",
            "-Wno-deprecated-declarations"]


def tensorflow_flags():
    """Compile and link flags of the installed TensorFlow (its version is compiled in)."""
    import tensorflow as tf

    compile_flags = [f for f in tf.sysconfig.get_compile_flags() if not f.startswith("--std")]
    compile_flags.append(f'-DTFPS_TF_VERSION="{tf.__version__}"')
    return compile_flags, tf.sysconfig.get_link_flags()


def compile_in_parallel(commands, cwd=None):
    """Runs compile commands, as many at once as there are cores; CalledProcessError (naming
    the command) if one fails."""
    import concurrent.futures
    import os
    import subprocess

    with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda command: subprocess.run(command, cwd=cwd, check=True), commands))
