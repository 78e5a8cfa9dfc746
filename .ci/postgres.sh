# Sourced by .ci/run (or by hand: `source .ci/postgres.sh && pg_start`):
# a throwaway PostgreSQL server for the tests marked `postgres`.
#
# pg_start installs the Debian server packages when their binaries are missing
# (quietly; needs root and apt), runs initdb as the `postgres` system user
# (the server refuses to run as root) into a `mktemp -d` folder, listens on
# 127.0.0.1 only, on a free port, creates the database `autoremat_test` and
# exports AUTOREMAT_TEST_POSTGRES_URL. Any failure prints why and returns 0
# with the URL unset: the postgres tests then skip with that reason.
# pg_stop stops the server and removes the folder (.ci/run traps it on EXIT).

_pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
    echo "$dir"
  fi
}

_pg_fail() {
  echo "CI: PostgreSQL not started ($1); the postgres tests will be skipped" >&2
  if [ -n "${PG_TMP:-}" ] && [ -f "$PG_TMP/server.log" ]; then
    tail -n 20 "$PG_TMP/server.log" >&2 || true
  fi
  pg_stop
  return 0
}

pg_start() {
  PG_BIN=$(_pg_bin)
  if [ -z "$PG_BIN" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "CI: installing PostgreSQL (apt-get install postgresql)" >&2
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
          apt-get install -y -qq --no-install-recommends postgresql; } >/dev/null 2>&1 \
        || echo "CI: apt-get install postgresql failed" >&2
      PG_BIN=$(_pg_bin)
    fi
    [ -n "$PG_BIN" ] || { _pg_fail "no server binaries under /usr/lib/postgresql/*/bin"; return 0; }
  fi
  PG_RUN=()
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { _pg_fail "no 'postgres' system user to run it as"; return 0; }
    PG_RUN=(runuser -u postgres --)
  fi
  PG_TMP=$(mktemp -d "${TMPDIR:-/tmp}/autoremat-pg.XXXXXX") || { _pg_fail "mktemp failed"; return 0; }
  chmod 755 "$PG_TMP"
  if [ "$(id -u)" = 0 ]; then
    chown postgres: "$PG_TMP" || { _pg_fail "chown failed"; return 0; }
  fi
  local port
  port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
    || { _pg_fail "no free port"; return 0; }
  "${PG_RUN[@]}" "$PG_BIN/initdb" -D "$PG_TMP/data" -U autoremat --auth=trust -E UTF8 \
    --no-locale >"$PG_TMP/initdb.log" 2>&1 || { _pg_fail "initdb failed: $(tail -n 3 "$PG_TMP/initdb.log")"; return 0; }
  "${PG_RUN[@]}" "$PG_BIN/pg_ctl" -D "$PG_TMP/data" -l "$PG_TMP/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$PG_TMP -c fsync=off -c max_connections=200" \
    start >/dev/null 2>&1 || { _pg_fail "pg_ctl start failed"; return 0; }
  PG_STARTED=1
  "${PG_RUN[@]}" "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U autoremat autoremat_test \
    || { _pg_fail "createdb failed"; return 0; }
  export AUTOREMAT_TEST_POSTGRES_URL="postgresql+psycopg://autoremat@127.0.0.1:$port/autoremat_test"
  echo "CI: PostgreSQL $("$PG_BIN/pg_ctl" --version | awk '{print $3}') on 127.0.0.1:$port (data in $PG_TMP)" >&2
}

pg_stop() {
  if [ -n "${PG_STARTED:-}" ]; then
    "${PG_RUN[@]}" "$PG_BIN/pg_ctl" -D "$PG_TMP/data" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
    PG_STARTED=
  fi
  if [ -n "${PG_TMP:-}" ]; then
    rm -rf "$PG_TMP"
    PG_TMP=
  fi
  unset AUTOREMAT_TEST_POSTGRES_URL
}
