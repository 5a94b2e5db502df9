# Sourced by the scripts that run tfps under TensorFlow 2.16.2 (where
# tensorflow-recommenders-addons 0.8.1 runs). tf216_build_copy PACKAGES... makes or reuses
# the 2.16.2 virtual environment, installs PACKAGES beside TensorFlow, builds tfps in a
# copy of the sources (so the 2.21 library is not replaced in place) and leaves the shell
# in that copy, with $VENV set. The copy and the tfps install are removed on exit.
tf216_build_copy() {
  VENV="${TFPS_TF216_VENV:-$HOME/.cache/tfps/venv-tf2.16.2}"
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$VENV/bin/python" -m pip install -q "tensorflow==2.16.2" "tf_keras==2.16.*" "numpy<2" \
    setuptools wheel "$@"
  TF216_WORK=$(mktemp -d)
  trap '"$VENV/bin/python" -m pip uninstall -q -y tfps || true; rm -rf "$TF216_WORK"' EXIT
  git ls-files -z | xargs -0 -I{} cp --parents {} "$TF216_WORK" 2>/dev/null || cp -r . "$TF216_WORK"
  cd "$TF216_WORK"
  "$VENV/bin/python" -m pip install -q --no-build-isolation -e .
}
