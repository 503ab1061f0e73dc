#!/usr/bin/env bash
# The Debian packages the server and the test suite need, installed when missing (`make setup`
# runs this; so does .ci/run through it):
#   libpython3.11   the bundled Triton's Python backend stub links the shared libpython3.11
#   prometheus      promtool (rule and config checks, alert unit tests) and the Prometheus
#                   server (the observability test scrapes a real server); without them 8
#                   tests are skipped
#   chromium        the headless browser that plays the gateway's page in
#                   tests/server/test_gateway_page.py (Playwright drives it; its own download is
#                   not reachable); fonts-wqy-microhei draws the page's Chinese text
#   postgresql      a throwaway PostgreSQL server for tests/server/test_saved_voices.py (the saved
#                   voices' shared store; the tests start it with initdb + pg_ctl in a temp
#                   directory); the gateway itself needs only a URL to one
#
#   scripts/debian_packages.sh              install what is missing (apt-get, as root)
#   scripts/debian_packages.sh --check      list what is missing; exit 1 if anything is
#   scripts/debian_packages.sh --simulate   apt-get's simulation of installing all of them
#
# Without apt-get, or when the install fails (not root, no network), it says what to install
# by hand and exits 0: the tests that need a missing tool are then skipped, naming it.
set -euo pipefail
mode=${1:-install}
case "$mode" in install|--check|--simulate) ;; *) echo "usage: $0 [--check|--simulate]" >&2; exit 2;; esac

PACKAGES=(libpython3.11 prometheus chromium fonts-wqy-microhei postgresql)

present() {  # present PACKAGE: whether what the project uses of it is on this machine
  case "$1" in
    libpython3.11) ldconfig -p 2>/dev/null | grep 'libpython3\.11\.so\.1\.0' >/dev/null ;;  # no -q: an early exit would SIGPIPE ldconfig and fail the pipe
    prometheus) command -v promtool >/dev/null 2>&1 && [ -x /usr/bin/prometheus ] ;;
    chromium) [ -x /usr/bin/chromium ] ;;
    fonts-wqy-microhei) [ -f /usr/share/fonts/truetype/wqy/wqy-microhei.ttc ] ;;
    postgresql) compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null ;;
  esac
}

missing=()
for p in "${PACKAGES[@]}"; do present "$p" || missing+=("$p"); done

if [ "$mode" = --simulate ]; then
  exec apt-get -s install --no-install-recommends "${PACKAGES[@]}"
fi
if [ "$mode" = --check ]; then
  if [ ${#missing[@]} -eq 0 ]; then echo "debian packages: all present (${PACKAGES[*]})"; exit 0; fi
  echo "debian packages: missing ${missing[*]}"
  exit 1
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: no apt-get: install by hand the equivalents of Debian's ${missing[*]}" >&2
  exit 0
fi
echo "setup: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_install() { apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1; }
if ! apt_install && ! { apt-get update -q >/dev/null 2>&1 && apt_install; }; then
  echo "setup: could not install ${missing[*]} (not root? no package index?): install them by hand;" \
       "the tests that need them are skipped" >&2
fi
