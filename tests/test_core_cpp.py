"""Builds and runs the plain C++ tests of the TF-free table core (incl. the stress test)."""

import os
import shutil
import subprocess

import pytest

import build_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("program", build_config.CORE_TEST_SOURCES)
@pytest.mark.parametrize("build", ["debug", "thread", "production"])
def test_core_cpp_tests_pass(tmp_path, build, program):
    """debug: -O2 -g; thread: ThreadSanitizer; production: the op library's own flags."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} is needed to build the C++ core tests"
    binary = str(tmp_path / "core_test")
    flags = {"debug": ["-std=c++17", "-O2", "-g", "-pthread"],
             "thread": ["-std=c++17", "-O1", "-g", "-pthread", "-fsanitize=thread"],
             "production": list(build_config.CXXFLAGS)}[build]
    sources = [os.path.join(ROOT, s) for s in [program] + build_config.CORE_SOURCES]
    subprocess.run([cxx, *flags, "-I", ROOT, *sources, "-o", binary], check=True, timeout=600)
    result = subprocess.run([binary], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout
    assert "WARNING: ThreadSanitizer" not in result.stderr
