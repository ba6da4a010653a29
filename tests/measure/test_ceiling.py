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
