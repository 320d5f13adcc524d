"""The peer-to-peer federation (federation/p2p, docs/p2p.md): a peer's engine equals its row of the
stacked engine, a peer loads only its own rows, messages round-trip, and `abps launch` on separate
processes gives the simulator's final AUROC with wire payload bytes equal to the ledger's, leaving no
process behind; payloads hold no identifier."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch

from federation.core.config import build_config
from federation.data.synthetic import write_fedprox_cohort
from federation.data.tensors import FederatedData
from federation.engine.mlp import AdamState, StackedEngine
from federation.methods import get_method
from federation.p2p.engine import PeerEngine
from federation.p2p.launch import launch, read_peers_file
from federation.p2p.local import announce, build_local, center_list, read_own_rows
from federation.p2p.wire import Message, MessageError, decode, encode
from federation.run import checkpoint
from federation.run.runner import run_one
from tests.cli_helpers import refused as _refused

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fedprox_cohort(tmp_path_factory.mktemp("p2p") / "c", n_centers=3, seed=2, mean_size=60.0)


def _cfg(method: str, rounds: int):
    return build_config(method, get_method(method).default_config, None, rounds)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_peer_reads_only_its_own_center_and_builds_its_row_of_the_federation(cohort: Path):
    cfg = _cfg("fedavg", 2)
    full = FederatedData.from_cohort(cohort, preprocessing=cfg.data)
    ids = center_list(cohort)
    rows = [read_own_rows(cohort, c) for c in ids]
    for i, r in enumerate(rows):
        assert r.cohort["center_id"].unique().to_list() == [ids[i]]
        assert "stay_id" not in r.cohort.columns and "subject_id" not in r.cohort.columns
    hellos = [announce(r, cfg.data) for r in rows]
    assert "stay_id" not in json.dumps(hellos)
    for i, r in enumerate(rows):
        loc, _ = build_local(r, hellos, i, cfg.data)
        assert loc.feature_names == full.feature_names
        for s in ("train", "val", "test"):
            a, b = loc.splits[s], full.splits[s]
            lo, n = int(b.offsets[i]), int(b.n[i])
            assert torch.equal(a.packed_x[:-1], b.packed_x[lo:lo + n])
            assert a.mask.shape[1] == b.mask.shape[1]  # padded to the federation's width


def test_the_peer_engine_trains_its_center_as_the_stacked_engine_does(cohort: Path):
    cfg = _cfg("fedavg", 2)
    full = FederatedData.from_cohort(cohort, preprocessing=cfg.data)
    eng = StackedEngine(full, cfg.engine, 5)
    p = eng.init_params()
    st = AdamState.zeros_like(p)
    for r in range(2):
        eng.train_round(p, st, r)
    ids = center_list(cohort)
    rows = [read_own_rows(cohort, c) for c in ids]
    hellos = [announce(r, cfg.data) for r in rows]
    for i, r in enumerate(rows):
        loc, _ = build_local(r, hellos, i, cfg.data)
        pe = PeerEngine(loc, cfg.engine, 5, i, full.n_train)
        q = pe.init_params()
        sq = AdamState.zeros_like(q)
        for rr in range(2):
            pe.train_round(q, sq, rr)
        assert int(sq.t[0]) == int(st.t[i])  # the same number of local steps
        for k in q:
            # same batches, masks and widths; a batched product over 1 vs 3 centers may round the
            # last bit differently: a few float32 ulps of the parameter's size
            torch.testing.assert_close(q[k][0], p[k][i], rtol=8 * 2**-23, atol=8 * 2**-23 * float(p[k][i].abs().max()))


def test_messages_round_trip_and_malformed_ones_are_refused():
    t = torch.randn(3, 4)
    msg = Message("model", 2, 1, {"x": 1}, {"w": t.to(torch.bfloat16), "b": t, "v": t.double()})
    back = decode(encode(msg))
    assert (back.kind, back.round, back.sender, back.body) == ("model", 2, 1, {"x": 1})
    assert torch.equal(back.arrays["w"].float(), t.to(torch.bfloat16).float())
    assert torch.equal(back.arrays["b"], t) and torch.equal(back.arrays["v"], t.double())
    assert msg.payload_bytes() == 12 * 2 + 12 * 4 + 12 * 8
    data = encode(msg)
    for bad in (data[:-1], data + b"x", b"\x00\x00", b"\xff\xff\xff\xff{}"):
        with pytest.raises(MessageError):
            decode(bad)


def test_a_peers_file_is_read_in_the_cohorts_order_and_bad_lines_are_named(tmp_path: Path):
    ids = ["a", "b"]
    f = tmp_path / "peers.txt"
    f.write_text("# sites\nb 10.0.0.2:7001 ip netns exec s2\na 10.0.0.1:7000\n")
    got = read_peers_file(f, ids)
    assert [(e.center_id, e.address, e.prefix) for e in got] == [
        ("a", "10.0.0.1:7000", ()), ("b", "10.0.0.2:7001", ("ip", "netns", "exec", "s2"))]
    from etl.errors import InputError

    for text, needle in (("a 10.0.0.1\n", "line 1"), ("a h:1\na h:2\n", "listed twice"), ("a h:1\n", "'b'"),
                         ("z h:1\n", "not in the cohort"),
                         ("a h:7000\nb h:7000\n", "line 2: address h:7000 is also line 1's"),
                         ("a [::1]:7000\nb h:1\n", r"line 1: '\[::1\]:7000' is an IPv6 address"),
                         ("a h:1 'ssh\nb h:2\n", "line 1: No closing quotation")):
        f.write_text(text)
        with pytest.raises(InputError, match=needle):
            read_peers_file(f, ids)
    # one port of one machine under two host names: every peer listens on 0.0.0.0:port, so this
    # machine's own addresses (0.0.0.0, its LAN address where it has a route) are loopback's too
    here = [("a 0.0.0.0:7101\nb 127.0.0.1:7101\n",
             "line 2: address 127.0.0.1:7101 is the port of line 1's 0.0.0.0:7101 on the same machine")]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("198.51.100.1", 9))  # UDP: picks the routed source address, sends nothing
            lan = probe.getsockname()[0]
        here.append((f"a localhost:7101\nb {lan}:7101\n",
                     f"line 2: address {lan}:7101 is the port of line 1's localhost:7101 on the same machine"))
    except OSError:  # no route: the machine has no address but loopback
        pass
    for text, needle in (*here, ("a 127.0.0.1:7101\nb localhost:7101\n",
                          "line 2: address localhost:7101 is the port of line 1's 127.0.0.1:7101 on the same machine"),
                         ("a 127.0.0.2:7101\nb 127.0.0.1:7101\n",
                          "line 2: address 127.0.0.1:7101 is the port of line 1's 127.0.0.2:7101 on the same machine")):
        f.write_text(text)
        with pytest.raises(InputError, match=needle) as exc:
            read_peers_file(f, ids)
        assert str(exc.value).startswith(f"--peers {f}, line 2: ") and "\n" not in str(exc.value)
    # other machines, other ports, or a host that does not resolve (its peer names it) are accepted
    for text in ("a 10.0.0.1:7101\nb 10.0.0.2:7101\n", "a localhost:7101\nb 127.0.0.1:7102\n",
                 "a 198.51.100.7:7101\nb 127.0.0.1:7101\n",
                 "a nosuchhost.invalid:7101\nb localhost:7101\n"):
        f.write_text(text)
        assert [e.address for e in read_peers_file(f, ids)] == text.replace("a ", "").replace("b ", "").split()
    f.write_bytes(b"a h:1\n\xff\xfe\n")
    with pytest.raises(InputError, match=r"peers.txt: not UTF-8 text \(byte 6\)"):
        read_peers_file(f, ids)
    # a command prefix is checked where the peers are started through it (abps launch), not by a peer
    f.write_text("a h:1 nosuchcommand-xyz --flag\nb h:2\n")
    assert read_peers_file(f, ids)[0].prefix == ("nosuchcommand-xyz", "--flag")
    with pytest.raises(InputError, match="line 1: command 'nosuchcommand-xyz' of the prefix is not found on PATH"):
        read_peers_file(f, ids, starts=True)


def test_the_launcher_starts_here_the_peers_whose_host_is_this_machine():
    from federation.p2p.launch import on_this_machine

    # loopback by name or address, and 0.0.0.0, are this machine; a TEST-NET address and a name
    # that does not resolve are not (their peers are printed to be started by hand)
    assert [on_this_machine(h) for h in ("127.0.0.1", "localhost", "127.0.0.2", "0.0.0.0")] == [True] * 4
    assert [on_this_machine(h) for h in ("198.51.100.7", "nosuchhost.invalid")] == [False, False]


def test_a_peers_file_resolves_each_host_that_shares_a_port_once(tmp_path: Path, monkeypatch):
    import federation.p2p.launch as lm

    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, *args, **kw):
        asked.append(host)
        return real(host, *args, **kw)

    monkeypatch.setattr(lm.socket, "getaddrinfo", getaddrinfo)
    f = tmp_path / "peers.txt"
    f.write_text("a localhost:7001\nb localhost:7002\nc 127.0.0.1:7003\n")  # no port shared: nothing resolved
    read_peers_file(f, ["a", "b", "c"])
    assert asked == []
    f.write_text("a 10.0.0.1:7001\nb 10.0.0.2:7001\nc 10.0.0.1:7002\nd 10.0.0.2:7002\n")
    read_peers_file(f, ["a", "b", "c", "d"])
    assert sorted(asked) == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize("method", ["fedavg", "abps", "abps-x"])  # abps-x: bf16 wire, momentum, metadata, early stop
def test_launch_gives_the_simulators_result_and_the_ledgers_bytes(method: str, cohort: Path, tmp_path: Path):
    rounds, seed = 3, 4
    cfg = _cfg(method, rounds)
    sim = run_one(cfg, FederatedData.from_cohort(cohort, min_train=cfg.min_train, preprocessing=cfg.data), seed)
    pids: dict[int, int] = {}
    doc = launch(cfg, cohort, seed, tmp_path / "r.json", local=3, track=False, capture=True,
                 workdir=tmp_path / "w", method_args={"rounds": rounds}, on_start=pids.update)
    got = doc["seeds"][str(seed)]
    assert abs(got["final_auroc_mean"] - sim.final_auroc_mean) <= 1e-6
    assert got["model_bytes"] == sim.model_bytes and got["rounds_run"] == sim.rounds_run
    p = doc["p2p"]
    assert p["wire_payload_bytes"] == p["ledger_bytes"] == sim.model_bytes
    assert p["wire_payload_bytes_both_directions"] == 2 * sim.model_bytes
    assert p["refused_messages"] == 0
    assert json.loads((tmp_path / "r.json").read_text())["p2p"] == p
    assert len(pids) == 3 and not any(_alive(x) for x in pids.values())
    # privacy: no identifier of the cohort is in any message a peer sent
    sent = b"".join(f.read_bytes() for f in sorted((tmp_path / "w").glob("sent-*.bin")))
    assert len(sent) > p["wire_payload_bytes_both_directions"]
    ids = pl.read_parquet(cohort / "cohort.parquet").select("stay_id", "subject_id", "hadm_id")
    for col in ids.columns:
        for v in ids[col].to_list():
            assert str(v).encode() not in sent, col
            assert int(v).to_bytes(8, "little") not in sent, col


def test_a_process_without_a_valid_certificate_is_refused_and_nothing_it_sends_is_used(tmp_path: Path):
    from federation.p2p.certs import make_federation_certs
    from federation.p2p.transport import Node, PeerUnavailable

    ours = make_federation_certs(tmp_path / "ours", {0: "127.0.0.1", 1: "127.0.0.1"})
    theirs = make_federation_certs(tmp_path / "theirs", {0: "127.0.0.1", 1: "127.0.0.1"})
    server = Node(0, "127.0.0.1:0", {}, ours[0])
    addr = {0: f"127.0.0.1:{server.port}"}
    clients = [Node(1, "127.0.0.1:0", addr, ours[1]),    # a member of the federation
               Node(1, "127.0.0.1:0", addr, theirs[1]),  # a certificate another CA signed
               Node(1, "127.0.0.1:0", addr, None)]       # no certificate at all
    try:
        msg = Message("eval", 0, 1, arrays={"v": torch.tensor([0.5, 0.5], dtype=torch.float64)})
        for bad in clients[1:]:
            with pytest.raises(PeerUnavailable):
                bad.send(0, msg, timeout=5)
        assert server.wait("eval", 0, [1], timeout=0.2) == {}  # nothing arrived
        # a member's certificate cannot speak for another center: refused, counted, not used
        with pytest.raises(PeerUnavailable, match="PERMISSION_DENIED"):
            clients[0].send(0, Message("eval", 0, 2, arrays={"v": torch.zeros(2, dtype=torch.float64)}), timeout=5)
        assert server.refused == 1 and server.wait("eval", 0, [2], timeout=0.2) == {}
        clients[0].send(0, msg, timeout=5)
        got = server.wait("eval", 0, [1], timeout=5)
        assert torch.equal(got[1].arrays["v"], msg.arrays["v"])
    finally:
        for node in (server, *clients):
            node.close()


def test_launch_writes_into_a_new_output_folder(cohort: Path, tmp_path: Path):
    # as abps train: the folder of --output is made; the launch's own work folder beside it goes
    out = tmp_path / "new" / "deeper" / "r.json"
    doc = launch(_cfg("fedavg", 1), cohort, 1, out, local=3, track=False, method_args={"rounds": 1})
    assert json.loads(out.read_text())["seeds"]["1"]["rounds_run"] == doc["seeds"]["1"]["rounds_run"] == 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.json"]


def _launch_cli(cohort: Path, tmp_path: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "cli", "launch", "--local", "3", "--method", "fedavg", "--cohort", str(cohort),
            "--seed", "1", "--rounds", "200", "--output", str(tmp_path / "r.json"), "--workdir", str(tmp_path / "w"),
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", *extra]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _peer_pids(work: Path, timeout: float = 120.0) -> list[int]:
    """pids of the running `abps peer` processes of a launch whose workdir is ``work``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"peer" in cmd and str(work).encode() + b"/peers.txt" in cmd:
                    pids.append(int(d.name))
        if len(pids) == 3:
            return sorted(pids)
        time.sleep(0.2)
    raise AssertionError("peers did not start")


