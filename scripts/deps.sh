#!/usr/bin/env bash
# Installs the Debian packages Kiln needs that are missing, and nothing else.
# Used by the two README commands; safe to run repeatedly (no network when all present).
set -euo pipefail

packages=(
  gcc g++ make cmake pkg-config      # build (g++: the CUDA emulator's C++ test kernels)
  libcriterion-dev python3-venv      # tests (python3-venv: their Python environment, below)
  libopenblas-dev zlib1g-dev         # the runtime: BLAS for matmuls, gzip for IDX data
  libdeflate0                        # (gzip files inflated whole, 2.5x zlib's speed; dlopen'd)
  graphviz                           # `kiln ir --dot` output is checked with dot
  libcairo2-dev                      # `kiln plot` draws training curves to PNG and SVG with cairo
  libprotobuf-c-dev protobuf-c-compiler
                                     # `kiln import`: ONNX files through C generated from onnx.proto
  python3-onnx                       # tests/test_onnx.c: small ONNX models written with ONNX's helper
  dataset-fashion-mnist fortunes     # the reference models' training data
  openmpi-bin libopenmpi-dev         # kiln build --distributed (MPI) and tests/test_dist.c (mpirun)
  llvm-16-dev libclang-16-dev libclang-cpp16-dev liblld-16-dev libomp-16-dev libzstd-dev
                                     # Clang and lld as libraries: kiln build compiles in process
  libpolly-16-dev                    # (static: Debian's libclangCodeGen.a calls Polly)
  python3-torch                      # tests/test_parity.c: PyTorch 1.13 for parity checks
                                     # (174 packages, 146 MB download, 606 MB installed; 29 s here)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "kiln: installing missing packages: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The tests' Python environment, .venv/ at the repository root: Debian's python3 with its
# packages (python3-torch), plus what Debian does not package. tests/test_train_run.c reads
# the training program's TensorBoard event files with TensorBoard's own reader.
tensorboard_version=2.18.0
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if ! "$venv/bin/python" -c "import tensorboard, sys; sys.exit(tensorboard.__version__ != '$tensorboard_version')" 2>/dev/null; then
  echo "kiln: creating the tests' Python environment in $venv (tensorboard $tensorboard_version)" >&2
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "tensorboard==$tensorboard_version"
fi
