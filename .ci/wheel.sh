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
listed=$("$bin" scenarios)
grep -q '^tour ' <<<"$listed" || { echo "vramscope scenarios does not list the tour"; exit 1; }
"$bin" run zero-grad-fixed --headless >/dev/null
"$out/venv/bin/python" -c 'import vramscope_live, sys; assert vramscope_live.PROTOCOL == 1; print("import vramscope_live:", vramscope_live.__file__)'
"$out/venv/bin/python" -m vramscope_live --version
# nothing but the binary and the helper package: no tests or GPU scripts
files=$("$out/venv/bin/pip" show -f vramscope | sed -n '/^Files:/,$p' | tail -n +2)
stray=$(grep -v -e 'vramscope_live/' -e 'vramscope-.*dist-info/' -e 'bin/vramscope$' <<<"$files" || true)
[ -z "$stray" ] || { echo "the wheel installs more than the binary and the helper: $stray"; exit 1; }
echo "wheel OK"
