"""The wire between peers: gRPC (grpcio) with mutual TLS, one unary method that delivers a message,
a mailbox of received messages and byte counters per link (docs/p2p.md, "Transport").

Every peer runs a server and keeps one channel to each other peer. With certificates, a server
accepts only clients whose certificate the federation's CA signed, and a message is kept only when
its sender index equals the index in the client certificate's common name (``center-<i>``), so a
peer cannot speak for another one.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from federation.p2p.wire import MODEL_KINDS, Message, MessageError, decode, encode

__all__ = ["Node", "TlsFiles", "PeerUnavailable", "METHOD", "common_name"]

METHOD = "/abps.p2p.Peer/Deliver"
_MAX = 256 * 2**20  # the largest message (a model of ~64 M fp32 values)
_OPTIONS = [("grpc.max_send_message_length", _MAX), ("grpc.max_receive_message_length", _MAX),
            ("grpc.enable_retries", 0), ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]


class ListenError(OSError):
    """This peer cannot serve on its address (unknown host, port taken or not allowed)."""


class PeerUnavailable(RuntimeError):
    """A peer did not answer (down, unreachable, or refused this peer's certificate)."""


def common_name(index: int) -> str:
    """The certificate common name of center ``index`` (also its TLS target name)."""
    return f"center-{index}"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one peer: the federation's CA certificate, its own certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


class Node:
    """One peer's endpoint.

    Args:
        index: the peer's center index.
        listen: ``host:port`` to serve on (port 0: any free port; see :attr:`port`).
        peers: ``{index: "host:port"}`` of every peer (own entry ignored).
        tls: certificates (None: plaintext, only for tests of the transport itself).
        capture: append every message this peer sends to this file (the privacy test scans it).
    """

    def __init__(self, index: int, listen: str, peers: dict[int, str], tls: TlsFiles | None,
                 capture: Path | None = None) -> None:
        self.index, self.peers, self.tls = int(index), dict(peers), tls
        self.capture = capture
        self._box: dict[tuple[str, int, int], Message] = {}
        self._cv = threading.Condition()
        self._lock = threading.Lock()
        #: ``{(direction, peer, kind): [messages, message bytes, payload bytes]}``, direction "sent" / "received"
        self.counters: dict[tuple[str, int, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        #: ``{(round, peer, kind): model payload bytes sent}`` (the per-link figure compared with the ledger)
        self.model_sent: dict[tuple[int, int, str], int] = defaultdict(int)
        self.refused = 0  # messages dropped: no / wrong certificate identity, malformed
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=_OPTIONS)
        handler = grpc.method_handlers_generic_handler(
            "abps.p2p.Peer", {"Deliver": grpc.unary_unary_rpc_method_handler(self._deliver)})
        self._server.add_generic_rpc_handlers((handler,))
        try:
            if tls is not None:
                ca, cert, key = tls.read()
                creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)
                self.port = self._server.add_secure_port(listen, creds)
            else:
                self.port = self._server.add_insecure_port(listen)
        except RuntimeError:  # grpc: the address does not resolve or cannot be bound
            self.port = 0
        if self.port == 0:
            raise ListenError(f"cannot listen on {listen}")
        self._server.start()
        self._channels: dict[int, grpc.Channel] = {}
        self._stubs: dict[int, grpc.UnaryUnaryMultiCallable] = {}

    # -- receiving ---------------------------------------------------------------------------
    def _deliver(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            msg = decode(request)
        except MessageError:
            with self._lock:
                self.refused += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed message")
        if self.tls is not None:
            names = context.auth_context().get("x509_common_name", [])
            if [n.decode() for n in names] != [common_name(msg.sender)]:
                with self._lock:
                    self.refused += 1
                context.abort(grpc.StatusCode.PERMISSION_DENIED, "sender does not match its certificate")
        with self._lock:
            c = self.counters[("received", msg.sender, msg.kind)]
            c[0] += 1
            c[1] += len(request)
            c[2] += msg.payload_bytes()
        with self._cv:
            self._box[(msg.kind, msg.round, msg.sender)] = msg
            self._cv.notify_all()
        return b""

    def wait(self, kind: str, round_idx: int, senders: Iterable[int], timeout: float) -> dict[int, Message]:
        """The messages ``(kind, round_idx)`` from every sender in ``senders`` that arrive within
        ``timeout`` seconds (taken out of the mailbox); a sender missing at the deadline is absent."""
        want = set(int(s) for s in senders)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                have = {s for s in want if (kind, round_idx, s) in self._box}
                left = deadline - time.monotonic()
                if have == want or left <= 0:
                    return {s: self._box.pop((kind, round_idx, s)) for s in have}
                self._cv.wait(min(left, 0.5))

    # -- sending -----------------------------------------------------------------------------
    def _stub(self, peer: int) -> grpc.UnaryUnaryMultiCallable:
        if peer not in self._stubs:
            target = self.peers[peer]
            if self.tls is not None:
                ca, cert, key = self.tls.read()
                creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
                ch = grpc.secure_channel(target, creds, options=[*_OPTIONS,
                                                                 ("grpc.ssl_target_name_override", common_name(peer))])
            else:
                ch = grpc.insecure_channel(target, options=_OPTIONS)
            self._channels[peer] = ch
            self._stubs[peer] = ch.unary_unary(METHOD)
        return self._stubs[peer]

    def take(self, kind: str) -> dict[int, Message]:
        """Every message of ``kind`` in the mailbox, any round (taken out): ``{sender: message}``."""
        with self._cv:
            keys = [k for k in self._box if k[0] == kind]
            return {k[2]: self._box.pop(k) for k in keys}

    def reset(self, peer: int) -> None:
        """Drop the channel to ``peer`` (it restarted: a fresh channel connects at once instead of
        waiting out the old one's reconnect backoff)."""
        ch = self._channels.pop(peer, None)
        self._stubs.pop(peer, None)
        if ch is not None:
            ch.close()

    def send(self, peer: int, msg: Message, timeout: float, wait_for_ready: bool = True) -> None:
        """Deliver ``msg`` to ``peer`` (``wait_for_ready``: wait until it is up, at most ``timeout``
        seconds; else a peer that is down fails at once).

        Raises:
            PeerUnavailable: the peer did not take it in time, or refused it.
        """
        data = encode(msg)
        try:
            self._stub(peer)(data, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as exc:
            raise PeerUnavailable(f"center {peer}: {exc.code().name}") from None
        with self._lock:
            if self.capture is not None:
                with self.capture.open("ab") as f:
                    f.write(data)
            c = self.counters[("sent", peer, msg.kind)]
            c[0] += 1
            c[1] += len(data)
            c[2] += msg.payload_bytes()
            if msg.kind in MODEL_KINDS:
                self.model_sent[(msg.round, peer, msg.kind)] += msg.payload_bytes()

    def send_many(self, peers: Iterable[int], msg: Message, timeout: float, wait_for_ready: bool = True) -> list[int]:
        """Send ``msg`` to every peer in ``peers`` in parallel; returns those that failed."""
        peers = list(peers)
        if not peers:
            return []
        failed: list[int] = []
        with futures.ThreadPoolExecutor(max_workers=min(8, len(peers))) as pool:
            jobs = {pool.submit(self.send, p, msg, timeout, wait_for_ready): p for p in peers}
            for job, p in jobs.items():
                try:
                    job.result()
                except PeerUnavailable:
                    failed.append(p)
        return sorted(failed)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._server.stop(grace=1.0)
