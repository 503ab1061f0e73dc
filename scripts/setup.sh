#!/usr/bin/env bash
# Create the project's virtual environment and install the serving stack, idempotently.
#
#   scripts/setup.sh            CPU host (default): onnxruntime, torch 2.13.0 CPU build
#   CHATTTS_ONNX=gpu scripts/setup.sh   GPU host: onnxruntime-gpu instead of onnxruntime
#
# Why each step exists (each was measured on a CPU host without CUDA):
# - torch==2.13.0 is installed first and repeated on every pip line, so no resolver swaps it
#   for a multi-gigabyte CUDA build.
# - torchaudio's compiled extensions are CUDA builds; on a host without libcudart they make
#   `import torchaudio` (and so `import ChatTTS`) fail, so they are removed there and
#   torchaudio falls back to pure Python.
# - ChatTTS imports `requests` without declaring it (listed in pyproject.toml).
# - Our int8 kernel builds against ONNX Runtime's C API header, which no wheel ships: Debian's
#   libonnxruntime-dev is unpacked into build/ (scripts/onnxruntime_headers.sh).
# - The bundled tritonserver's Python backend stub links the system libpython3.11, and the
#   deployment and observability tests run promtool and a Prometheus server: the Debian
#   packages are installed when missing (scripts/debian_packages.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
ONNX_FLAVOUR=${CHATTTS_ONNX:-cpu}
case "$ONNX_FLAVOUR" in cpu|gpu) ;; *) echo "setup: CHATTTS_ONNX must be cpu or gpu, not '$ONNX_FLAVOUR'" >&2; exit 2;; esac

# Debian packages: libpython3.11 for the stub, prometheus (promtool and the server) for the tests.
bash scripts/debian_packages.sh

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" torch==2.13.0
AGENTS=,agents; [ "$ONNX_FLAVOUR" = cpu ] || AGENTS=  # pipecat-ai needs the CPU onnxruntime (pyproject.toml)
"${PIP[@]}" torch==2.13.0 -e ".[$ONNX_FLAVOUR,dev,bench,gateway$AGENTS]" -r docker/requirements-validate.txt

# torchaudio: drop the CUDA-only extensions where the CUDA runtime is absent.
"$VENV/bin/python" - <<'PYEOF'
import ctypes.util, importlib.util, pathlib, sys
spec = importlib.util.find_spec("torchaudio")
if spec is None or not spec.submodule_search_locations:
    sys.exit(0)
lib = pathlib.Path(spec.submodule_search_locations[0]) / "lib"
try:
    ctypes.CDLL("libcudart.so.12")
    have_cuda = True
except OSError:
    have_cuda = False
if not have_cuda:
    for name in ("libtorchaudio.so", "_torchaudio.so"):
        p = lib / name
        if p.exists():
            p.unlink()
            print(f"setup: removed CUDA-only {p.name} (no libcudart on this host)")
PYEOF
# Our int8 kernel for the GPT step (chattts_serving/int8_kernel.py): ONNX Runtime's C API
# headers, which the wheel lacks, then the op compiled once into ~/.cache (both skip quietly
# where they cannot run; the engine then keeps MatMulNBits).
bash scripts/onnxruntime_headers.sh
"$VENV/bin/python" -m chattts_serving.int8_kernel
"$VENV/bin/python" -c "import ChatTTS, onnxruntime, tritonclient.grpc; print('setup: ok, onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
touch "$VENV/.setup-stamp"  # the venv is current: make gateway skips setup until pyproject.toml or this file changes
