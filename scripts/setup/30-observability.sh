#!/usr/bin/env bash
# Observability parts for tests/monitor/, installed once:
#   prometheus, promtool   Debian's `prometheus` package (a real server the tests start on 127.0.0.1;
#                          promtool checks and unit-tests dashboards/alerts.yml)
#   chromium               Debian's `chromium` (headless rendering of the ninfer-monitor page)
#   tsc + @grafana/schema  npm, into $NINFER_TOOLS/grafana-schema (dashboards/*.json validated against
#                          Grafana's own TypeScript types); `tsc` is linked into $NINFER_TOOLS/bin
# Idempotent: with everything present it only checks versions (well under a second).
set -euo pipefail
TOOLS=${NINFER_TOOLS:-$HOME/.cache/ninfer-tools}
BIN=$TOOLS/bin
SCHEMA_DIR=$TOOLS/grafana-schema
GRAFANA_SCHEMA=@grafana/schema@13.2.3
TYPESCRIPT=typescript@5
mkdir -p "$BIN"

apt_updated=0
apt_install() {  # apt_install PKG... : install the Debian packages that are missing (one apt-get update)
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ $apt_updated -eq 0 ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# --- Prometheus + promtool, Chromium ------------------------------------------------------------------
apt_install prometheus chromium fonts-dejavu-core
# Debian's package may start a system prometheus on :9090 where an init system exists; the tests use
# their own config, data directory and a free port, so that one is left alone.
command -v prometheus >/dev/null || { echo "prometheus missing after install" >&2; exit 1; }
command -v promtool >/dev/null || { echo "promtool missing after install" >&2; exit 1; }
command -v chromium >/dev/null || { echo "chromium missing after install" >&2; exit 1; }

# --- TypeScript + Grafana's schema types --------------------------------------------------------------
if [ ! -x "$SCHEMA_DIR/node_modules/.bin/tsc" ] || [ ! -d "$SCHEMA_DIR/node_modules/@grafana/schema" ]; then
  command -v npm >/dev/null || apt_install npm
  mkdir -p "$SCHEMA_DIR"
  [ -f "$SCHEMA_DIR/package.json" ] || echo '{"name": "ninfer-grafana-schema", "private": true}' >"$SCHEMA_DIR/package.json"
  npm install --prefix "$SCHEMA_DIR" --no-audit --no-fund --silent "$TYPESCRIPT" "$GRAFANA_SCHEMA"
fi
ln -sf "$SCHEMA_DIR/node_modules/.bin/tsc" "$BIN/tsc"
"$BIN/tsc" --version >/dev/null
echo "observability tools ready: $(prometheus --version 2>&1 | head -1 | cut -d' ' -f1-3); chromium;" \
  "tsc $("$BIN/tsc" --version | cut -d' ' -f2) with @grafana/schema in $SCHEMA_DIR"
