#!/usr/bin/env bash
# Installs the web chat Starling serves at http://localhost:5280/: the
# Converse.js release pinned in web/package.json (and web/package-lock.json),
# into web/node_modules/converse.js/dist, the default [http] web_client_dir.
# Needs npm. Nothing it fetches is committed.
set -euo pipefail
cd "$(dirname "$0")/../web"
want=$(node -p 'require("./package.json").dependencies["converse.js"]')
have=$(node -p 'try { require("./node_modules/converse.js/package.json").version } catch { "" }')
if [ -f node_modules/converse.js/dist/converse.min.js ] && [ "$want" = "$have" ]; then
  echo "web chat already installed: $(pwd)/node_modules/converse.js/dist"
  exit 0
fi
echo "installing Converse.js (web/package.json) with npm…"
npm ci --no-audit --no-fund --ignore-scripts --silent
echo "web chat installed: $(pwd)/node_modules/converse.js/dist (served at / by [http] listeners)"
