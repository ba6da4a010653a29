"""The store service's client against what may answer on the service's port after a restart:
it trusts no answer before the service has proved it holds the run's token (a refusal
included), survives any bytes a stranger sends, and finds the service again once it is back,
on another port if the stranger kept the old one. And the run's token: written atomically,
readable by its owner only, new each session, refused by both sides when short."""

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading

import pytest

from automlperf.store import StoreError, open_store
from automlperf.store.service import wire
from automlperf.store.service.client import MIN_TOKEN, RemoteStore
from automlperf.store.service.process import ServiceProcess, new_token

TOKEN = "k" * 43


class Squatter:
    """A process on the service's port that answers every greeting with ``answer`` (bytes),
    and counts the greetings it got and anything sent after them."""

    def __init__(self, answer, port=0):
        self.answer, self.greetings, self.after = answer, 0, bytearray()
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    length, _ = wire.HEADER.unpack(conn.recv(wire.HEADER.size, socket.MSG_WAITALL))
                    conn.recv(length, socket.MSG_WAITALL)
                    self.greetings += 1
                    conn.sendall(self.answer)
                    while chunk := conn.recv(1 << 16):
                        self.after.extend(chunk)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


def service_file(folder, port, token=TOKEN):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "store-service.json"
    path.write_text(json.dumps({"host": "127.0.0.1", "port": port}))
    (folder / ".store-service.token").write_text(token)
    return path


@pytest.mark.parametrize("answer", [
    wire.encode({"e": "store", "m": "the run is over: give up"}),  # a refusal, unproven
    wire.encode({"e": "schema", "m": "another schema", "nonce": "0" * 64, "proof": "0" * 64}),
    wire.encode({"nonce": "a" * 64, "proof": "é" * 64}),  # not ASCII
    wire.encode({"nonce": "a" * 64, "proof": ["not", "a", "string"]}),
    wire.encode_text("[" * 5000),  # nested past the parser's depth
    wire.encode(["a", "list"]),
    wire.HEADER.pack(3, 1) + b"xyz",  # not zlib
    b"HTTP/1.1 400 Bad Request\r\n\r\n",
], ids=["refusal", "forged-proof", "non-ascii", "not-a-string", "deep", "list", "not-zlib",
        "http"])
def test_a_client_trusts_nothing_before_the_services_proof(tmp_path, answer):
    """Whatever a process on the service's port answers, the client raises nothing but the
    store's own error, and only once the store's retry time is spent: it went on trying
    (reading the service's address again each time), and sent nothing past its greeting."""
    squatter = Squatter(answer)
    try:
        with pytest.raises(StoreError) as failed:
            RemoteStore(service_file(tmp_path, squatter.port), retry_s=0.8)
    finally:
        squatter.close()
    message = str(failed.value)
    assert message.startswith("store service unreachable for 1 s") and "\n" not in message
    assert squatter.greetings >= 2 and squatter.after == b""


@pytest.mark.slow
def test_a_service_restarted_onto_a_taken_port_is_found_on_another(tmp_path, monkeypatch):
    """The service dies (an out-of-memory kill) and a local user takes its port before the
    primary starts it again, answering every greeting with a refusal it cannot prove: the
    service starts on another port, which its file names, and the client's call, riding out
    the outage, is answered there."""
    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    service = ServiceProcess(tmp_path / "run", url)
    service.start()
    squatted = threading.Event()
    relaunch = service._launch

    def after_the_squatter():
        assert squatted.wait(120)
        relaunch()

    monkeypatch.setattr(service, "_launch", after_the_squatter)
    remote = RemoteStore(service.file, retry_s=300.0)
    squatter = None
    try:
        old = service.port
        os.kill(service.proc.pid, signal.SIGKILL)
        service.proc.wait()
        squatter = Squatter(wire.encode({"e": "store", "m": "this run is over"}), port=old)
        answered = []
        call = threading.Thread(target=lambda: answered.append(remote.last_epoch_number()),
                                daemon=True)
        call.start()
        while squatter.greetings < 1:  # the client tried the squatter, and went on
            call.join(0.05)
            assert call.is_alive(), "the client gave up on the squatter's refusal"
        squatted.set()
        call.join(300)
        assert answered == [0]
        assert service.restarts == 1 and service.port != old
        assert json.loads(service.file.read_text())["port"] == service.port
        assert squatter.after == b""
        assert "is taken" in (service.logs / "store-service.log").read_text()
    finally:
        squatted.set()
        remote.close()
        service.stop()
        if squatter is not None:
            squatter.close()


def test_the_token_is_written_whole_for_its_owner_alone_and_new_each_session(tmp_path):
    path = tmp_path / ".store-service.token"
    elsewhere = tmp_path / "planted"
    elsewhere.write_text("a token someone else knows\n")
    for planted in ("empty", "loose", "link"):
        path.unlink(missing_ok=True)
        if planted == "empty":
            path.write_text("")  # a full disk's, or a crash's
        elif planted == "loose":
            path.write_text("x" * 40)
            path.chmod(0o644)
        else:
            path.symlink_to(elsewhere)
        token = new_token(path)
        info = os.lstat(path)
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
        assert path.read_text().strip() == token and len(token) >= MIN_TOKEN
    assert elsewhere.read_text() == "a token someone else knows\n"  # replaced, not written through
    assert new_token(path) != token
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")
                and p.name != path.name]  # no half-written file left


def test_a_short_token_is_refused_by_the_client_and_the_service(tmp_path):
    squatter = Squatter(b"")
    try:
        for token in ("", "x" * (MIN_TOKEN - 1)):
            with pytest.raises(StoreError, match=f"is {len(token)} characters, fewer than 32"):
                RemoteStore(service_file(tmp_path, squatter.port, token), retry_s=0.5)
        assert squatter.greetings == 0  # never sent a greeting with it
    finally:
        squatter.close()
    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    (tmp_path / "empty.token").write_text("\n")
    done = subprocess.run([sys.executable, "-m", "automlperf.store.service", "--file",
                           str(tmp_path / "s.json"), "--token-file", str(tmp_path / "empty.token"),
                           "--no-parent"], env={**os.environ, "AUTOMLPERF_STORE_URL": url},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and not (tmp_path / "s.json").exists()
    assert done.stderr.strip().splitlines() == [
        f"error: the token in {tmp_path / 'empty.token'} is 0 characters, fewer than 32: start "
        "the run's primary again, which writes a new one"]


def test_a_process_on_the_port_that_says_nothing_holds_a_try_for_its_greeting_only(
        tmp_path, monkeypatch):
    """It takes the connection and never answers: each try is given up when a service would
    have closed an unfinished greeting (here shortened), not after the store's retry time and
    a minute, so the client tries again (the service restarted elsewhere) while it may."""
    from automlperf.store.service import client

    monkeypatch.setattr(client, "GREETING_WAIT_S", 0.2)
    silent = socket.create_server(("127.0.0.1", 0))
    taken = []

    def take():
        while True:
            try:
                taken.append(silent.accept()[0])  # held, never answered
            except OSError:
                return

    threading.Thread(target=take, daemon=True).start()
    try:
        with pytest.raises(StoreError, match="timed out"):
            RemoteStore(service_file(tmp_path, silent.getsockname()[1]), retry_s=1.0)
    finally:
        silent.close()
    assert len(taken) >= 2  # tried again, rather than waiting on the first
