"""The GPU table's kernels, run on CPU threads by the CUDA host emulation, against the CPU
table: every operation and optimizer, growth, removes, export/import, the clock, refusals,
repeated keys, concurrent callers and error statuses (custom_ops/core/gpu/tests). No GPU or
CUDA toolkit needed, so it runs in every CI run; also under ThreadSanitizer."""

import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("build", ["plain", "thread"])
def test_emulated_gpu_table_matches_the_cpu_table(tmp_path, build):
    """plain: -O2, full-size batches; thread: ThreadSanitizer, smaller batches."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} is needed to build the emulated GPU table harness"
    args = ["bash", os.path.join(ROOT, "custom_ops", "core", "gpu", "run_emulated.sh")]
    if build == "thread":
        args.append("--tsan")
    run = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OUT_DIR=str(tmp_path)))
    output = run.stdout + run.stderr
    counts = re.search(r"(\d+) passed, (\d+) failed", run.stdout)
    assert run.returncode == 0, output[-6000:]
    assert counts and int(counts.group(1)) > 1000 and counts.group(2) == "0", output[-6000:]
    assert "WARNING: ThreadSanitizer" not in output, output[-6000:]


SPINNING_KERNEL = r"""
#include "custom_ops/core/gpu/device_support.h"

// Two threads that each wait for the other: fine where threads are scheduled
// independently, a hang where one runs to completion before the other starts.
__global__ void SpinKernel(unsigned* arrived) {
  if (tfps::gpu::GlobalThread() >= 2) return;
  atomicAdd(arrived, 1u);
  while (tfps::gpu::LoadAcquire(arrived) < 2) {
  }
}

int main() {
  unsigned* arrived = nullptr;
  cudaMalloc(&arrived, sizeof(unsigned));
  cudaMemset(arrived, 0, sizeof(unsigned));
  const tfps::gpu::Status status = TFPS_LAUNCH("spin test", SpinKernel, 2, nullptr, arrived);
  return status.ok() ? 0 : 1;
}
"""


def test_emulation_stops_a_kernel_that_waits_on_another_thread_naming_it(tmp_path):
    """The table's kernels never wait on each other; a kernel that does must fail loudly under
    the emulation (where it would hang), not pass or hang the test run."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} is needed to build the emulation check"
    source = tmp_path / "spin.cc"
    source.write_text(SPINNING_KERNEL)
    binary = str(tmp_path / "spin")
    subprocess.run([cxx, "-std=c++17", "-O1", "-pthread", "-DTFPS_GPU_EMULATION", "-I", ROOT,
                    str(source), "-o", binary], check=True, timeout=300)
    run = subprocess.run([binary], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TFPS_GPU_EMULATION_TIMEOUT_S="2"))
    assert run.returncode != 0
    assert "emulated kernel SpinKernel still running after 2 s" in run.stderr, run.stderr
