"""The pip build's object cache (build_config.compile_in_parallel): a copy of the tree
reuses the objects of another, and any change the preprocessor sees compiles again.
A wrapper around the compiler counts the compiles that really run."""

import os
import shutil
import stat
import subprocess

import pytest

import build_config

HEADER = "#define SCALE {scale}\ninline int scaled(int x) {{ return SCALE * x; }}\n"
SOURCE = '#include "lib/scale.h"\nextern "C" int triple(int x) { return scaled(x); }\n'


def make_tree(root, scale=3, source=SOURCE):
    os.makedirs(os.path.join(root, "lib"))
    with open(os.path.join(root, "lib", "scale.h"), "w") as f:
        f.write(HEADER.format(scale=scale))
    with open(os.path.join(root, "lib", "triple.cc"), "w") as f:
        f.write(source)
    return root


@pytest.fixture
def counting_compiler(tmp_path):
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) echo "$*" >> {log};; esac\nexec g++ "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return str(wrapper), (lambda: len(log.read_text().splitlines()) if log.exists() else 0)


def build(compiler, tree, cache):
    obj = os.path.join(tree, "triple.o")
    build_config.compile_in_parallel([[compiler, "-c", "lib/triple.cc", "-o", obj, "-I", ".", "-O2", "-fPIC"]],
                                     cwd=tree, cache_dir=cache)
    with open(obj, "rb") as f:
        return f.read()


def test_a_copy_of_the_tree_reuses_the_object_and_a_change_compiles_again(tmp_path, counting_compiler):
    compiler, compiles = counting_compiler
    cache = str(tmp_path / "cache")
    first = build(compiler, make_tree(str(tmp_path / "a")), cache)
    assert compiles() == 1
    # Another copy at another path, comments changed: the same preprocessed text.
    copy = shutil.copytree(str(tmp_path / "a"), str(tmp_path / "b"))
    with open(os.path.join(copy, "lib", "scale.h"), "a") as f:
        f.write("// a comment the object does not depend on\n")
    assert build(compiler, copy, cache) == first and compiles() == 1
    # A macro's value in a header changes the object.
    changed = build(compiler, make_tree(str(tmp_path / "c"), scale=4), cache)
    assert compiles() == 2 and changed != first
    # So do the flags.
    obj = os.path.join(copy, "triple.o")
    build_config.compile_in_parallel([[compiler, "-c", "lib/triple.cc", "-o", obj, "-I", ".", "-O0", "-fPIC"]],
                                     cwd=copy, cache_dir=cache)
    assert compiles() == 3
    # Without a cache every compile runs.
    build(compiler, copy, None)
    assert compiles() == 4


def test_a_missing_header_fails_with_the_compilers_own_message(tmp_path, counting_compiler, capfd):
    compiler, _ = counting_compiler
    tree = make_tree(str(tmp_path / "a"))
    os.remove(os.path.join(tree, "lib", "scale.h"))
    with pytest.raises(subprocess.CalledProcessError):
        build(compiler, tree, str(tmp_path / "cache"))
    assert "lib/scale.h" in capfd.readouterr().err
    assert not os.path.exists(tmp_path / "cache") or not os.listdir(tmp_path / "cache")


def test_the_cache_keeps_the_most_recently_used_objects(tmp_path, counting_compiler, monkeypatch):
    compiler, compiles = counting_compiler
    monkeypatch.setattr(build_config, "OBJECT_CACHE_ENTRIES", 2)
    cache = str(tmp_path / "cache")
    trees = [make_tree(str(tmp_path / f"t{scale}"), scale=scale) for scale in (2, 3, 4)]
    for tree in trees:
        build(compiler, tree, cache)
    assert compiles() == 3 and len(os.listdir(cache)) == 2
    build(compiler, trees[2], cache)  # kept
    build(compiler, trees[1], cache)  # kept
    assert compiles() == 3
    build(compiler, trees[0], cache)  # pruned, so compiled again
    assert compiles() == 4


def test_the_cache_directory_follows_the_environment(monkeypatch):
    monkeypatch.setenv("TFPS_OBJECT_CACHE", "/somewhere/objects")
    assert build_config.object_cache_dir() == "/somewhere/objects"
    monkeypatch.setenv("TFPS_OBJECT_CACHE", "")
    assert build_config.object_cache_dir() is None
    monkeypatch.delenv("TFPS_OBJECT_CACHE")
    assert build_config.object_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "tfps", "objects")


def test_nvcc_compiles_every_time(tmp_path, counting_compiler):
    """nvcc's -E leaves out device code under __CUDA_ARCH__, which the key would miss."""
    compiler, compiles = counting_compiler
    nvcc = str(tmp_path / "nvcc")
    shutil.copy(compiler, nvcc)
    cache = str(tmp_path / "cache")
    tree = make_tree(str(tmp_path / "a"))
    build(nvcc, tree, cache)
    build(nvcc, tree, cache)
    assert compiles() == 2
    assert not os.path.exists(cache) or not os.listdir(cache)


def test_a_cuda_compile_under_another_name_compiles_every_time(tmp_path, counting_compiler):
    """A wrapper that is not named nvcc but is told `-x cu` compiles CUDA all the same."""
    compiler, compiles = counting_compiler
    wrapper = tmp_path / "cuda-cxx"  # g++ reads the source as C++ in place of CUDA
    wrapper.write_text(f'#!/bin/sh\nfor a; do shift; [ "$a" = cu ] && a=c++; set -- "$@" "$a"; done\n'
                       f'exec {compiler} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    cache = str(tmp_path / "cache")
    tree = make_tree(str(tmp_path / "a"))
    for _ in range(2):
        build_config.compile_in_parallel([[str(wrapper), "-x", "cu", "-c", "lib/triple.cc", "-o", "triple.o",
                                           "-I", ".", "-fPIC"]], cwd=tree, cache_dir=cache)
    assert compiles() == 2
    assert not os.path.exists(cache) or not os.listdir(cache)