@pytest.mark.parametrize("how", ["ctrl-c", "a peer dies"])
def test_a_launch_leaves_no_process_behind(how: str, cohort: Path, tmp_path: Path):
    proc = _launch_cli(cohort, tmp_path)
    pids = _peer_pids(tmp_path / "w")
    time.sleep(2.0)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
    else:
        os.kill(pids[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == (130 if how == "ctrl-c" else 2)
    if how == "a peer dies":
        assert err.strip().splitlines()[-1].startswith("error: peer of center") and "exited with code -9" in err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("policy", ["restart", "continue"])
def test_a_killed_peer_counts_as_unavailable_and_a_restarted_one_rejoins(policy: str, cohort: Path, tmp_path: Path):
    import threading

    rounds = 14  # with restart, the coordinator holds the round after the one that missed center 2 until it rejoins
    cfg = _cfg("abps", rounds)
    pids: dict[int, int] = {}
    ck = tmp_path / "w" / "ckpt-2.pt"

    def kill_when_past_round_one() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if ck.is_file() and 2 in pids:
                try:
                    if checkpoint.read(ck)["round"] >= 1:
                        os.kill(pids[2], signal.SIGKILL)
                        return
                except (OSError, EOFError, RuntimeError):
                    pass
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_past_round_one, daemon=True)
    killer.start()
    doc = launch(cfg, cohort, 6, tmp_path / "r.json", local=3, track=False, workdir=tmp_path / "w", timeout=3.0,
                 method_args={"rounds": rounds}, on_failure=policy, on_start=pids.update)
    killer.join(1)
    assert not any(_alive(p) for p in pids.values())
    res0 = json.loads((tmp_path / "w" / "result-0.json").read_text())
    rosters = res0["rosters"]
    assert len(rosters) == rounds and rosters[0] == [0, 1, 2]
    out = [r for r, ro in enumerate(rosters) if 2 not in ro]
    hist = doc["seeds"]["6"]
    assert hist["rounds_run"] == rounds and math.isfinite(hist["final_auroc_mean"])
    if policy == "continue":
        assert out, "center 2 was never counted unavailable"
        assert out == list(range(out[0], rounds))  # gone for good
        assert not (tmp_path / "w" / "result-2.json").exists()
    else:
        # restarted (a second process ran it), back in every roster from the next roll call on: the
        # coordinator holds a roster that missed it until it asks to rejoin
        assert (tmp_path / "w" / "peer-2.rejoin-1.log").exists()
        assert all(2 in ro for ro in rosters[out[-1] + 1:]) if out else all(2 in ro for ro in rosters)
        assert len(out) <= 1
        res2 = json.loads((tmp_path / "w" / "result-2.json").read_text())
        assert res2["rosters"] == rosters  # the rejoined replica holds the same public state
        assert res2["summary"]["final_auroc_mean"] == res0["summary"]["final_auroc_mean"]


def test_a_peer_waits_start_timeout_for_the_others_and_a_launch_names_the_users_peers_file(cohort: Path,
                                                                                             tmp_path: Path):
    ids = center_list(cohort)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    free = [socket.socket() for _ in ids]
    for s in free:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in free]
    for s in free:
        s.close()
    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"{c} 127.0.0.1:{p}\n" for c, p in zip(ids, ports, strict=True)))
    # alone: the others never come up; the peer gives up after --start-timeout, not a fixed two minutes
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "cli", "peer", "--cohort", str(cohort), "--center", ids[0],
                           "--peers", str(peers), "--method", "fedavg", "--seed", "1", "--insecure",
                           "--output", str(tmp_path / "p.json"), "--start-timeout", "1.5", "--timeout", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 3 and "did not come up within 1.5 s" in proc.stderr
    assert time.monotonic() - t0 < 60
    # a launch whose first peer cannot listen names the peers file the user gave, not its own copy
    peers.write_text("".join(f"{c} 127.0.0.1:{taken.getsockname()[1] if i == 0 else p}\n"
                             for i, (c, p) in enumerate(zip(ids, ports, strict=True))))
    from etl.errors import InputError

    try:
        with pytest.raises(InputError, match=rf"peer of center '{ids[0]}' exited with code 2: error: --peers "
                                             rf"{peers}: "):
            launch(_cfg("fedavg", 1), cohort, 1, tmp_path / "r.json", peers_file=peers, track=False,
                   method_args={"rounds": 1}, start_timeout=5.0)
    finally:
        taken.close()
    # the launch's own work folder (the peers' private keys among its files) went with the failure
    assert not list(tmp_path.glob(".abps-launch-*")) and not (tmp_path / "r.json").exists()


