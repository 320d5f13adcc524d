"""``abps launch``: start a federation's peers as separate processes, wait for them, gather one
results.json and one MLflow run, and leave no process behind (docs/p2p.md, "Launching").

Every peer runs in its own process group (its own session), and dies with the launcher
(``PR_SET_PDEATHSIG``); the launcher ends every group on its way out: at the end, on Ctrl-C /
SIGTERM, or as soon as one peer fails.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etl.errors import InputError
from etl.io import check_writable
from federation.core.config import RunConfig, config_hash
from federation.data.load import federation_id
from federation.methods.registry import run_label
from federation.p2p.certs import make_federation_certs
from federation.p2p.local import center_list
from federation.p2p.peer import check_p2p_config
from federation.run.results import strict_json, write_results
from federation.run.runner import RunResult, results_document
from federation.run.tracking import (
    COHORT_NAME_TAG,
    COHORT_TAG,
    HASH_TAG,
    KIND_RUN,
    KIND_TAG,
    KIND_TRAIN,
    LABEL_TAG,
    METHOD_TAG,
    SEED_TAG,
    Tracker,
)

__all__ = ["PeerEntry", "read_peers_file", "local_peers", "launch", "wire_report", "on_this_machine"]

#: how :func:`_host_addresses` writes every address of this machine (where every peer listens on 0.0.0.0)
THIS_MACHINE = "this machine"
#: how often ``--on-failure restart`` restarts one peer
RESTARTS = 3


@dataclass(frozen=True)
class PeerEntry:
    """One line of a peers file: the center, where its peer listens, and how to start it (a
    command prefix such as ``ip netns exec site1`` or ``ssh site1``; empty: here when the host is
    this machine, else by hand on that host)."""

    center_id: str
    host: str
    port: int
    prefix: tuple[str, ...] = field(default=())

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def read_peers_file(path: str | Path, center_ids: list[str], starts: bool = False) -> list[PeerEntry]:
    """Parse a peers file: one line ``center_id host:port [command prefix ...]`` per center
    (``#`` comments and blank lines ignored), returned in the cohort's center order. ``starts``:
    the caller starts the peers through their command prefixes (``abps launch``), whose first
    word must then be a command on PATH.

    Raises:
        InputError: unreadable file, a bad line, an unknown / repeated / missing center (naming the line).
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"--peers {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"--peers {path}: not UTF-8 text (byte {exc.start})") from None
    got: dict[str, PeerEntry] = {}
    where: dict[tuple[str, int], int] = {}
    for no, line in enumerate(lines, 1):
        try:
            words = shlex.split(line.split("#", 1)[0])
        except ValueError as exc:  # an unclosed quote
            raise InputError(f"--peers {path}, line {no}: {exc}") from None
        if not words:
            continue
        if len(words) < 2 or ":" not in words[1]:
            raise InputError(f"--peers {path}, line {no}: expected 'center_id host:port [command prefix]'")
        host, _, port = words[1].rpartition(":")
        if not port.isdigit() or not 0 < int(port) < 65536 or not host:
            raise InputError(f"--peers {path}, line {no}: bad address {words[1]!r}")
        if ":" in host:  # a peer listens on IPv4 (0.0.0.0)
            raise InputError(f"--peers {path}, line {no}: {words[1]!r} is an IPv6 address; peers listen on IPv4 "
                             "(give an IPv4 address or a host name)")
        cid = words[0]
        if cid not in center_ids:
            raise InputError(f"--peers {path}, line {no}: center_id {cid!r} is not in the cohort's centers.parquet")
        if cid in got:
            raise InputError(f"--peers {path}, line {no}: center_id {cid!r} listed twice")
        if (host, int(port)) in where:
            raise InputError(f"--peers {path}, line {no}: address {words[1]} is also line {where[host, int(port)]}'s "
                             "(each center listens on its own port)")
        if starts and len(words) > 2 and shutil.which(words[2]) is None:
            raise InputError(f"--peers {path}, line {no}: command {words[2]!r} of the prefix is not found on PATH")
        where[host, int(port)] = no
        got[cid] = PeerEntry(cid, host, int(port), tuple(words[2:]))
    missing = [c for c in center_ids if c not in got]
    if missing:
        raise InputError(f"--peers {path}: no line for center_id {missing[0]!r} (every center of the cohort takes part)")
    _refuse_shared_ports(path, where)
    return [got[c] for c in center_ids]


def _this_machine(address: str) -> bool:
    """Whether an IPv4 ``address`` is one of this machine's own (a socket binds to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def _host_addresses(host: str) -> frozenset[str]:
    """The addresses ``host`` resolves to, each loopback address and each of this machine's own
    addresses (its LAN address, ``0.0.0.0``) as :data:`THIS_MACHINE`, where every peer listens on
    ``0.0.0.0``; empty when it does not resolve (the peer that listens or dials there says so)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return frozenset()
    out = set()
    for *_, sockaddr in infos:
        a = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
            a = a.ipv4_mapped
        here = a.is_loopback or a.is_unspecified or (a.version == 4 and _this_machine(str(a)))
        out.add(THIS_MACHINE if here else str(a))
    return frozenset(out)


def on_this_machine(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine: a loopback address, ``0.0.0.0`` or one
    of its own addresses. The launcher starts a peer without a command prefix here only then."""
    return THIS_MACHINE in _host_addresses(host)


def _refuse_shared_ports(path: str | Path, where: dict[tuple[str, int], int]) -> None:
    """Refuse two lines whose port is equal and whose hosts resolve to a common address: every peer
    listens on ``0.0.0.0:port``, so the two would take one port of one machine. Only hosts that
    share a port with another host name are resolved, each once.

    Raises:
        InputError: naming the file and both lines.
    """
    by_port: dict[int, list[tuple[int, str]]] = {}
    for (host, port), no in where.items():
        by_port.setdefault(port, []).append((no, host))
    resolved: dict[str, frozenset[str]] = {}
    for port, lines in sorted(by_port.items()):
        if len(lines) < 2:
            continue
        lines.sort()
        for k, (no, host) in enumerate(lines):
            if host not in resolved:
                resolved[host] = _host_addresses(host)
            mine = resolved[host]
            for first, other in lines[:k]:
                if mine & resolved[other]:
                    raise InputError(f"--peers {path}, line {no}: address {host}:{port} is the port of line "
                                     f"{first}'s {other}:{port} on the same machine (each center listens on its "
                                     "own port)")


def _free_ports(k: int) -> list[int]:
    socks = []
    try:
        for _ in range(k):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_peers(center_ids: list[str]) -> list[PeerEntry]:
    """One peer per center on this host, each on a free loopback port."""
    return [PeerEntry(c, "127.0.0.1", p) for c, p in zip(center_ids, _free_ports(len(center_ids)))]


def _die_with_parent() -> None:
    """In the child before exec: receive SIGKILL when the launcher dies (Linux ``PR_SET_PDEATHSIG``)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class _Group:
    """The peer processes of a launch; :meth:`stop` ends every process group."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, i: int, argv: list[str], log: Path) -> None:
        with log.open("wb") as f:
            self.procs[i] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                             start_new_session=True, preexec_fn=_die_with_parent)

    def stop(self, grace: float = 3.0) -> None:
        live = [p for p in self.procs.values() if p.poll() is None]
        for p in live:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs.values():  # the group may hold children even when the leader is gone
            _signal_group(p.pid, signal.SIGKILL)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _last_line(log: Path) -> str:
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    errs = [x for x in lines if x.startswith("error:")]
    return (errs or lines or [""])[-1][:300]


def peer_argv(entry_index: int, entries: list[PeerEntry], cohort: Path, method: str, seed: int, rounds: int | None,
              config: Path | None, peers_file: Path, certs: Path | None, output: Path, timeout: float,
              params: list[str], capture: Path | None = None, checkpoint: Path | None = None,
              rejoin: bool = False, await_rejoin: bool = False, start_timeout: float = 120.0) -> list[str]:
    """The ``abps peer`` command line of center ``entry_index`` (after its prefix, if any)."""
    argv = [sys.executable, "-m", "cli", "peer", "--cohort", str(cohort), "--center", entries[entry_index].center_id,
            "--peers", str(peers_file), "--method", method, "--seed", str(seed), "--output", str(output),
            "--timeout", f"{timeout:g}", "--start-timeout", f"{start_timeout:g}",
            "--force"]  # the result file is the launch's own (a kept --workdir holds an earlier one)
    if rounds is not None:
        argv += ["--rounds", str(rounds)]
    if config is not None:
        argv += ["--config", str(config)]
    argv += ["--certs", str(certs)] if certs is not None else ["--insecure"]
    for p in params:
        argv += ["--param", p]
    if capture is not None:
        argv += ["--capture", str(capture)]
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint)]
    if rejoin:
        argv.append("--rejoin")
    if await_rejoin:
        argv.append("--await-rejoin")
    return [*entries[entry_index].prefix, *argv]


def wire_report(results: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """Bytes measured by the peers beside the ledger's.

    ``wire_payload_bytes`` counts, as the ledger does, one payload per link and round that
    carried a model (the larger of the two directions); ``wire_payload_bytes_both_directions`` what
    both directions carried; ``wire_message_bytes`` every message as framed by the peers (header
    and arrays, all kinds); ``wire_control_bytes`` the messages that carry no model (hello, coalition
    and validation scores, bye).
    """
    per: dict[tuple[Any, ...], int] = {}
    both = 0
    msg_bytes = control = 0
    for r in results:
        me = int(r["center"])
        for x in r["model_sent"]:
            to, kind = int(x["peer"]), x["kind"]
            # a star link joins a center and the server's endpoint (up: sent by the center, down: to it);
            # a mesh link joins two centers
            link = (("star", me) if kind == "up" else ("star", to)) if kind in ("up", "down") else \
                ("mesh", min(me, to), max(me, to))
            key = (int(x["round"]), *link)
            per[key] = max(per.get(key, 0), int(x["bytes"]))
            both += int(x["bytes"])
        for c in r["counters"]:
            if c["direction"] == "sent":
                msg_bytes += c["message_bytes"]
                if c["kind"] not in ("model", "up", "down"):
                    control += c["message_bytes"]
    wire = sum(per.values())
    led = sum(int(x["model_bytes"]) for x in ledger)
    return {"wire_payload_bytes": wire, "ledger_bytes": led,
            "wire_over_ledger": wire / led if led else None,
            "wire_payload_bytes_both_directions": both, "wire_message_bytes": msg_bytes,
            "wire_control_bytes": control,
            "ledger_metadata_bytes": sum(int(x["metadata_bytes"]) for x in ledger),
            "refused_messages": sum(int(r.get("refused", 0)) for r in results)}


def launch(cfg: RunConfig, cohort: str | Path, seed: int, output: str | Path, *, local: int | None = None,
           peers_file: str | Path | None = None, method_args: dict[str, Any] | None = None,
           tracking_uri: str | None = None, experiment: str = "abps", track: bool = True,
           timeout: float = 60.0, workdir: str | Path | None = None, capture: bool = False,
           on_failure: str = "stop", on_start: Any = None, start_timeout: float = 120.0) -> dict[str, Any]:
    """Run one seed of ``cfg`` as a peer-to-peer federation and write ``output`` (results.json).

    Args:
        local: start this many peers on this host (must equal the cohort's number of centers).
        peers_file: or take the peers from this file (:func:`read_peers_file`).
        method_args: ``{"rounds", "config", "params"}`` as given on the command line (handed to
            every ``abps peer``).
        timeout: seconds a peer waits for another's message in a round.
        start_timeout: seconds a peer waits for the others to come up, and for a restarting one
            to rejoin.
        workdir: where certificates, the peer list, logs and per-peer results go, kept (default:
            a new folder beside ``output``, removed when the launch ends, whether it finished or
            not: it holds the peers' private keys).
        capture: every peer also writes the messages it sends to ``workdir/sent-<i>.bin``.
        on_failure: when a peer process dies: ``stop`` the federation, let the others
            ``continue`` without it (unavailable from then on), or ``restart`` it (at most
            :data:`RESTARTS` times): it rejoins from its checkpoint.
        on_start: called with the ``{center: pid}`` of the started peers (tests).

    Returns:
        the results.json document (with a ``p2p`` section: bytes, peers, transport).

    Raises:
        InputError: a bad option, cohort or peers file, or a peer that failed (its last error line).
    """
    check_p2p_config(cfg)
    if on_failure not in ("stop", "continue", "restart"):
        raise InputError(f"--on-failure {on_failure!r}: expected stop, continue or restart")
    if on_failure == "restart" and cfg.early_stopping.enabled:
        raise InputError("--on-failure restart: a rejoining peer cannot restore early stopping's best round; "
                         "use continue, or turn early_stopping off")
    cohort = Path(cohort)
    ids = center_list(cohort)
    if (local is None) == (peers_file is None):
        raise InputError("give either --local N or --peers FILE")
    if local is not None and local != len(ids):
        raise InputError(f"--local {local}: the cohort {cohort} has {len(ids)} centers (one peer per center)")
    out = Path(output).resolve()
    if out.is_dir():
        raise InputError(f"--output {output}: is a directory (give a file such as results.json)")
    check_writable(out, "--output")
    entries = local_peers(ids) if local is not None else read_peers_file(peers_file, ids, starts=True)  # type: ignore[arg-type]
    own_dir = workdir is None
    out.parent.mkdir(parents=True, exist_ok=True)  # as abps train does for its --output
    if own_dir:
        wd = Path(tempfile.mkdtemp(prefix=".abps-launch-", dir=out.parent))
    else:
        wd = Path(workdir)  # type: ignore[arg-type]
        if wd.exists() and not wd.is_dir():
            raise InputError(f"--workdir {workdir}: is a file, not a folder")
        try:
            wd.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--workdir {workdir}: cannot make the folder "
                             f"({exc.strerror or exc.__class__.__name__})") from None
    try:  # a folder of its own goes whatever happens (it holds the peers' private keys), unless kept to read
        return _launch_in(cfg, cohort, seed, out, ids, entries, wd, args=method_args or {}, local=local,
                          peers_file=peers_file, tracking_uri=tracking_uri, experiment=experiment, track=track,
                          timeout=timeout, capture=capture, on_failure=on_failure, on_start=on_start,
                          start_timeout=start_timeout)
    finally:
        if own_dir and not capture:
            import shutil

            shutil.rmtree(wd, ignore_errors=True)


def _launch_in(cfg: RunConfig, cohort: Path, seed: int, out: Path, ids: list[str], entries: list[PeerEntry],
               wd: Path, *, args: dict[str, Any], local: int | None, peers_file: str | Path | None,
               tracking_uri: str | None, experiment: str, track: bool, timeout: float, capture: bool,
               on_failure: str, on_start: Any, start_timeout: float) -> dict[str, Any]:
    """:func:`launch` once its options are checked, in the work folder ``wd``."""
    pf = wd / "peers.txt"
    pf.write_text("".join(f"{e.center_id} {e.address}\n" for e in entries))
    certs = wd / "certs"
    make_federation_certs(certs, {i: e.host for i, e in enumerate(entries)})
    group = _Group()
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    results: list[dict[str, Any]] = []
    manual: list[str] = []
    restarts: dict[int, int] = {}
    gone: set[int] = set()

    def argv_of(i: int, rejoin: bool = False) -> list[str]:
        return peer_argv(i, entries, cohort.resolve(), cfg.method, seed, args.get("rounds"), args.get("config"),
                         pf, certs, wd / f"result-{i}.json", timeout, list(args.get("params", [])),
                         wd / f"sent-{i}.bin" if capture else None, wd / f"ckpt-{i}.pt", rejoin,
                         await_rejoin=on_failure == "restart", start_timeout=start_timeout)

    try:
        for i, e in enumerate(entries):
            if e.prefix or on_this_machine(e.host):
                group.start(i, argv_of(i), wd / f"peer-{i}.log")
            else:
                manual.append(shlex.join(argv_of(i)))
        if manual:
            print("start these peers on their hosts (same cohort path, certificates copied from "
                  f"{certs}):\n" + "\n".join(manual), file=sys.stderr)
        if on_start is not None:
            on_start({i: p.pid for i, p in group.procs.items()})
        while True:
            states = {i: p.poll() for i, p in group.procs.items() if i not in gone}
            bad = {i: rc for i, rc in states.items() if rc not in (None, 0)}
            for i, rc in sorted(bad.items()):
                if on_failure == "restart" and restarts.get(i, 0) < RESTARTS:
                    restarts[i] = restarts.get(i, 0) + 1
                    print(f"peer of center {ids[i]!r} exited with code {rc}; restarting it "
                          f"({restarts[i]} of {RESTARTS})", file=sys.stderr)
                    group.start(i, argv_of(i, rejoin=True), wd / f"peer-{i}.rejoin-{restarts[i]}.log")
                elif on_failure == "continue" and i != 0:
                    print(f"peer of center {ids[i]!r} exited with code {rc}; the others go on without it",
                          file=sys.stderr)
                    gone.add(i)
                else:
                    log = wd / (f"peer-{i}.rejoin-{restarts[i]}.log" if restarts.get(i) else f"peer-{i}.log")
                    # the peer names the launcher's own peer list; the user knows the file they gave
                    line = _last_line(log).replace(f"--peers {pf}", f"--peers {peers_file}" if peers_file
                                                   else f"--local {local}")
                    raise InputError(f"peer of center {ids[i]!r} exited with code {rc}: {line or 'no output'}")
            if not bad and all(rc == 0 for rc in states.values()):
                break
            time.sleep(0.1)
        for i in sorted(set(group.procs) - gone):
            results.append(json.loads((wd / f"result-{i}.json").read_text()))
    finally:
        group.stop()
        for s, h in old.items():
            signal.signal(s, h)
    doc = _document(cfg, cohort, seed, results, entries, tracking_uri, experiment, track)
    write_results(out, doc)
    return doc


def _document(cfg: RunConfig, cohort: Path, seed: int, results: list[dict[str, Any]], entries: list[PeerEntry],
              tracking_uri: str | None, experiment: str, track: bool) -> dict[str, Any]:
    """results.json of the launch (the simulator's format, plus ``p2p``) and its MLflow run."""
    ref = results[0]
    for r in results[1:]:  # every replica reports the same federation-wide figures (null: undefined)
        if r["summary"]["final_auroc_mean"] != ref["summary"]["final_auroc_mean"]:
            raise InputError(f"center {r['center']} reports another final AUROC than center {ref['center']} "
                             "(replicas diverged)")
    summary = dict(ref["summary"])
    fields = set(RunResult.__dataclass_fields__)
    # strict JSON wrote an undefined mean (NaN) as null
    res = RunResult(**{k: (math.nan if v is None and k.startswith(("final_", "rel_")) else v)
                       for k, v in summary.items() if k in fields and k != "clinical"})
    res.history, res.per_center, res.artifacts = ref["history"], ref["per_center"], ref["artifacts"]
    doc = results_document(cfg, str(cohort), [res])
    doc["n_centers"] = len(entries)
    doc["metric"] = "auroc"
    doc["dropped_centers"] = {}
    everyone = ref.get("federation_results") or results
    doc["p2p"] = {"transport": "grpc", "mutual_tls": True, "peers": len(entries),
                  **wire_report(everyone, ref["ledger"])}
    if track:
        tracker = Tracker(tracking_uri, experiment)
        cid = federation_id(cohort)
        label = run_label(cfg.method, cfg.params)
        common = {METHOD_TAG: cfg.method, LABEL_TAG: label, COHORT_TAG: cid, COHORT_NAME_TAG: cohort.resolve().name}
        with tracker.parent(f"{label} seeds {seed} (peer-to-peer)",
                            {"method": cfg.method, "seeds": str(seed), "n_centers": len(entries), "p2p": "grpc"},
                            {KIND_TAG: KIND_TRAIN, **common}):
            with tracker.child(f"{label} seed {seed}", {"seed": seed, "cohort_id": cid},
                               {KIND_TAG: KIND_RUN, SEED_TAG: str(seed), HASH_TAG: config_hash(cfg, cid), **common}):
                tracker.log_dict_params(cfg.model_dump(mode="json"))
                for row in res.history:
                    tracker.log_metrics({k: v for k, v in row.items() if k != "round"}, int(row["round"]))
                tracker.log_final(res.summary())
                tracker.log_metrics({k: float(v) for k, v in doc["p2p"].items()
                                     if isinstance(v, int | float) and not isinstance(v, bool)}, res.rounds_run)
                for name, obj in res.artifacts.items():
                    tracker.log_json(obj, name)
                tracker.log_json(cfg.model_dump(mode="json"), "config.json")
            tracker.log_json(doc, "results.json")
    json.loads(strict_json(doc))  # the document is strict JSON before it is written
    return doc
