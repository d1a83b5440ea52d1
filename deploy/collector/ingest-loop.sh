#!/usr/bin/env sh
# Load the OTLP JSON files that deploy/collector/file-export.yaml rotated out into the tape store,
# oldest first, and remove each once `agenttape ingest` has stored it. The file being written
# (traces.jsonl, logs.jsonl) is left alone until the collector rotates it (or pass --final after the
# collector stopped, to load those too).
#   OTEL_EXPORT_DIR=/var/lib/otelcol/export AGENTTAPE_DB=/data/agenttape.duckdb ingest-loop.sh [--final]
set -eu
dir="${OTEL_EXPORT_DIR:-/var/lib/otelcol/export}"
every="${INGEST_EVERY_SECONDS:-10}"
ingest_closed() {
  # rotated backups are named traces-<timestamp>.jsonl / logs-<timestamp>.jsonl
  for f in $(ls -1tr "$dir"/traces-*.jsonl "$dir"/logs-*.jsonl 2>/dev/null); do
    agenttape ingest "$f" && rm -f "$f"
  done
}
if [ "${1:-}" = "--final" ]; then
  ingest_closed
  for f in "$dir"/traces.jsonl "$dir"/logs.jsonl; do
    if [ -s "$f" ]; then agenttape ingest "$f" && rm -f "$f"; fi
  done
  exit 0
fi
while true; do
  ingest_closed
  sleep "$every"
done
