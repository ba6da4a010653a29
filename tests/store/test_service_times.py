"""The store service's own time per call, by kind: percentiles read from logarithmic bins stay
within a bin of the exact ones, and a real service writes them beside its log, under its own
call names only (a client cannot add a name)."""

import json
import math
import random
import socket

import pytest

from automlperf.store.service.latency import PER_OCTAVE, CallTimes
from helpers import call, handshake

BIN = 2 ** (1 / PER_OCTAVE)


def exact(values, q):
    """The smallest value with at least ``q`` of them at or below it."""
    return sorted(values)[max(0, math.ceil(q * len(values)) - 1)]


def test_percentiles_from_the_bins_are_within_one_bin_of_the_exact_ones():
    rng = random.Random(7)
    times = CallTimes()
    values = {"heartbeat": [rng.lognormvariate(-9, 0.6) for _ in range(20_000)],
              "claim_trial": [rng.lognormvariate(-6, 1.5) for _ in range(3_000)],
              "tiny": [1e-8] * 10}
    for kind, xs in values.items():
        for x in xs:
            times.add(kind, x)
    summary = times.summary()
    assert set(summary) == set(values)
    for kind, xs in values.items():
        row = summary[kind]
        assert row["n"] == len(xs)
        assert row["max_ms"] == pytest.approx(1e3 * max(xs), rel=1e-3, abs=1e-4)
        assert row["mean_ms"] == pytest.approx(1e3 * sum(xs) / len(xs), rel=1e-3, abs=1e-4)
        for q in (0.5, 0.9, 0.99):
            truth = exact(xs, q)
            got = row[f"p{round(q * 100)}_ms"] / 1e3
            if kind == "tiny":  # below a microsecond: one bin, capped at the maximum
                assert got == pytest.approx(1e-8, abs=1e-7)
                continue
            assert truth * (1 - 1e-6) <= got * (1 + 1e-3) and got <= truth * BIN * 1.001, \
                (kind, q, truth, got)
        assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert "heartbeat 20000 calls" in times.line()
    # What two states of one service give: the calls in between, as if counted alone.
    earlier = json.loads(json.dumps(times.state()))
    later_only = CallTimes()
    for x in values["heartbeat"][:5000]:
        times.add("heartbeat", 3 * x)
        later_only.add("heartbeat", 3 * x)
    times.add("new_kind", 0.002)
    later_only.add("new_kind", 0.002)
    between = CallTimes.between(earlier, json.loads(json.dumps(times.state())))
    assert set(between.summary()) == {"heartbeat", "new_kind"}
    for kind, row in later_only.summary().items():
        got = between.summary()[kind]
        assert got["n"] == row["n"] and got["mean_ms"] == pytest.approx(row["mean_ms"], rel=1e-6)
        assert all(got[p] == row[p] for p in ("p50_ms", "p90_ms", "p99_ms"))
        assert row["max_ms"] <= got["max_ms"] <= row["max_ms"] * BIN * 1.001
    assert CallTimes().line() == "no calls" and CallTimes().summary() == {}


@pytest.mark.slow
@pytest.mark.postgres
def test_a_service_writes_its_calls_times_by_kind_under_its_own_names_only(service):
    from automlperf.store.service.client import RemoteStore
    from automlperf.store.service.process import CALLS_FILE

    remote = RemoteStore(service.file, primary_token=service.primary_token)
    run_id = remote.create_run("r", {}, {}, 3600.0, 1.0)
    seg = remote.start_segment(run_id, 1.0, 3600.0)
    rep = remote.register_replica(run_id, 0, seg, "n0", 1, [], 1.0)
    for i in range(25):
        remote.heartbeat(rep, 2.0 + i, 60.0)
    found = json.loads(service.file.read_text())
    sock = socket.create_connection((found["host"], found["port"]), timeout=120)
    handshake(sock, service.token_file.read_text().strip())
    for message in ({"op": "no_such_call_" + "x" * 50, "a": []}, ["not", "a", "call"],
                    {"op": ["unhashable"], "a": []}):
        assert set(call(sock, message)) == {"e", "m"}
    sock.close()
    remote.close()
    service.stop()
    written = json.loads((service.logs / CALLS_FILE).read_text())
    calls = written["calls"]
    assert set(calls) == {"open", "create_run", "start_segment", "register_replica",
                          "heartbeat", "other"}
    assert calls["heartbeat"]["n"] == 25 and calls["other"]["n"] == 3
    for row in calls.values():
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    log = (service.logs / "store-service.log").read_text()
    assert "calls served (the service's own time): " in log and "heartbeat 25 calls" in log
