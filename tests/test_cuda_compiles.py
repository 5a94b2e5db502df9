"""CI compiles the CUDA sources (table kernels, GPU-vs-CPU harness, GPU benchmarks) with the
machine's nvcc so they never rot; running them needs a GPU (custom_ops/core/gpu/run_on_gpu.sh)."""

import os
import subprocess

from tests.required_tools import skip_without_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@skip_without_tool("nvcc", "the CUDA sources are compiled where a CUDA toolkit is present")
def test_cuda_table_harness_and_benchmarks_compile_and_link(tmp_path):
    build = subprocess.run(["bash", os.path.join(ROOT, "custom_ops", "core", "gpu", "build.sh")],
                           capture_output=True, text=True, timeout=900,
                           env=dict(os.environ, OUT_DIR=str(tmp_path)))
    assert build.returncode == 0, build.stderr[-4000:]
    for binary in ("gpu_table_harness", "gpu_table_benchmark", "gpu_training_step"):
        assert os.access(tmp_path / binary, os.X_OK)
