#!/bin/bash
# automlperf on Flux (e.g. El Capitan): one replica per node, each a job of its own
# (`flux submit --cc`), so that a node that dies ends its replica only.
# Submit with:
#   flux batch --env=RUN_DIR=/p/lustre/automlperf/run1 --env=DATA_DIR=/p/lustre/imagenet automlperf.flux
# CONFIG (default: official, the configuration shipped with automlperf), DURATION (default
# 1h) and PYTHON (default python3) may be passed the same way, and the time limit a
# duration needs with it:
#   flux batch -t $(automlperf job-time --duration 4h --scan-time 6m --scheduler flux) --env=DURATION=4h ...
# The primary asks `flux job timeleft` and starts no clock the job cannot hold.
# Resubmitting the script continues an interrupted run.
#flux: -N 4
# For the default 1h: the run, the grace in which its epochs in flight finish (a quarter of
# it), its start-up (the private server; the dataset scan, 6 minutes allowed) and the result
# (`automlperf job-time --duration 1h --scan-time 6m --scheduler flux`).
#flux: -t 90m
#flux: --job-name=automlperf
#flux: --output=automlperf-{{id}}.out

set -uo pipefail
: "${RUN_DIR:?pass --env=RUN_DIR=/shared/path/run1}"
: "${DATA_DIR:?pass --env=DATA_DIR=/shared/path/imagenet}"
CONFIG=${CONFIG:-official}
DURATION=${DURATION:-1h}
PYTHON=${PYTHON:-python3}
NNODES=$(flux resource list -no {nnodes})
mkdir -p "$RUN_DIR/logs" "$RUN_DIR/postgres"

# A private PostgreSQL server on this node; its folder records this Flux job, which the next
# job asks `flux jobs` about before it takes the store over.
"$PYTHON" -m automlperf.store.pgserver start --dir "$RUN_DIR/postgres" \
    --replicas "$NNODES" > "$RUN_DIR/postgres/url" || exit 1
export AUTOMLPERF_STORE_URL="$(cat "$RUN_DIR/postgres/url")"
export AUTOMLPERF_STORE_PASSWORD_FILE="$RUN_DIR/postgres/pg.password"
trap '"$PYTHON" -m automlperf.store.pgserver stop --dir "$RUN_DIR/postgres"' EXIT

if [ -f "$RUN_DIR/run.json" ]; then
    set -- --resume
else
    set -- --config "$CONFIG" --data-dir "$DATA_DIR" --duration "$DURATION"
fi
"$PYTHON" -m automlperf.cli run --launcher external --replicas "$NNODES" \
    --run-dir "$RUN_DIR" "$@" >> "$RUN_DIR/logs/primary.log" 2>&1 &
primary=$!
trap 'kill -TERM "$primary" 2>/dev/null' TERM INT

# One job per node, its replica number its id of --cc ({cc}): one `flux run` of every
# replica would lose them all when a node dies (every rank of a job is critical) or, 30 s
# after the first exits, to its exit-timeout. Flux passes the environment on; the logs go
# on where a resubmitted job's left them.
flux submit --cc="0-$((NNODES - 1))" -N1 -n1 --exclusive --wait \
    sh -c 'exec "$0" -m automlperf.cli worker --run-dir "$1" --replica-index "$2" \
        --wait 1800 >> "$1/logs/replica-$2.log" 2>&1' "$PYTHON" "$RUN_DIR" {cc} &
replicas=$!
# A primary that ends first (it refused the data, or this job's time limit cannot hold the
# run) would leave the replicas waiting for its session for half an hour: end them.
(while kill -0 "$primary" 2>/dev/null; do sleep 5; done; sleep 10
 kill -TERM "$replicas" 2>/dev/null) &
watcher=$!
while kill -0 "$replicas" 2>/dev/null; do wait "$replicas"; done
kill "$watcher" 2>/dev/null

status=0
wait "$primary" || status=$?
while kill -0 "$primary" 2>/dev/null; do wait "$primary" && status=0 || status=$?; done
exit "$status"
