"""A replica's start-up, part by part: when its process started (to the kernel's tick, not
psutil's whole-second boot time), and the line its log gets."""

import re
import subprocess
import sys
import time

from automlperf.runner.launch import LAUNCHED_ENV, process_started_at
from automlperf.runner.worker import startup_line


def test_a_process_start_is_read_to_the_tick():
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "from automlperf.runner.launch import "
                          "process_started_at; print(process_started_at())"],
                         capture_output=True, text=True, check=True).stdout
    # Started after `before` (a tick of slack) and before it printed.
    assert before - 0.02 <= float(out) <= time.time()
    assert process_started_at() <= time.time()


def test_the_start_up_line_names_each_part():
    created = process_started_at()
    line = startup_line(created + 1.5, created + 4.0, {LAUNCHED_ENV: f"{created - 0.25:.3f}"},
                        created)
    found = re.fullmatch(r"launch ([\d.]+) s, imports 1\.50 s, opening 2\.50 s", line)
    assert found and abs(float(found.group(1)) - 0.25) < 0.011
    # Started by no launcher that says when (a site's own): no launch part.
    assert startup_line(created + 1.0, created + 1.0, {}, created) == \
        "imports 1.00 s, opening 0.00 s"
    assert startup_line(created, created, {LAUNCHED_ENV: "soon"}).startswith("imports")
    # Read from the kernel when not given: this process's own start, to a tick or two.
    read = re.fullmatch(r"imports ([\d.-]+) s, opening 0\.00 s",
                        startup_line(created + 1.0, created + 1.0, {}))
    assert read and abs(float(read.group(1)) - 1.0) < 0.5
