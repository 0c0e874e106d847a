#!/usr/bin/env bash
# Start a real PostgreSQL for the store tests and print the line that points the tests at it:
#
#   pg_env="$(bash .ci/postgres.sh)" && eval "$pg_env"
#
# (Assign first: `eval "$(bash .ci/postgres.sh)"` alone hides a failure from `set -e`.)
#
# Idempotent: installs Debian's `postgresql` package only when it is missing, creates the cluster only
# when there is none, starts it only when it is down, and (re)sets role `rasd` (password `rasd`) and
# database `rasd_test`. Works as root in a bare Debian 12 container without systemd: pg_ctlcluster
# starts the server directly. Everything but the final `export` line goes to stderr.
set -euo pipefail

ROLE=rasd
PASSWORD=rasd
DATABASE=rasd_test
CLUSTER=main

log() { echo "postgres.sh: $*" >&2; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  elif [ "$(id -un)" = postgres ]; then
    "$@"
  else
    sudo -n -u postgres -- "$@"
  fi
}

# The newest server version installed under /usr/lib/postgresql (Debian's layout), or nothing.
server_version() {
  local dir
  for dir in /usr/lib/postgresql/*/bin/initdb; do
    [ -x "$dir" ] || continue
    dir="${dir%/bin/initdb}"
    echo "${dir##*/}"
  done | sort -n | tail -n 1
}

version="$(server_version)"
if [ -z "$version" ] || ! command -v pg_ctlcluster >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    log "PostgreSQL is not installed and only root can install it (apt-get install postgresql)"
    exit 1
  fi
  log "installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
  version="$(server_version)"
  if [ -z "$version" ]; then
    log "postgresql installed but no server found under /usr/lib/postgresql"
    exit 1
  fi
fi
log "PostgreSQL $version"

# The socket directory lives on /run, which a fresh container may not have kept from the install.
if [ "$(id -u)" = 0 ]; then
  install -d -m 2775 -o postgres -g postgres /var/run/postgresql
fi

if ! pg_lsclusters -h "$version" "$CLUSTER" >/dev/null 2>&1; then
  log "creating cluster $version/$CLUSTER"
  if [ "$(id -u)" = 0 ]; then
    pg_createcluster "$version" "$CLUSTER" >&2
  else
    as_postgres pg_createcluster "$version" "$CLUSTER" >&2
  fi
fi

# pg_lsclusters -h: version cluster port status owner datadir logfile
port="$(pg_lsclusters -h "$version" "$CLUSTER" | awk '{print $3}')"
status="$(pg_lsclusters -h "$version" "$CLUSTER" | awk '{print $4}')"
if [ "$status" != online ]; then
  log "starting cluster $version/$CLUSTER on port $port"
  if [ "$(id -u)" = 0 ]; then
    pg_ctlcluster "$version" "$CLUSTER" start >&2  # drops to the cluster owner itself
  else
    as_postgres pg_ctlcluster "$version" "$CLUSTER" start >&2
  fi
fi

# Wait for TCP connections on 127.0.0.1, the address the tests use (up to 60 s).
for _ in $(seq 1 120); do
  if pg_isready -q -h 127.0.0.1 -p "$port"; then
    break
  fi
  sleep 0.5
done
if ! pg_isready -q -h 127.0.0.1 -p "$port"; then
  log "PostgreSQL $version/$CLUSTER is not accepting connections on 127.0.0.1:$port"
  log "see /var/log/postgresql/postgresql-$version-$CLUSTER.log"
  exit 1
fi

psql_admin() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -p "$port" -d postgres "$@"; }

if [ "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" != 1 ]; then
  log "creating role $ROLE"
  psql_admin -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
else
  psql_admin -c "ALTER ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
fi
if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" != 1 ]; then
  log "creating database $DATABASE"
  psql_admin -c "CREATE DATABASE $DATABASE OWNER $ROLE"
fi

# Prove the URL the tests get works: password authentication over TCP.
if ! PGPASSWORD="$PASSWORD" psql -X -q -h 127.0.0.1 -p "$port" -U "$ROLE" -d "$DATABASE" -tAc "SELECT 1" >/dev/null; then
  log "cannot log in as $ROLE to $DATABASE on 127.0.0.1:$port (check pg_hba.conf)"
  exit 1
fi
log "ready: $DATABASE on 127.0.0.1:$port"
echo "export RASD_TEST_POSTGRES_URL=postgresql+psycopg://$ROLE:$PASSWORD@127.0.0.1:$port/$DATABASE"
