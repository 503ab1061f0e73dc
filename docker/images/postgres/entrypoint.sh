#!/bin/bash
# First start on an empty $PGDATA: a cluster whose superuser is $POSTGRES_USER with
# $POSTGRES_PASSWORD (scram-sha-256 over the network, trust on the local socket), and the
# database $POSTGRES_DB; then (every start) PostgreSQL in the foreground, listening on all
# interfaces of the container.
set -euo pipefail
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: set POSTGRES_PASSWORD" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        createdb --username="$POSTGRES_USER" "$POSTGRES_DB"
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -c listen_addresses='*' "$@"
fi
exec "$@"
