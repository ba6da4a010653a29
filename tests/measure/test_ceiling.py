"""A node's measured ceiling: a CPU's is the faster of its two dense kernels, both kept."""

import json
import subprocess
import sys

from automlperf.measure import ceiling


def test_a_cpus_ceiling_is_the_faster_of_its_matrix_product_and_convolution():
    rate = ceiling.cpu_rate("fp32", seconds=0.2)
    both = (rate["matmul_ops_per_s"], rate["conv_ops_per_s"])
    assert min(both) > 0 and rate["ops_per_s"] == max(both)
    assert rate["kernel"] == ("conv3x3" if both[1] > both[0] else "matmul")
    assert rate["products"] >= 1 and rate["convolutions"] >= 1 and rate["precision"] == "fp32"


def test_the_measurement_as_a_run_makes_it_describes_the_node_and_its_kernel():
    done = subprocess.run([sys.executable, "-m", "automlperf.measure.ceiling", "--devices", "cpu",
                           "--threads", "1", "--seconds", "0.2"],
                          capture_output=True, text=True, check=True)
    node = json.loads(done.stdout.strip().splitlines()[-1])
    (cpu,) = node["ceiling"]
    assert cpu["device"] == "cpu" and cpu["threads"] == 1 and cpu["kernel"] in ("matmul", "conv3x3")
    assert node["ceiling_ops"] == cpu["ops_per_s"] and node["system"]["cpu"]


def test_the_ends_measurement_is_started_early_and_measures_once_told():
    """The end's process imports first and measures only when called: one process however
    often it is prepared; one never called is ended; one whose replica went away (its stdin
    closed) exits without measuring; a failure is the node's error, not an exception."""
    end = ceiling.EndMeasurement(["cpu"], "fp32", 1, seconds=0.1)
    end.prepare()
    first = end._proc
    end.prepare()
    assert end._proc is first
    node = end()
    assert node["ceiling_ops"] > 0 and node["devices"] == ["cpu"] and first.returncode == 0

    unused = ceiling.EndMeasurement(["cpu"], "fp32", 1, seconds=0.1)
    unused.prepare()
    unused.close()
    assert unused._proc.returncode is not None

    orphan = subprocess.run([*unused.cmd], input="", capture_output=True, text=True, timeout=300)
    assert orphan.returncode == 0 and orphan.stdout == ""

    broken = ceiling.EndMeasurement(["nosuchdevice"], "fp32", 1, seconds=0.1)()
    assert broken["error"].startswith("the measurement failed: ") and "ceiling_ops" not in broken


def test_a_repetition_another_process_stalled_does_not_lower_the_rate(monkeypatch):
    """The rate is the median repetition's: on a clock the steps themselves advance, a step
    stalled ten times over (the cores taken a moment) leaves it as the others make it."""
    clock = [0.0]
    monkeypatch.setattr(ceiling.time, "perf_counter", lambda: clock[0])
    costs = iter([0.5] + [0.1, 0.1, 1.0, 0.1, 0.1, 0.1])  # the warm-up, then the timed steps

    def step():
        clock[0] += next(costs)

    reps, elapsed, median = ceiling._timed(step, seconds=1.35)
    assert (reps, round(elapsed, 6), round(median, 6)) == (5, 1.4, 0.1)
    synced = []
    costs = iter([0.2] * 9)
    reps, _, median = ceiling._timed(step, seconds=0.9, group=4, sync=lambda: synced.append(1))
    # The warm-up and two groups, each synchronised once; a group's time over its steps.
    assert (reps, round(median, 6), len(synced)) == (8, 0.2, 3)
