"""Build the admission gate, the Triton backend behind ``chattts`` (``chattts_serving/gate/``).

``python -m chattts_serving.deploy.gate --out DIR`` (or :func:`build_gate`) compiles the gate's
sources (:data:`UNITS`) into ``DIR/chattts_gate/libtriton_chattts_gate.so`` with the host's C++
compiler (``$CXX``, else ``g++``, else ``c++``). The sources declare the part of Triton's C API
they use themselves (``gate/triton_api.h``), so no Triton headers are needed; the symbols
resolve when tritonserver loads the library. Builds are cached by the SHA-256 of sources,
compiler and flags (in ``$CHATTTS_GATE_CACHE``, else ``~/.cache/chattts-serving/gate``), so
that every server start after the first copies the library instead of compiling it. Files are
written under a temporary name and renamed, so that a server never loads a half-written
library.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .. import contract
from ..native import cache_dir as native_cache_dir
from ..native import compiler, write_atomically

GATE_DIR = Path(__file__).resolve().parents[1] / "gate"
UNITS = tuple(sorted(p for p in GATE_DIR.glob("*.cc") if not p.name.endswith("_test.cc")))
"""The gate's translation units, compiled into one library: every ``gate/*.cc`` but the C++ tests
(``*_test.cc``, which have a ``main``)."""
SOURCES = UNITS + tuple(sorted(GATE_DIR.glob("*.h")))
"""What a build depends on (its cache key): the units and the headers they include."""
FLAGS = ("-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread")
SANITIZER_FLAGS = ("-std=c++17", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                   "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread")
"""Flags of a gate built for a sanitizer run (``build_gate(..., sanitize=True)``): AddressSanitizer
and UndefinedBehaviorSanitizer, whose runtime must then be loaded into tritonserver
(:func:`sanitizer_runtime`)."""
LIBRARY = f"libtriton_{contract.GATE_BACKEND}.so"


class GateBuildError(RuntimeError):
    """The gate cannot be built here (no compiler, or the compiler failed: its output attached)."""


def _digest(cxx: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.name.encode() + b"\0" + src.read_bytes())
    h.update(" ".join((cxx, *flags)).encode())
    return h.hexdigest()


def cache_dir() -> Path:
    """Where compiled gates are kept: ``$CHATTTS_GATE_CACHE``, else ``~/.cache/chattts-serving/gate``."""
    return native_cache_dir("CHATTTS_GATE_CACHE", "gate")


def _compile(cxx: str, flags: tuple[str, ...], out: str) -> None:
    run = subprocess.run([cxx, *flags, f"-I{GATE_DIR}", *map(str, UNITS), "-o", out],
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise GateBuildError(f"building the admission gate failed ({cxx}, exit {run.returncode}):\n"
                             f"{run.stderr.strip()[-4000:]}")
    os.chmod(out, 0o755)


def build_gate(backends_dir: Path, sanitize: bool = False) -> Path:
    """Put the gate into ``backends_dir/chattts_gate/``: kept when up to date, else copied from
    the cache (:func:`cache_dir`), else compiled into the cache first; with ``sanitize``, built
    with :data:`SANITIZER_FLAGS`. Returns the library's path. Raises :class:`GateBuildError`
    without a compiler or when the compilation fails (set the profile's ``[entry] gate = false``
    to run without the gate)."""
    cxx = compiler()
    if cxx is None:
        raise GateBuildError("no C++ compiler (g++ or $CXX) to build the admission gate; install one "
                             "or set [entry] gate = false in the profile")
    out_dir = Path(backends_dir) / contract.GATE_BACKEND
    out_dir.mkdir(parents=True, exist_ok=True)
    lib, stamp = out_dir / LIBRARY, out_dir / f"{LIBRARY}.sha256"
    flags = SANITIZER_FLAGS if sanitize else FLAGS
    digest = _digest(cxx, flags)
    if lib.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return lib
    cached = cache_dir() / f"{digest}.so"
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(cached, lambda tmp: _compile(cxx, flags, tmp))
    write_atomically(lib, lambda tmp: shutil.copy2(cached, tmp))
    stamp.write_text(digest + "\n")
    return lib


def sanitizer_runtime() -> str:
    """The path of the compiler's AddressSanitizer runtime (``libasan.so``), to preload into
    tritonserver for a sanitizer build of the gate. Raises :class:`GateBuildError` when the
    compiler has none."""
    cxx = compiler()
    if cxx is None:
        raise GateBuildError("no C++ compiler for a sanitizer build")
    out = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False)
    path = Path(out.stdout.strip())
    if not path.is_absolute() or not path.exists():
        raise GateBuildError(f"{cxx} has no AddressSanitizer runtime (libasan.so)")
    return str(path.resolve())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chattts_serving.deploy.gate", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True,
                    help="Triton backend directory (e.g. /opt/tritonserver/backends)")
    args = ap.parse_args(argv)
    try:
        print(build_gate(args.out))
    except GateBuildError as exc:
        print(f"chattts-gate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
