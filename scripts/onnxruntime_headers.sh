#!/usr/bin/env bash
# ONNX Runtime's C API headers, for building our int8 kernel (chattts_serving/int8_kernel.py):
# the onnxruntime wheel ships none, so they are unpacked from Debian's libonnxruntime-dev
# (Debian 13 "trixie"; its API version 21 loads into any newer onnxruntime) into
# build/onnxruntime-include. Nothing is installed: the package is downloaded with a private apt
# list and unpacked with dpkg -x.
#
#   scripts/onnxruntime_headers.sh     fetch when build/onnxruntime-include lacks them
#   ORT_HEADERS_DEST=/tmp/ort scripts/onnxruntime_headers.sh    into another directory (the image's build stage)
#
# Without network or apt it says so and exits 0: the engine then keeps ONNX Runtime's own
# int8 kernel (MatMulNBits), and the kernel's tests skip (fail under CI).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${ORT_HEADERS_DEST:-build/onnxruntime-include}
SUITE=${ORT_HEADERS_SUITE:-trixie}
if [ -f "$DEST/onnxruntime_c_api.h" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "onnxruntime headers: no apt-get/dpkg here; set CHATTTS_ORT_INCLUDE to a directory with onnxruntime_c_api.h" >&2
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $SUITE main" \
  > "$work/sources.list"
APT=(apt-get -q -o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=-
     -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::archives=$work/archives" -o APT::Sandbox::User=root)
if ! "${APT[@]}" update >"$work/log" 2>&1 || ! (cd "$work" && "${APT[@]}" download libonnxruntime-dev >>"$work/log" 2>&1); then
  echo "onnxruntime headers: could not download Debian $SUITE's libonnxruntime-dev (the int8 kernel stays off):" >&2
  tail -3 "$work/log" >&2
  exit 0
fi
dpkg -x "$work"/libonnxruntime-dev_*.deb "$work/x"
mkdir -p "$DEST"
cp -r "$work/x/usr/include/onnxruntime/." "$DEST/"
echo "onnxruntime headers: $(basename "$work"/libonnxruntime-dev_*.deb) -> $DEST"
