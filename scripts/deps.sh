#!/usr/bin/env bash
# Installs the Debian packages Kiln needs that are missing, and nothing else.
# Used by the two README commands; safe to run repeatedly (no network when all present).
set -euo pipefail

packages=(
  gcc g++ make cmake pkg-config      # build (g++: the CUDA emulator's C++ test kernels)
  libcriterion-dev                   # tests
  libopenblas-dev zlib1g-dev         # the runtime: BLAS for matmuls, gzip for IDX data
  graphviz                           # `kiln ir --dot` output is checked with dot
  libcairo2-dev                      # `kiln plot` draws training curves to PNG and SVG with cairo
  dataset-fashion-mnist fortunes     # the reference models' training data
  openmpi-bin libopenmpi-dev         # kiln build --distributed (MPI) and tests/test_dist.c (mpirun)
  python3-torch                      # tests/test_parity.c: PyTorch 1.13 for parity checks
                                     # (174 packages, 146 MB download, 606 MB installed; 29 s here)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kiln: installing missing packages: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