def test_a_restarted_peer_asks_again_the_centers_its_rejoin_request_did_not_reach():
    """The request goes out again, each second, to the centers whose send failed, and to no other;
    the roster that answers it ends the wait."""
    from types import SimpleNamespace

    from federation.p2p.peer import _hellos

    class Node:
        def __init__(self) -> None:
            self.sends: list[list[int]] = []

        def send_many(self, peers, msg, timeout, wait_for_ready=True):
            assert msg.kind == "join" and msg.sender == 1 and not wait_for_ready
            self.sends.append(list(peers))
            return [2] if len(self.sends) < 3 else []  # center 2 is unreachable twice

        def take(self, kind):
            if kind == "roster" and len(self.sends) == 3:
                return {0: Message("roster", 4, 0, body={"hellos": [{"a": 0}, {"a": 1}, {"a": 2}]})}
            return {}

    node = Node()
    spec = SimpleNamespace(rejoin=True, timeout=3.0, start_timeout=30.0)
    t0 = time.monotonic()
    hellos, msg = _hellos(spec, node, None, None, 1, 3)  # type: ignore[arg-type]
    assert node.sends == [[0, 2], [2], [2]]
    assert hellos == [{"a": 0}, {"a": 1}, {"a": 2}] and msg is not None and msg.round == 4
    assert time.monotonic() - t0 >= 2.0  # one second between tries


