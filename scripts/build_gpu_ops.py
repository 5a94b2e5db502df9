"""Builds the table ops' GPU kernels (custom_ops/table/kernels/gpu_table_kernels.cc) as a
library that loads beside the op library and adds kernels only (no op registrations).

    python scripts/build_gpu_ops.py cuda [--out tfps/_tfps_gpu_ops.so]
    python scripts/build_gpu_ops.py emulated --out /tmp/gpu_emulated.so

cuda: DEVICE_GPU kernels, compiled by $NVCC (or nvcc on the PATH) and linked with that
toolkit's static CUDA runtime, so the library needs no libcudart of its own beside the
one TensorFlow loads: both drive the same device through the driver's primary context, on
TensorFlow's streams. CUDA 12 (TensorFlow 2.21's major version) runs on any driver TF
runs on; a CUDA 13 build needs a driver for CUDA 13. (PyPI's nvidia-cuda-nvcc-cu12 holds
ptxas and libnvvm, not nvcc.) tfps loads the library when TensorFlow sees a GPU.

emulated: the same kernels for DEVICE_CPU under the label "gpu_emulation", over the GPU
table built against host_emulation.h; for tests on machines without a GPU. Needs only g++.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import build_config  # noqa: E402

# Besides the core table (which ParseTableConfig's table types need), the sources the GPU
# kernels link: a library loaded by tf.load_op_library does not see another's symbols.
# build_info.cc records the TensorFlow version, which tfps checks before loading it.
HOST_SOURCES = build_config.GPU_KERNEL_SOURCES + ["custom_ops/table/kernels/table_resource.cc",
                                                  "custom_ops/table/kernels/build_info.cc"]
SUPPORTED_CUDA_MAJORS = (12, 13)
# TensorFlow 2.21's own targets (tf.sysconfig.get_build_info()) as SASS, and PTX for later
# GPUs; CUDA 13 no longer targets Volta (sm_70).
_AMPERE_ON = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_89,code=sm_89",
              "-gencode=arch=compute_90,code=[sm_90,compute_90]"]
GENCODE = {12: ["-gencode=arch=compute_70,code=sm_70", *_AMPERE_ON], 13: _AMPERE_ON}


def find_nvcc():
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        sys.exit("build_gpu_ops: no nvcc: set NVCC or put a CUDA toolkit's nvcc on the PATH")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release (\d+)\.", version)
    if not release or int(release.group(1)) not in SUPPORTED_CUDA_MAJORS:
        sys.exit(f"build_gpu_ops: {nvcc} is not CUDA {' or '.join(map(str, SUPPORTED_CUDA_MAJORS))}: "
                 f"{version.strip().splitlines()[-1] if version.strip() else 'no version'}")
    return nvcc, int(release.group(1))


def toolkit_dirs(nvcc):
    """(include, lib) of the toolkit nvcc belongs to, as nvcc itself reports them (nvcc on
    the PATH may be a wrapper script)."""
    dryrun = subprocess.run([nvcc, "-v", "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                            capture_output=True, text=True)
    include = re.search(r'INCLUDES="-I([^"]+)"', dryrun.stderr + dryrun.stdout)
    libs = re.findall(r'"-L([^"]+)"', dryrun.stderr + dryrun.stdout)
    lib = next((d for d in libs if os.path.exists(os.path.join(d, "libcudart_static.a"))), None)
    if not include or lib is None:
        sys.exit(f"build_gpu_ops: cannot find the CUDA headers and libcudart_static.a of {nvcc}")
    return include.group(1).strip(), lib


def compile_all(jobs):
    try:
        build_config.compile_in_parallel(jobs, cwd=ROOT, cache_dir=build_config.object_cache_dir())
    except subprocess.CalledProcessError as e:
        sys.exit(f"build_gpu_ops: compiling failed: {' '.join(e.cmd)}")


def build(mode, out, work):
    compile_flags, link_flags = build_config.tensorflow_flags()
    # Sources and includes relative to ROOT (the jobs' directory): the object cache then
    # finds this tree's objects in every copy of it.
    cxx = [os.environ.get("CXX", "g++"), *build_config.CXXFLAGS, *compile_flags, "-I", "."]
    os.makedirs(work, exist_ok=True)
    objects, jobs = [], []

    def obj(source):
        objects.append(os.path.join(work, source.replace("/", "_") + ".o"))
        return objects[-1]

    extra_link = []
    if mode == "emulated":
        for source in build_config.CORE_SOURCES + HOST_SOURCES:
            jobs.append([*cxx, "-DTFPS_GPU_EMULATION", "-c", source, "-o", obj(source)])
        table = "custom_ops/core/gpu/gpu_table.cu.cc"
        jobs.append([*cxx, "-DTFPS_GPU_EMULATION", "-x", "c++", "-c", table, "-o", obj(table)])
    else:
        nvcc, major = find_nvcc()
        include, libdir = toolkit_dirs(nvcc)
        cuda_include = ["-I", include]
        for source in build_config.CORE_SOURCES + HOST_SOURCES:
            jobs.append([*cxx, *cuda_include, "-c", source, "-o", obj(source)])
        for source in build_config.CUDA_SOURCES:
            # --fmad=false: the GPU and CPU tables must round identically.
            jobs.append([nvcc, "-std=c++17", "-O3", "--fmad=false", *GENCODE[major], "-x", "cu", "-I", ".",
                         "-Xcompiler", "-fPIC,-ffp-contract=off", "-c", source, "-o", obj(source)])
        extra_link = [os.path.join(libdir, "libcudart_static.a"), "-ldl", "-lrt"]
    compile_all(jobs)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    subprocess.run([os.environ.get("CXX", "g++"), "-shared", "-o", out, *objects, *link_flags, *build_config.CORE_LINK_FLAGS, *extra_link,
                    "-pthread"], check=True, cwd=ROOT)
    print(f"built {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["cuda", "emulated"])
    parser.add_argument("--out", default=os.path.join(ROOT, "tfps", "_tfps_gpu_ops.so"))
    parser.add_argument("--work", default=os.path.join(ROOT, "build", "gpu_ops"))
    args = parser.parse_args()
    build(args.mode, args.out, os.path.join(args.work, args.mode))


if __name__ == "__main__":
    main()
