#!/bin/sh
# Create the virtual environment and install automlperf with its test tools.
# On a machine without an NVIDIA GPU this installs the CPU build of PyTorch; set TORCH_SPEC to
# choose another (e.g. TORCH_SPEC='torch==2.5.1+cu124' with PIP_EXTRA_INDEX_URL set).
set -eu
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if [ -n "${TORCH_SPEC:-}" ]; then
        spec=$TORCH_SPEC
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        spec="torch>=2.4"
    else
        spec="torch==2.13.0"
    fi
    echo "installing $spec"
    pip install --no-compile "$spec"
fi
# pip compiles what it installs one file at a time (torch alone: about 3,000 files); here every
# core does it, and a file that does not compile for this Python only keeps its source. The
# packages' own test suites (pandas', sympy's, scipy's...: a quarter of the files) are never
# imported and are left out, and so are the tools no run imports (pip, setuptools, mypy;
# pandas and pygments only for a checker or a traceback): 11 of the 50 CPU-s, and the first
# process that imports one of their modules compiles it. torch and its dependencies compile
# while the rest installs; the last pass compiles what is new and finds the rest current.
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
skip='/tests/|/site-packages/(pip|setuptools|mypy|mypyc|pandas|pygments)/'
compile() { "$VENV/bin/python" -m compileall -q -j 0 -x "$skip" "$site" > /dev/null 2>&1 || true; }
compile &
# pip's resolver spends about 20 CPU-s here evaluating the 85,000 links of PyPI's pages for
# these packages; uv resolves and installs the same in about 4 s. pip does it where it is
# pointed at another index than PyPI (a site's mirror: uv does not read pip's settings), or
# where uv cannot be had.
if [ -z "${PIP_INDEX_URL:-}" ] && ! pip config get global.index-url >/dev/null 2>&1 \
        && pip install --no-compile uv >/dev/null 2>&1 \
        && "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" -e ".[test]"; then
    :
else
    pip install --no-compile -e ".[test]"
fi
wait
compile
