#!/bin/sh
# The server image's entrypoint (Dockerfile, target `server`): run a named NInfer command, else ninfer-serve.
#   docker run IMAGE                                  -> ninfer-serve --host 0.0.0.0 --port 8080
#   docker run IMAGE /artifacts/m.ninfer --max-context 32768
#                                                     -> ninfer-serve /artifacts/m.ninfer --max-context 32768 --host 0.0.0.0
#   docker run IMAGE ninfer-serve ARGS...             -> ninfer-serve ARGS... (--host 0.0.0.0 added if absent)
#   docker run IMAGE ninfer ARGS... | ninfer-artifact ARGS... | ninfer-monitor ... | ninfer-bench ...
#                                                     -> that command, as given
#   docker run IMAGE sh -c '...'                      -> any other program on PATH, as given (debugging)
# ninfer-serve binds 127.0.0.1 by default, which nothing outside a container reaches, so the entrypoint
# adds --host 0.0.0.0 unless the arguments name a host. tests/operator/test_docker.py runs this script with
# a stub PATH (there is no Docker engine on the test machines) and checks every shape above.
set -eu

serve() {
  for arg in "$@"; do
    case "$arg" in --host|--host=*) exec ninfer-serve "$@" ;; esac
  done
  exec ninfer-serve "$@" --host 0.0.0.0
}

if [ $# -eq 0 ]; then
  exec ninfer-serve --host 0.0.0.0 --port 8080
fi
case "$1" in
  ninfer-serve) shift; serve "$@" ;;
  ninfer|ninfer-*) exec "$@" ;;
  -*) serve "$@" ;;
esac
# a program on PATH runs as given; anything else (an artifact path) is ninfer-serve's first argument
if command -v "$1" >/dev/null 2>&1 && [ ! -e "$1" ]; then
  exec "$@"
fi
serve "$@"