@pytest.fixture
def no_peer_starts(monkeypatch):
    """A launch that would start a peer process fails the test."""
    import federation.p2p.launch as lm

    def start(self, i, argv, log):
        raise AssertionError(f"peer {i} was started")

    monkeypatch.setattr(lm._Group, "start", start)


def test_launch_and_peer_refuse_an_existing_output_before_any_peer_starts(cohort: Path, tmp_path: Path, capsys,
                                                                          no_peer_starts):
    out = tmp_path / "l1" / "results.json"
    out.parent.mkdir()
    out.write_text("an unrelated file\n")
    launch_argv = ["launch", "--local", "3", "--method", "fedavg", "--cohort", str(cohort), "--rounds", "2",
                   "--output", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"]
    assert _refused(launch_argv, capsys) == f"error: {out} exists; give --force to replace it, or another --output"
    assert out.read_text() == "an unrelated file\n" and sorted(p.name for p in out.parent.iterdir()) == ["results.json"]
    assert not (tmp_path / "m.db").exists()
    # with --force it goes on to start the peers (here: the stand-in that refuses to)
    with pytest.raises(AssertionError, match="peer 0 was started"):
        from cli.app import main

        main([*launch_argv, "--force"])
    assert out.read_text() == "an unrelated file\n"
    ids = center_list(cohort)
    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"{c} 127.0.0.1:{7100 + i}\n" for i, c in enumerate(ids)))
    err = _refused(["peer", "--cohort", str(cohort), "--center", ids[0], "--peers", str(peers), "--method", "fedavg",
                    "--seed", "1", "--insecure", "--output", str(out)], capsys)
    assert err == f"error: {out} exists; give --force to replace it, or another --output"
    assert out.read_text() == "an unrelated file\n"


