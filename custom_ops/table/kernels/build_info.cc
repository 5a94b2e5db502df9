// Records which TensorFlow the library was compiled against. The Python loader reads this
// string from the file before loading it, so a mismatch gives an error naming both
// versions instead of an undefined-symbol crash.
#ifndef TFPS_TF_VERSION
#error "TFPS_TF_VERSION must be defined by the build (the TensorFlow version compiled against)"
#endif

extern "C" {
__attribute__((used, visibility("default"))) const char tfps_build_info[] =
    "TFPS_BUILT_FOR_TENSORFLOW=" TFPS_TF_VERSION ";";
}
