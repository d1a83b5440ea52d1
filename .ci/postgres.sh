#!/usr/bin/env bash
# Start a throwaway PostgreSQL on 127.0.0.1 for the session-store tests.
#
#   url=$(bash .ci/postgres.sh)        # installs if needed, starts (or reuses) the server, prints the URL
#   bash .ci/postgres.sh stop          # stops the server it started
#
# The SQLAlchemy URL is the only thing printed on stdout; it is also written to
# "$AGENTTAPE_PG_DIR/url" (mode 0600). Progress goes to stderr. Idempotent: a server already
# running from the same folder is reused. The port is a free one picked at start.
set -euo pipefail

PG_DIR="${AGENTTAPE_PG_DIR:-/tmp/agenttape-pg}"
DATA="$PG_DIR/data"
PG_USER_NAME="agenttape"
PG_DB_NAME="agenttape_test"

log() { echo "postgres.sh: $*" >&2; }

find_bindir() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
    done
    if command -v pg_config >/dev/null 2>&1; then
        d="$(pg_config --bindir)"
        if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
    fi
    return 1
}

BINDIR="$(find_bindir || true)"
if [ -z "$BINDIR" ]; then
    if [ "$(id -u)" != 0 ]; then log "PostgreSQL is not installed and this is not root"; exit 1; fi
    log "installing PostgreSQL (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y --no-install-recommends postgresql >&2
    BINDIR="$(find_bindir)"
fi

# PostgreSQL refuses to run as root: run its tools as the 'postgres' account then.
if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
        useradd --system --home-dir "$PG_DIR" --shell /bin/bash postgres
    fi
    as_pg() { runuser -u postgres -- "$@"; }
    RUN_AS=postgres
else
    as_pg() { "$@"; }
    RUN_AS="$(id -un)"
fi

pg_ctl() { as_pg "$BINDIR/pg_ctl" -D "$DATA" "$@"; }

if [ "${1:-start}" = "stop" ]; then
    if [ -f "$DATA/PG_VERSION" ] && pg_ctl status >/dev/null 2>&1; then
        pg_ctl stop -m fast -w >&2
    fi
    exit 0
fi

mkdir -p "$PG_DIR"
chmod 0700 "$PG_DIR"
chown "$RUN_AS" "$PG_DIR"

if [ ! -f "$DATA/PG_VERSION" ]; then
    log "initdb in $DATA"
    rm -rf "$DATA"
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$PG_DIR/password"
    chmod 0600 "$PG_DIR/password"
    chown "$RUN_AS" "$PG_DIR/password"
    as_pg "$BINDIR/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 --no-sync >&2 2>&1 || as_pg "$BINDIR/initdb" -D "$DATA" -U postgres \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >&2
fi
PASSWORD="$(cat "$PG_DIR/password")"

alive() {  # a live (not zombie) process
    local state
    state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
    [ -n "$state" ] && [ "$state" != Z ]
}

server_up() {
    [ -f "$PG_DIR/port" ] && pg_ctl status >/dev/null 2>&1 \
        && as_pg "$BINDIR/pg_isready" -h 127.0.0.1 -p "$(cat "$PG_DIR/port")" -t 5 -q
}

if server_up; then
    PORT="$(cat "$PG_DIR/port")"
    log "reusing the server on 127.0.0.1:$PORT"
else
    if [ -f "$DATA/postmaster.pid" ]; then  # a server that died or hangs: clear it out
        OLD_PID="$(head -1 "$DATA/postmaster.pid")"
        if alive "$OLD_PID"; then
            pg_ctl stop -m immediate -w -t 20 >&2 || kill -9 "$OLD_PID" 2>/dev/null || true
        fi
        rm -f "$DATA/postmaster.pid"
    fi
    PORT="$("$(command -v python3 || command -v python)" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    echo "$PORT" > "$PG_DIR/port"
    log "starting on 127.0.0.1:$PORT"
    pg_ctl start -w -t 60 -l "$PG_DIR/server.log" \
        -o "-c listen_addresses=127.0.0.1 -p $PORT -k $DATA -c fsync=off" >&2 \
        || { cat "$PG_DIR/server.log" >&2; exit 1; }
fi

psql_pg() { as_pg "$BINDIR/psql" -h "$DATA" -p "$PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }

for _ in $(seq 1 30); do
    if as_pg "$BINDIR/pg_isready" -h 127.0.0.1 -p "$PORT" -q; then break; fi
    sleep 0.5
done

if [ "$(psql_pg -c "SELECT 1 FROM pg_roles WHERE rolname='$PG_USER_NAME'")" != 1 ]; then
    psql_pg -c "CREATE ROLE $PG_USER_NAME LOGIN PASSWORD '$PASSWORD'" >&2
else
    psql_pg -c "ALTER ROLE $PG_USER_NAME LOGIN PASSWORD '$PASSWORD'" >&2
fi
if [ "$(psql_pg -c "SELECT 1 FROM pg_database WHERE datname='$PG_DB_NAME'")" != 1 ]; then
    psql_pg -c "CREATE DATABASE $PG_DB_NAME OWNER $PG_USER_NAME" >&2
fi

URL="postgresql+psycopg://$PG_USER_NAME:$PASSWORD@127.0.0.1:$PORT/$PG_DB_NAME"
umask 077
echo "$URL" > "$PG_DIR/url"
echo "$URL"
