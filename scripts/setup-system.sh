#!/bin/sh
# Install the system programs the test suite drives for real: PostgreSQL (server binaries),
# SLURM with munge, Open MPI's mpiexec (a launcher other than SLURM), and Chromium (to
# render the report); and PgBouncer, which bench/bench_control.py measures against the store
# service. Debian/Ubuntu, as root or with
# password-less sudo; on other systems install the equivalents by hand.
set -eu
need=""
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || need="$need postgresql"
command -v slurmctld >/dev/null 2>&1 || need="$need slurm-wlm"
command -v munged >/dev/null 2>&1 || need="$need munge"
command -v mpiexec.openmpi >/dev/null 2>&1 || need="$need openmpi-bin"
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need="$need pgbouncer"
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need="$need chromium fonts-liberation"
[ -z "$need" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo="sudo -n"
else
    echo "setup-system: missing$need; install them (apt-get install$need) to run every test" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup-system: missing$need and no apt-get here; install them by hand" >&2
    exit 0
fi
echo "installing$need"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $need >/dev/null
