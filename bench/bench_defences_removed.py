"""Each defence of the control plane taken out, one at a time, and the test that holds it run
against the code without it: the test must fail (it notices the defence gone), where it
passes on the code as it is.

The code is copied to a temporary folder, one line changed (the defence undone, as it was
before it, or as a careless change would undo it), and the test run with that copy first on
the path (the store service's processes inherit it). Nothing here measures speed.

Run: python bench/bench_defences_removed.py [--only NAME,...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S = "src/automlperf/"
# name: (file, the defence's text, the text without it, the test that holds it)
REMOVALS: dict[str, tuple[str, str, str, str]] = {
    "accuracy-bound": (
        S + "store/limits.py", "Accuracy = Annotated[float, within(0.0, 1.0)]",
        "Accuracy = Annotated[float, Rule(test=lambda v: True, says='any')]",
        "tests/store/test_service_calls.py::test_an_accuracy_that_is_not_from_0_to_1_is_refused_in_one_line"),
    "times-as-floats": (
        S + "store/service/calls.py", "if (c := _as_float(k) or wire.decoder(k)) is not None",
        "if (c := wire.decoder(k)) is not None",
        "tests/store/test_service_calls.py::test_times_come_as_numbers_of_either_kind_and_are_kept_as_floats"),
    "primary-only-calls": (
        S + "store/service/server.py", 'if call.name in PRIMARY_ONLY and role != "primary":',
        "if False:",
        "tests/store/test_service_attacks.py::test_calls_that_are_not_this_protocols_get_one_line_and_the_service_goes_on"),
    "loopback-counted": (
        S + "store/service/net.py", "    if ip.is_loopback or str(ip) in own:\n        return HERE",
        "    if ip.is_loopback or str(ip) in own:\n        return str(ip)",
        "tests/store/test_service_door.py::test_loopback_peers_count_as_this_one_host"),
    "greeting-size": (
        S + "store/service/net.py", "hello = await read_message(reader, wire.MAX_GREETING, compressed=False)",
        "hello = await read_message(reader, wire.MAX_REQUEST, compressed=False)",
        "tests/store/test_service_door.py::test_a_greeting_over_its_size_is_refused_from_its_header"),
    "greeting-uncompressed": (
        S + "store/service/net.py", "hello = await read_message(reader, wire.MAX_GREETING, compressed=False)",
        "hello = await read_message(reader, wire.MAX_GREETING, compressed=True)",
        "tests/store/test_service_door.py::test_a_compressed_greeting_is_refused"),
    "short-token-refused": (
        S + "store/service/client.py", "if len(token) < MIN_TOKEN:", "if False:",
        "tests/store/test_service_client.py::test_a_short_token_is_refused_by_the_client_and_the_service"),
    "token-mode-600": (
        S + "store/service/process.py", 'write_atomic(path, token + "\\n", mode=0o600)',
        'write_atomic(path, token + "\\n")',
        "tests/store/test_service_client.py::test_the_token_is_written_whole_for_its_owner_alone_and_new_each_session"),
    "ticker-survives": (
        S + "store/service/net.py", "except Exception as exc:  # noqa: BLE001 - heartbeats must go on being taken",
        "except StoreError as exc:",
        "tests/store/test_service_door.py::test_the_ticker_survives_any_failure_and_says_so_once"),
    "heartbeat-thread-survives": (
        S + "runner/replica.py", "except Exception as exc:  # noqa: BLE001 - whatever it was, the next beat tries",
        "except OSError as exc:",
        "tests/runner/test_replica.py::test_the_heartbeat_thread_survives_any_failure_and_says_so_once"),
    "pg-socket-only": (
        S + "store/pgserver.py", 'listen = self.host or ""', 'listen = self.host or "127.0.0.1"',
        "tests/store/test_pgserver.py::test_the_private_server_listens_on_its_socket_only"),
    "in-lists-in-parts": (
        # Both parts taken out: PostgreSQL's one array and SQLite's IN lists of IN_CHUNK, each
        # list one IN of all its ids (the array alone taken out leaves PostgreSQL the chunks,
        # which are within its limit). The test holds SQLite to its default limit.
        S + "store/reads.py",
        '    if conn.dialect.name == "postgresql":\n'
        '        return [column == sa.any_(sa.cast(sa.bindparam("one_of", list(values),\n'
        '                                                       type_=ARRAY(sa.BigInteger)),\n'
        '                                          ARRAY(sa.BigInteger)))]\n'
        '    ordered = list(values)\n'
        '    return [column.in_(ordered[i:i + IN_CHUNK]) for i in range(0, len(ordered), IN_CHUNK)]\n',
        "    return [column.in_(list(values))]\n",
        "tests/store/test_store.py::test_reads_of_more_ids_than_a_statement_takes_are_asked_in_parts"),
}


def run(name: str, removal: tuple[str, str, str, str], work: Path) -> tuple[str, float, str]:
    path, defence, without, test = removal
    copy = work / name
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / path
    text = target.read_text()
    if text.count(defence) != 1:
        return "the defence's text is not found once: update this table", 0.0, ""
    target.write_text(text.replace(defence, without))
    env = dict(os.environ, PYTHONPATH=str(copy / "src"))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-x", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    took = time.monotonic() - started
    said = next((line for line in done.stdout.splitlines() if line.startswith("E ")), "")
    return ("FAILS without it" if done.returncode == 1 else
            "passes without it" if done.returncode == 0 else f"pytest exit {done.returncode}"), took, said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help=f"of {', '.join(REMOVALS)}")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(REMOVALS)
    with tempfile.TemporaryDirectory(prefix="amp-removed-") as tmp:
        for name in names:
            verdict, took, said = run(name, REMOVALS[name], Path(tmp))
            print(f"{name:26} {verdict:18} {took:6.1f} s  {REMOVALS[name][3].split('::')[-1][:70]}"
                  f"{'  | ' + said.strip()[:110] if said else ''}", flush=True)


if __name__ == "__main__":
    main()
