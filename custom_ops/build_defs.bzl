"""The one place the Bazel build holds its compile flags (build_config.py holds the pip
build's; both add the installed TensorFlow's own flags)."""

load("@local_tensorflow//:defs.bzl", "TF_COPTS", "TF_VERSION")
load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

TFPS_COPTS = [
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-pthread",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-Wno-deprecated-declarations",
]

def tfps_core_library(name, srcs, hdrs):
    """The TF-free table core (RocksDB, from the system, holds a tiered table's rows on disk)."""
    cc_library(name = name, srcs = srcs, hdrs = hdrs, copts = TFPS_COPTS, linkopts = ["-pthread", "-lrocksdb"])

def tfps_op_library(name, srcs, hdrs, deps):
    """The TensorFlow op library, linked against the installed libtensorflow_framework."""
    cc_binary(
        name = name,
        srcs = srcs + hdrs,
        copts = TFPS_COPTS + TF_COPTS + ['-DTFPS_TF_VERSION=\\"%s\\"' % TF_VERSION],
        linkshared = True,
        linkopts = ["-pthread"],
        deps = deps + ["@local_tensorflow//:headers", "@local_tensorflow//:framework"],
    )

def tfps_core_test(name, srcs, deps):
    cc_test(name = name, srcs = srcs, copts = TFPS_COPTS, deps = deps, size = "medium")
