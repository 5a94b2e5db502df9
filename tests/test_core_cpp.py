"""Builds and runs the plain C++ tests of the TF-free table core (incl. the stress test)."""

import os
import shutil
import subprocess

import pytest

import build_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TSAN_SUPPRESSIONS = os.path.join(ROOT, "custom_ops", "core", "tests", "tsan_suppressions.txt")
FLAGS = {"debug": ["-std=c++17", "-O2", "-g", "-pthread"],
         "thread": ["-std=c++17", "-O1", "-g", "-pthread", "-fsanitize=thread"],
         "production": list(build_config.CXXFLAGS)}


def compile_objects(cxx, flags, sources, directory):
    """Object files of sources (relative to ROOT), compiled into directory at once, through
    the pip build's object cache."""
    objects = [os.path.join(directory, source.replace("/", "_") + ".o") for source in sources]
    build_config.compile_in_parallel([[cxx, *flags, "-I", ".", "-c", source, "-o", obj]
                                      for source, obj in zip(sources, objects)],
                                     cwd=ROOT, cache_dir=build_config.object_cache_dir())
    return objects


@pytest.fixture(scope="module")
def core_objects(tmp_path_factory):
    """The core's object files per build, compiled once for both test programs."""
    built = {}

    def get(cxx, build):
        if build not in built:
            built[build] = compile_objects(cxx, FLAGS[build], build_config.CORE_SOURCES,
                                           str(tmp_path_factory.mktemp(f"core_{build}")))
        return built[build]
    return get


@pytest.mark.parametrize("program", build_config.CORE_TEST_SOURCES)
@pytest.mark.parametrize("build", ["debug", "thread", "production"])
def test_core_cpp_tests_pass(tmp_path, core_objects, build, program):
    """debug: -O2 -g; thread: ThreadSanitizer; production: the op library's own flags."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} is needed to build the C++ core tests"
    binary = str(tmp_path / "core_test")
    objects = compile_objects(cxx, FLAGS[build], [program], str(tmp_path)) + core_objects(cxx, build)
    subprocess.run([cxx, *FLAGS[build], *objects, *build_config.CORE_LINK_FLAGS, "-o", binary], check=True, timeout=600)
    env = dict(os.environ, TSAN_OPTIONS=f"suppressions={TSAN_SUPPRESSIONS}")
    result = subprocess.run([binary], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout
    assert "WARNING: ThreadSanitizer" not in result.stderr
