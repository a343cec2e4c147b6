# Sourced by benchmarks/nlp.sh and benchmarks/serve_load.sh: a scratch folder and at most one `gpuvs serve`
# in the background, both gone when the script exits (SIGTERM, then SIGKILL after 3 s).
# Needs PY (the python to run). Sets WORK, SERVER_PID, PORT.
WORK=$(mktemp -d)
SERVER_PID=""
PORT=""

serve_cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    sleep 3
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap serve_cleanup EXIT

# start_server NAME ARGS...: `gpuvs serve --port 0 ARGS` with its output in $WORK/NAME.out and .err; PORT is set
# once it listens (empty when it did not start within 120 s or died).
start_server() {
  local name=$1
  shift
  $PY -m gpuvs serve --port 0 "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 1 480); do
    PORT=$(grep -o 'listening on 127.0.0.1:[0-9]*' "$WORK/$name.out" 2>/dev/null | cut -d: -f2)
    [ -n "$PORT" ] && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 0.25
  done
  return 1
}
