"""The single place the pip build takes its C++ sources and compile flags from.

Bazel keeps its own copy of the flags in one macro (`custom_ops/build_defs.bzl`); a test
checks that both builds list the same sources.
"""

CORE_SOURCES = [
    "custom_ops/core/block_cache.cc",
    "custom_ops/core/crc32c.cc",
    "custom_ops/core/disk_store.cc",
    "custom_ops/core/eviction.cc",
    "custom_ops/core/memory.cc",
    "custom_ops/core/optimizer.cc",
    "custom_ops/core/pending.cc",
    "custom_ops/core/policies.cc",
    "custom_ops/core/table.cc",
    "custom_ops/core/table_save.cc",
    "custom_ops/core/table_serving.cc",
    "custom_ops/core/tiers.cc",
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
    "custom_ops/net/ops/net_ops.cc",
    "custom_ops/net/kernels/reachable_kernel.cc",
]

# Libraries the core links against: RocksDB holds a tiered table's rows on disk
# (scripts/install_rocksdb.sh installs it).
CORE_LINK_FLAGS = ["-lrocksdb"]

# Each is a test program of its own.
CORE_TEST_SOURCES = ["custom_ops/core/tests/table_test.cc", "custom_ops/core/tests/policies_test.cc",
                     "custom_ops/core/tests/save_chains_test.cc", "custom_ops/core/tests/tiers_test.cc"]

# CUDA sources: compiled by custom_ops/core/gpu/build.sh (TF-free harness and benchmark)
# and by `bazel build --config=cuda`; CI compiles them with nvcc so they never rot.
CUDA_SOURCES = ["custom_ops/core/gpu/gpu_table.cu.cc"]
# The table ops' GPU kernels: host code, built with the CUDA sources into a library of
# their own by scripts/build_gpu_ops.py (and `bazel build --config=cuda`).
GPU_KERNEL_SOURCES = ["custom_ops/table/kernels/gpu_table_kernels.cc"]
CUDA_TEST_SOURCES = ["custom_ops/core/gpu/tests/gpu_table_harness.cu.cc"]
# The harness's stand-in for disk_store.cc on a machine without RocksDB (custom_ops/core/gpu/core_sources.sh).
HARNESS_ONLY_SOURCES = ["custom_ops/core/gpu/disk_store_absent.cc"]

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


def compile_in_parallel(commands, cwd=None, cache_dir=None):
    """Runs compile commands (`... -c SOURCE -o OBJECT ...`), as many at once as there are
    cores; CalledProcessError (naming the command) if one fails. With `cache_dir`, an
    object whose compiler, command (less its output path) and preprocessed source match
    one compiled before is copied from there instead of compiled again (not nvcc's)."""
    import concurrent.futures
    import os
    import subprocess

    through_cache = [cache_dir is not None and _preprocessing_keys_objects(c) for c in commands]
    compilers = {c[0]: subprocess.run([c[0], "--version"], capture_output=True, check=True).stdout
                 for c, cached in zip(commands, through_cache) if cached}  # versions, for the keys

    def compile_one(command, cached):
        if cached:
            _compile_through_cache(command, cwd, cache_dir, compilers[command[0]])
        else:
            subprocess.run(command, cwd=cwd, check=True)
    with concurrent.futures.ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(compile_one, commands, through_cache))
    if cache_dir is not None:
        _prune_cache(cache_dir)


def cache_dir(variable, name):
    """Where a build keeps its outputs between builds: $`variable` (empty: keep none), by
    default ~/.cache/tfps/`name`."""
    import os

    path = os.environ.get(variable, os.path.join(os.path.expanduser("~"), ".cache", "tfps", name))
    return path or None


def object_cache_dir():
    """Where the pip build keeps compiled objects between builds: $TFPS_OBJECT_CACHE."""
    return cache_dir("TFPS_OBJECT_CACHE", "objects")


def _preprocessing_keys_objects(command):
    """CUDA's -E is the host's pass alone: device code under __CUDA_ARCH__ would not be in
    the key, so objects of nvcc (by its name, or any compiler told `-x cu`) are never cached."""
    import os

    compiles_cuda = any(flag == "-x" and language == "cu" for flag, language in zip(command, command[1:]))
    return not (compiles_cuda or os.path.basename(command[0]).startswith("nvcc"))


OBJECT_CACHE_ENTRIES = 400  # the least recently used go beyond this (a build has 29)


def _compile_through_cache(command, cwd, cache_dir, compiler_version):
    """Preprocessing sees every header and macro the object depends on, so its text with the
    compiler's identity and the command (which names the source; built from a relative
    path, __FILE__ is the same in every copy of the tree) keys the object."""
    import hashlib
    import os
    import shutil
    import subprocess

    output_at = command.index("-o")
    output = os.path.join(cwd or "", command[output_at + 1])
    keyed = command[:output_at] + command[output_at + 2:]
    preprocess = ["-E" if arg == "-c" else arg for arg in keyed]
    preprocessed = subprocess.run(preprocess, cwd=cwd, capture_output=True)
    if preprocessed.returncode != 0:  # the compiler itself shows why (a missing header)
        subprocess.run(command, cwd=cwd, check=True)
        return
    digest = hashlib.sha256()
    for part in (compiler_version, "\0".join(keyed).encode(), preprocessed.stdout):
        digest.update(hashlib.sha256(part).digest())
    cached = os.path.join(cache_dir, digest.hexdigest() + ".o")
    if os.path.exists(cached):
        shutil.copyfile(cached, output)
        os.utime(cached)
        return
    subprocess.run(command, cwd=cwd, check=True)
    os.makedirs(cache_dir, exist_ok=True)
    partial = f"{cached}.{os.getpid()}.partial"
    shutil.copyfile(output, partial)
    os.replace(partial, cached)  # whole or absent, for builds running side by side


def _prune_cache(cache_dir):
    import os

    if not os.path.isdir(cache_dir):
        return
    entries = [os.path.join(cache_dir, name) for name in os.listdir(cache_dir) if name.endswith(".o")]
    entries.sort(key=lambda path: os.stat(path).st_mtime, reverse=True)
    for path in entries[OBJECT_CACHE_ENTRIES:]:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass  # another build pruned it
