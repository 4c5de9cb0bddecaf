#!/usr/bin/env bash
# Replays the Hugging Face Space build order on this machine, to show the native extension gets built there:
#   1. an EMPTY virtual environment (no --system-site-packages: the Space image has none of our packages);
#   2. requirements.txt installed the way the Spaces builder does, with gradio[oauth]==sdk_version and `spaces`,
#      BEFORE the repository exists (so `.` cannot be a requirement);
#   3. the repository copied in (tracked and untracked, not ignored files, as a push would carry them);
#   4. app.py's bootstrap run with SPACE_ID set: it must build dart_core._native, which must then import from the
#      checkout the way `python app.py` runs, and app.py itself must import.
# Needs PyPI (gradio and friends). torch==2.13.0 is installed first: the CPU wheel (on this machine's disk); a bare
# `torch` from requirements.txt would pull the CUDA build. Usage: tests/space_build_replay.sh [WORKDIR]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-$(mktemp -d -t dart-space-replay.XXXXXX)}
PY=${PYTHON:-python3}
mkdir -p "$WORK"
t0=$SECONDS
step() { echo "::: $1 (t=$((SECONDS - t0))s)"; }

step "empty venv in $WORK/venv"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin/python"
(cd "$WORK" && "$V" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'gradio', 'dart_core')))") \
  || { echo "venv is not empty"; exit 1; }

step "requirements.txt, as the Spaces builder installs it (before the repository is copied)"
SDK_VERSION=$(sed -n 's/^sdk_version: *\([0-9][0-9.]*\).*/\1/p' "$REPO/spaces_config.yaml")
"$V" -m pip install --quiet torch==2.13.0
"$V" -m pip install --quiet -r "$REPO/requirements.txt" "gradio[oauth]==$SDK_VERSION" "uvicorn>=0.14.0" spaces
t_req=$SECONDS

step "copy the repository (no build outputs)"
mkdir -p "$WORK/app"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$WORK/app"
test ! -e "$WORK/app/build" && ! ls "$WORK"/app/dart_core/_native* >/dev/null 2>&1

step "bootstrap: SPACE_ID set, extension missing -> pip install --no-deps --no-build-isolation -e ."
cd "$WORK/app"
export SPACE_ID=replay/dart-demo HF_HUB_OFFLINE=1
t_b=$SECONDS
"$V" -c "
import logging, sys
logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s: %(message)s')
from dart_core import space
status = space.bootstrap_native(restart=lambda: None)   # the app re-executes itself here; the next steps do that
print('bootstrap:', status); sys.exit(status != 'built')
"
t_build=$((SECONDS - t_b))

step "a fresh interpreter in the checkout (as python app.py) imports the extension and the app"
"$V" -c "
import sys; sys.path.insert(0, '.')
import dart_core._native as n, dart_core
assert dart_core.__file__.startswith('$WORK/app/'), dart_core.__file__   # the checkout's package, with the built module
from dart_core import space; assert space.bootstrap_native() == 'present'
import app   # runs app.py's top: bootstrap (present now), gradio, the engine modules
print('native:', n.__file__); print('app argv on the Space:', ' '.join(space.space_app_argv()))
"
echo "::: requirements ${t_req}s, native build ${t_build}s, total $((SECONDS - t0))s"
echo "replay passed"
