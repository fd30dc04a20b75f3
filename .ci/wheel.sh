#!/usr/bin/env bash
# Build the pip wheel (maturin, bin bindings: the `vramscope` binary plus the
# `vramscope_live` helper package) and install it into a fresh venv, then use
# it as a pip user would. maturin itself is installed once into a cached venv.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${XDG_CACHE_HOME:-$HOME/.cache}/vramscope-ci"
mkdir -p "$cache"
if [ ! -x "$cache/maturin-venv/bin/maturin" ]; then
  python3 -m venv "$cache/maturin-venv"
  "$cache/maturin-venv/bin/pip" install -q "maturin>=1.5,<2"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$cache/maturin-venv/bin/maturin" build --release --quiet --out "$out/wheels"
wheel=$(ls "$out"/wheels/vramscope-*.whl)
echo "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

python3 -m venv "$out/venv"
"$out/venv/bin/pip" install -q "$wheel"
bin="$out/venv/bin/vramscope"
[ -x "$bin" ] || { echo "the wheel put no vramscope on the venv's PATH"; exit 1; }
"$bin" --version
"$bin" scenarios | grep -q '^tour' || { echo "vramscope scenarios does not list the tour"; exit 1; }
"$bin" run zero-grad-fixed --headless >/dev/null
"$out/venv/bin/python" -c 'import vramscope_live, sys; assert vramscope_live.PROTOCOL == 1; print("import vramscope_live:", vramscope_live.__file__)'
"$out/venv/bin/python" -m vramscope_live --version
# nothing but the helper package: no tests or GPU scripts in site-packages
if "$out/venv/bin/python" -c 'import tests' 2>/dev/null; then echo "the wheel installed a top-level tests package"; exit 1; fi
echo "wheel OK"
