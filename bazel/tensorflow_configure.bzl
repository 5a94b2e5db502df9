"""Repository rule exposing the installed TensorFlow (found with Python) to Bazel."""

_PROBE = """
import json, tensorflow as tf
flags = tf.sysconfig.get_compile_flags()
print(json.dumps({
    "include": tf.sysconfig.get_include(),
    "lib": tf.sysconfig.get_lib(),
    "version": tf.__version__,
    "copts": [f for f in flags if not f.startswith("-I") and not f.startswith("--std")],
    "linkopts": tf.sysconfig.get_link_flags(),
}))
"""

def _tensorflow_configure_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH", "python3")
    result = ctx.execute([python, "-c", _PROBE], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.return_code != 0:
        fail("tensorflow_configure: could not import tensorflow with %s:\n%s" % (python, result.stderr))
    info = json.decode(result.stdout.strip().splitlines()[-1])
    ctx.symlink(info["include"], "include")
    ctx.symlink(info["lib"] + "/libtensorflow_framework.so.2", "libtensorflow_framework.so.2")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob(["include/**"]),
    includes = ["include"],
)

cc_library(
    name = "framework",
    srcs = ["libtensorflow_framework.so.2"],
)
""")
    ctx.file("defs.bzl", "TF_VERSION = %r\nTF_COPTS = %r\n" % (info["version"], info["copts"]))

tensorflow_configure = repository_rule(
    implementation = _tensorflow_configure_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
)
