#!/usr/bin/env bash
# Installs everything nikki needs to build and test on a fresh Debian 12 machine.
# Idempotent: each step checks first and does nothing when its dependency is present.
# Run as root (CI and fresh machines) or with sudo available.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- 1. Debian packages: compilers, LLVM 19, C++ libraries ---------------------------
debian_packages=(
  llvm-19-dev clang-19 libzstd-dev zlib1g-dev libedit-dev libxml2-dev
  libfmt-dev doctest-dev libbenchmark-dev
  ninja-build lld ccache g++ make
  time  # /usr/bin/time -v: peak memory of the test suite
)
missing=()
for pkg in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- 2. Python packages --------------------------------------------------------------
# torch is pinned: that exact version installs a CPU build; anything else pulls a multi-GB
# CUDA build.
"$python" - "$here/python-requirements.txt" <<'PY' || "$python" -m pip install -q -r "$here/python-requirements.txt"
import sys, importlib.metadata as md
from packaging.requirements import Requirement
missing = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    req = Requirement(line)
    try:
        if not req.specifier.contains(md.version(req.name), prereleases=True):
            missing.append(line)
    except md.PackageNotFoundError:
        missing.append(line)
if missing:
    print("setup: installing Python packages:", " ".join(missing))
    sys.exit(1)
PY
echo "setup: all dependencies present"
