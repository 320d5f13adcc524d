"""``abps peer`` (one center of a peer-to-peer federation) and ``abps launch`` (start a federation's
peers, gather results.json and the MLflow run). How-to: docs/p2p.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from cli import project
from cli.app import app
from etl.errors import InputError
from etl.io import check_writable
from federation.method_catalog import P2P_METHODS


def _quiet_grpc() -> None:
    """Silence gRPC's own C-core log lines (e.g. a port it cannot bind) in this process and the peers
    it starts: the command reports such a failure in its own one line. Set before grpc is first
    imported; a GRPC_VERBOSITY / GRPC_TRACE the user set is kept."""
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    os.environ.setdefault("GRPC_TRACE", "")


def _config(method: str, config: Path | None, rounds: int | None, params: list[str] | None):
    """The run config of ``--method`` / ``--config`` / ``--rounds`` / ``--param`` (as ``abps train``)."""
    from cli.train_cmd import _parse_params
    from federation.core.config import build_config, deep_merge, load_run_config
    from federation.methods import get_method
    from federation.methods.registry import given_params
    from federation.run.runner import check_method_params

    cls = get_method(method)
    file_cfg = load_run_config(config) if config is not None else None
    if params:
        file_cfg = deep_merge(file_cfg or {"method": method}, {"params": _parse_params(params)})
    cfg = build_config(method, cls.default_config, file_cfg, rounds)
    check_method_params(cfg)
    return cfg.model_copy(update={"params": given_params(cfg.method, cfg.params)})


@app.command("peer")
def peer(
    cohort: Path = typer.Option(..., "--cohort", help="cohort directory; only this center's rows are read"),
    center: str = typer.Option(..., "--center", help="center_id this process runs (a line of --peers)"),
    peers: Path = typer.Option(..., "--peers", help="peers file: one line 'center_id host:port' per center"),
    method: str = typer.Option(..., "--method", help=f"fedavg or an ABPS method: {', '.join(P2P_METHODS)}"),
    seed: int = typer.Option(..., "--seed", callback=project.seed_value, help="run seed (the same on every peer)"),
    output: Path = typer.Option(..., "--output", parser=project.file_path, metavar="FILE",
                               help="this peer's result JSON"),
    force: bool = project.force_option(),
    certs: Path | None = typer.Option(None, "--certs", help="folder with ca.pem and center-<i>.pem / .key "
                                      "(made by abps launch)"),
    insecure: bool = typer.Option(False, "--insecure", help="plaintext gRPC without certificates (a test network only)"),
    config: Path | None = typer.Option(None, "--config", help="YAML run config (as abps train)"),
    rounds: int | None = typer.Option(None, "--rounds", min=1, help="override rounds"),
    param: list[str] | None = typer.Option(None, "--param", help="method parameter NAME=VALUE, repeatable"),
    listen: str | None = typer.Option(None, "--listen", help="host:port to listen on (default: this center's "
                                      "address in --peers)"),
    timeout: float = typer.Option(60.0, "--timeout", callback=project.seconds_value,
                                  help="seconds to wait for a peer's message in a round"),
    start_timeout: float = typer.Option(120.0, "--start-timeout", callback=project.seconds_value,
                                        help="seconds to wait for every peer to come up (and for a restarting "
                                        "one to rejoin)"),
    capture: Path | None = typer.Option(None, "--capture", parser=project.file_path, metavar="FILE",
                                        help="also append every message sent to this file"),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", parser=project.file_path, metavar="FILE",
                                           help="write this center's round state here after every round"),
    rejoin: bool = typer.Option(False, "--rejoin", help="rejoin a running federation: replay its public log, "
                                "take the own model from --checkpoint"),
    await_rejoin: bool = typer.Option(False, "--await-rejoin", help="coordinator: hold the next round for a "
                                      "center that stopped answering until it rejoins (it is being restarted; "
                                      "at most --start-timeout seconds)"),
) -> None:
    """Run one center of a peer-to-peer federation (its own rows, model and method state)."""
    _quiet_grpc()
    from federation.p2p.launch import read_peers_file
    from federation.p2p.local import center_list
    from federation.p2p.peer import PeerSpec, run_peer
    from federation.p2p.transport import ListenError, PeerUnavailable, TlsFiles, common_name

    if (certs is None) == (not insecure):
        raise InputError("give --certs DIR (mutual TLS) or --insecure")
    if rejoin and checkpoint is None:
        raise InputError("--rejoin: give --checkpoint FILE (this center's round state to rejoin from)")
    cfg = _config(method, config, rounds, param)
    project.check_apart({"--output": output, "--capture": capture, "--checkpoint": checkpoint},
                        {"a file of the cohort folder": cohort, "the run config": config, "the peers file": peers,
                         "a certificate file": certs})
    check_writable(output, "--output")
    project.check_output(output, force)
    if capture is not None and capture.is_dir():
        raise InputError(f"--capture {capture}: is a directory (give a file)")
    if capture is not None and not rejoin and capture.exists() and capture.stat().st_size:
        raise InputError(f"--capture {capture}: exists; a capture is appended to only by a peer that rejoins "
                         "(--rejoin); give a new file")
    ids = center_list(cohort)
    entries = read_peers_file(peers, ids)
    if center not in ids:
        raise InputError(f"--center {center!r}: not a center_id of {cohort / 'centers.parquet'}")
    me = ids.index(center)
    tls = None
    if certs is not None:
        tls = TlsFiles(certs / "ca.pem", certs / f"{common_name(me)}.pem", certs / f"{common_name(me)}.key")
        for p in (tls.ca, tls.cert, tls.key):
            if not p.is_file():
                raise InputError(f"--certs {certs}: missing {p.name}")
    addresses = {i: e.address for i, e in enumerate(entries)}
    spec = PeerSpec(cohort=cohort, index=me, center_ids=ids, cfg=cfg, seed=seed, addresses=addresses, tls=tls,
                    output=output, timeout=timeout, start_timeout=start_timeout, payload_log=capture,
                    checkpoint=checkpoint, rejoin=rejoin, await_rejoin=await_rejoin,
                    listen=listen or f"0.0.0.0:{entries[me].port}")
    try:
        run_peer(spec)
    except ListenError as exc:
        raise InputError(f"{f'--listen {listen}' if listen else f'--peers {peers}'}: {exc}") from None
    except PeerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(3) from None


@app.command("launch")
def launch(
    method: str = typer.Option(..., "--method", help=f"fedavg or an ABPS method: {', '.join(P2P_METHODS)}"),
    cohort: Path = typer.Option(..., "--cohort", help="cohort directory (each peer reads only its own center's rows)"),
    seed: int = typer.Option(project.DEFAULT_SEED, "--seed", callback=project.seed_value,
                             help="run seed (as abps train's --seeds)"),
    output: Path = typer.Option(..., "--output", parser=project.file_path, metavar="FILE", help="results.json path"),
    force: bool = project.force_option(),
    local: int | None = typer.Option(None, "--local", min=1, help="start N peers on this host, one per center"),
    peers: Path | None = typer.Option(None, "--peers", help="peers file: 'center_id host:port [command prefix]' "
                                      "per center (prefix e.g. 'ssh site-b' or 'ip netns exec site-b')"),
    config: Path | None = typer.Option(None, "--config", help="YAML run config (as abps train)"),
    rounds: int | None = typer.Option(None, "--rounds", min=1, help="override rounds"),
    param: list[str] | None = typer.Option(None, "--param", help="method parameter NAME=VALUE, repeatable"),
    timeout: float = typer.Option(60.0, "--timeout", callback=project.seconds_value,
                                  help="seconds a peer waits for another's message"),
    start_timeout: float = typer.Option(120.0, "--start-timeout", callback=project.seconds_value,
                                        help="seconds a peer waits for the others to come up (and for a "
                                        "restarting one to rejoin)"),
    on_failure: str = typer.Option("stop", "--on-failure", help="when a peer process dies: stop | continue (the "
                                   "others go on without it) | restart (it rejoins from its checkpoint)"),
    workdir: Path | None = typer.Option(None, "--workdir", help="keep certificates, peer list, logs and per-peer "
                                        "results here (default: a temporary folder beside --output)"),
    tracking_uri: str | None = project.tracking_uri_option(),
    experiment: str | None = typer.Option(None, "--experiment", help="MLflow experiment (default: the cohort's "
                                          "folder name)"),
) -> None:
    """Start a peer-to-peer federation (one process per center), wait, write results.json, log MLflow."""
    _quiet_grpc()
    from federation.p2p.launch import launch as run_launch
    from federation.run.tracking import experiment_name

    cfg = _config(method, config, rounds, param)
    project.check_apart({"--output": output}, {"a file of the cohort folder": cohort, "the run config": config,
                                              "the peers file": peers}, tracking_uri)
    check_writable(output, "--output")
    project.check_output(output, force)  # before any peer starts
    exp = experiment_name(experiment, cohort.resolve().name)
    doc = run_launch(cfg, cohort, seed, output, local=local, peers_file=peers,
                     method_args={"rounds": rounds, "config": config.resolve() if config else None,
                                  "params": list(param or [])},
                     tracking_uri=tracking_uri, experiment=exp, timeout=timeout, workdir=workdir,
                     on_failure=on_failure, start_timeout=start_timeout)
    p = doc["p2p"]
    s = doc["summary"]["final_auroc_mean"]["mean"]
    auroc = f"{s:.6f}" if s is not None else "undefined (too few centers with both classes)"
    print(f"{cfg.method} seed {seed}: final test AUROC {auroc}; wire payload {p['wire_payload_bytes']} B, "
          f"ledger {p['ledger_bytes']} B; written {output}")