def test_a_port_a_peer_cannot_take_is_one_error_line_without_grpcs_own_log(cohort: Path, tmp_path: Path):
    ids = center_list(cohort)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"{c} 127.0.0.1:{port + 1 + i if i else port}\n" for i, c in enumerate(ids)))
    argv = [sys.executable, "-m", "cli", "peer", "--cohort", str(cohort), "--center", ids[0], "--peers", str(peers),
            "--method", "fedavg", "--seed", "1", "--insecure", "--output", str(tmp_path / "p.json"), "--rounds", "1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_")}
    try:
        quiet = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        # the user can still ask for gRPC's log
        loud = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**env, "GRPC_VERBOSITY": "ERROR"})
    finally:
        taken.close()
    assert quiet.returncode == 2
    assert quiet.stderr == f"error: --peers {peers}: cannot listen on 0.0.0.0:{port}\n"
    assert loud.returncode == 2 and "Failed to add port" in loud.stderr
    assert loud.stderr.splitlines()[-1] == quiet.stderr.strip()
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(("option", "value"), [("--timeout", "1e10"), ("--start-timeout", "86401"),
                                               ("--timeout", "inf"), ("--start-timeout", "0.05")])
@pytest.mark.parametrize("command", ["launch", "peer"])
def test_a_wait_beyond_a_day_or_below_a_tenth_of_a_second_is_refused_naming_the_option(
        command: str, option: str, value: str, cohort: Path, tmp_path: Path, capsys, no_peer_starts):
    ids = center_list(cohort)
    peers = tmp_path / "peers.txt"
    peers.write_text("".join(f"{c} 127.0.0.1:{7100 + i}\n" for i, c in enumerate(ids)))
    where = ["--local", "3"] if command == "launch" else ["--center", ids[0], "--peers", str(peers), "--seed", "1",
                                                          "--insecure"]
    err = _refused([command, *where, "--method", "fedavg", "--cohort", str(cohort), "--output", str(tmp_path / "r.json"),
                    option, value], capsys)
    assert err == f"error: {option} must be a number of seconds from 0.1 to 86400, got {float(value):g}"
    assert not (tmp_path / "r.json").exists()


