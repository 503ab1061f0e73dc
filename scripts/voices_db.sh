#!/usr/bin/env bash
# A local PostgreSQL for the gateway's saved voices (`make voices-db`): creates the cluster on
# first use, starts it when it is not running, and prints the CHATTTS_VOICE_STORE URL.
#
#   scripts/voices_db.sh          start (idempotent)
#   scripts/voices_db.sh stop     stop it
#
# VOICES_DB_DIR (default ~/.local/share/chattts-serving/voices-db; as root
# /var/lib/chattts-serving/voices-db, since PostgreSQL refuses to run as root and the cluster
# then belongs to the `postgres` user, whom root's home does not let in) and VOICES_DB_PORT
# (default 5433, beside a system PostgreSQL's 5432). It listens on 127.0.0.1 only with trust
# authentication: a developer's store on this host, not a deployment's (docker/compose.yaml's
# voices-db service is that). The binaries are Debian's postgresql (scripts/debian_packages.sh).
set -euo pipefail
PORT=${VOICES_DB_PORT:-5433}
if [ "$(id -u)" = 0 ]; then
    DIR=${VOICES_DB_DIR:-/var/lib/chattts-serving/voices-db}
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    AS=(runuser -u postgres --)
else
    DIR=${VOICES_DB_DIR:-$HOME/.local/share/chattts-serving/voices-db}
    AS=()
fi
BIN=$(dirname "$(command -v initdb || compgen -G '/usr/lib/postgresql/*/bin/initdb' | sort -V | tail -1 || true)")
[ -x "$BIN/pg_ctl" ] || { echo "voices-db: PostgreSQL is not installed (make setup installs Debian's postgresql)" >&2; exit 1; }

if [ "${1:-start}" = stop ]; then
    "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -m fast -w stop
    exit
fi
if [ ! -f "$DIR/data/PG_VERSION" ]; then
    mkdir -p "$DIR"
    [ ${#AS[@]} = 0 ] || chown postgres "$DIR"
    "${AS[@]}" "$BIN/initdb" -D "$DIR/data" -A trust -U postgres -E UTF8 >/dev/null
fi
if ! "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
    "${AS[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w start \
        -o "-p $PORT -h 127.0.0.1 -k $DIR"
fi
echo "voices-db: PostgreSQL on 127.0.0.1:$PORT, data in $DIR/data (stop: $0 stop)"
echo "export CHATTTS_VOICE_STORE=postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
