# Shared by bin/demo and bin/test: make .venv with scrapekit installed, and system packages.
# Sourced, not run. Works on a fresh Debian with only Python 3.11, as root or with sudo.

PY="${PYTHON:-python3}"
command -v "$PY" >/dev/null || PY=python3.11

_apt() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  command -v apt-get >/dev/null || { echo "setup: apt-get not found; install '$*' by hand" >&2; return 1; }
  if [ -z "${_APT_UPDATED:-}" ]; then $sudo apt-get update -qq >/dev/null; _APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

ensure_venv() {  # ensure_venv ".[test]"
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "setup: scrapekit needs Python 3.11 or newer ($PY)" >&2; return 1; }
  if [ ! -x .venv/bin/python ]; then
    if ! "$PY" -m venv .venv >/dev/null 2>&1; then
      rm -rf .venv
      _apt "python3-venv" || _apt "python$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv"
      "$PY" -m venv .venv
    fi
  fi
  local stamp=".venv/.installed-$(cat pyproject.toml | cksum | cut -d' ' -f1)-$1"
  if [ ! -e "$stamp" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e "$1" 2>&1 | grep -v "^WARNING: Location" || true
    .venv/bin/python -c 'import scrapekit, plyvel, lxml' || { echo "setup: installing scrapekit into .venv failed" >&2; return 1; }
    touch "$stamp"
  fi
}

ensure_beanstalkd() {
  command -v beanstalkd >/dev/null || [ -x /usr/bin/beanstalkd ] || _apt beanstalkd
  command -v beanstalkd >/dev/null || [ -x /usr/bin/beanstalkd ] || { echo "setup: beanstalkd could not be installed" >&2; return 1; }
}
