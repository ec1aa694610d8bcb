#!/bin/sh
# Interpreter of the Bazel Python toolchain: execs the workspace's virtualenv
# Python. This file is reached through runfiles symlinks; the real path of the
# script locates the source tree (tools/python/ is two levels below the root).
root="$(dirname "$(readlink -f "$0")")/../.."
python="${SMART_REPLAY_PYTHON:-$root/.venv/bin/python3.11}"
if [ ! -x "$python" ]; then
  echo "venv_python3.sh: no interpreter at $python (run \`make install\` first)" >&2
  exit 127
fi
exec "$python" "$@"