def test_a_center_listed_twice_in_centers_parquet_is_refused_before_any_peer_starts_as_train_refuses_it(
        tmp_path: Path, capsys, no_peer_starts):
    c = write_fedprox_cohort(tmp_path / "dup", n_centers=4, seed=1, mean_size=60.0)
    centers = pl.read_parquet(c / "centers.parquet")
    pl.concat([centers, centers.head(1)]).write_parquet(c / "centers.parquet")
    for manifest in c.glob("*manifest*.json"):  # a folder mixed by hand: no manifest to compare with
        manifest.unlink()
    common = ["--method", "fedavg", "--cohort", str(c), "--rounds", "1", "--tracking-uri",
              f"sqlite:///{tmp_path / 'm.db'}"]
    train = _refused(["train", *common, "--output", str(tmp_path / "t.json"), "--no-progress"], capsys)
    assert train == f"error: {c / 'centers.parquet'}: column 'center_id' is not unique"
    assert _refused(["launch", "--local", "5", *common, "--output", str(tmp_path / "r.json")], capsys) == train
    assert _refused(["launch", "--local", "4", *common, "--output", str(tmp_path / "r.json")], capsys) == train
    assert not (tmp_path / "r.json").exists() and not list(tmp_path.glob(".abps-launch-*"))
