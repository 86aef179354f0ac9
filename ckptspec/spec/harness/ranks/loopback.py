"""Several torchrun "nodes" on this machine: the launched mode's test bed, without a cluster.

    python -m ckptspec.spec.harness.ranks.loopback [--nodes 2] [--nproc-per-node 1] [--timeout S] [--forked]
        -- PYTEST ARGS (with --conformance-json PATH)

starts `python -m torch.distributed.run --nnodes=N --nproc-per-node=G --rdzv-backend=c10d
--rdzv-endpoint=127.0.0.1:PORT --rdzv-id=ID --max-restarts=0 -m pytest PYTEST ARGS` N times (one launch per
"node", each in a session of its own, rendezvous on a free loopback port, gloo), bounded by the timeout, after which
every launch's process group is killed. With `--forked` it first runs the same pytest command without a launcher
(forked ranks, `-p no:xdist`), recording to PATH.forked.json, and compares the two runs' verdicts: each test's
outcome and each clause's cell of the conformance table. Harness tests that only the launched run skipped (what the
mode cannot do) are listed, not counted as differences. Exit status: 0 when every launch exited 0 or 1 (pytest's
"tests failed" is data) and the verdicts agree, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ckptspec.report import clauses as clause_registry
from ckptspec.report.runs import Run, load_run
from ckptspec.report.verdicts import judge

__all__ = [
    "Node",
    "compare",
    "free_port",
    "launched_only_skips",
    "main",
    "start",
    "start_commands",
    "torchrun_command",
    "wait",
]

REPO_ROOT = Path(__file__).resolve().parents[4]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def torchrun_command(
    args: list[str],
    *,
    nodes: int,
    nproc_per_node: int,
    port: int,
    run_id: str,
    module: str = "pytest",
    max_restarts: int = 0,
    rdzv_conf: str | None = None,
) -> list[str]:
    """The command of one "node": torchrun with a c10d rendezvous on loopback, running `python -m MODULE ARGS`.

    rdzv_conf: e.g. "is_host=1" for the node whose agent must host the rendezvous store (else the first to bind).
    """
    conf = [f"--rdzv-conf={rdzv_conf}"] if rdzv_conf else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        *conf,
        f"--max-restarts={max_restarts}",
        "-m",
        module,
        *args,
    ]


@dataclass
class Node:
    """One torchrun launch: its process (a session leader, so its whole group can be killed) and its log."""

    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole "node": torchrun's agent, every rank it started and their descendants.

        torchrun starts each rank in a session of its own, so the launch's process group alone would miss them.
        """
        import psutil

        if self.proc.poll() is not None:  # exited (and reaped: its pid may name another process by now)
            return
        try:
            agent = psutil.Process(self.proc.pid)
            procs = [agent, *agent.children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def start(
    args: list[str], *, nodes: int = 2, nproc_per_node: int = 1, log_dir: Path, env: dict[str, str] | None = None
) -> list[Node]:
    """Start `nodes` launches of `python -m pytest ARGS` on loopback, one rendezvous for all of them."""
    port = free_port()
    command = torchrun_command(args, nodes=nodes, nproc_per_node=nproc_per_node, port=port, run_id=f"ckptspec-{port}")
    return start_commands([command] * nodes, log_dir=log_dir, env=env)


def start_commands(commands: list[list[str]], *, log_dir: Path, env: dict[str, str] | None = None) -> list[Node]:
    """Start each command (one "node") in a session of its own, its output to log_dir/node<i>.log."""
    env = dict(os.environ if env is None else env)
    env.setdefault("TMPDIR", str(log_dir))  # torchrun's own files (torchelastic_*) go there too
    started = []
    for i, command in enumerate(commands):
        log = log_dir / f"node{i}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        started.append(Node(proc, log))
    return started


def wait(nodes: list[Node], timeout: float) -> list[int | None]:
    """Each launch's exit status, or None for one still running at the timeout (then every launch is killed)."""
    deadline = time.monotonic() + timeout
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    codes = [node.proc.poll() for node in nodes]
    for node in nodes:
        node.kill()  # also what a finished launch left behind in its group
    return codes


def launched_only_skips(forked: Path | str, launched: Path | str) -> list[str]:
    """Harness tests (citing no clause) that the launched run skipped and the forked run did not: what the mode
    cannot do (more ranks than the world, killing a launched rank; README: torchrun). No conformance verdict."""
    return _mode_skips(load_run(forked), load_run(launched))


def compare(forked: Path | str, launched: Path | str) -> list[str]:
    """Where two conformance JSON files of the same selection disagree: tests' outcomes, then clauses' cells.

    The launched mode's own skips (launched_only_skips) are listed apart, not counted here."""
    a, b = load_run(forked), load_run(launched)
    return _differences(a, b, set(_mode_skips(a, b)))


def _mode_skips(a: Run, b: Run) -> list[str]:
    return sorted(
        nodeid
        for nodeid, (outcome, cited, *_) in b.tests.items()
        if outcome == "skipped" and not cited and a.tests.get(nodeid, ("skipped",))[0] != "skipped"
    )


def _differences(a: Run, b: Run, mode_skips: set[str]) -> list[str]:
    problems = [
        f"{nodeid}: forked {a.tests.get(nodeid, ('absent',))[0]}, launched {b.tests.get(nodeid, ('absent',))[0]}"
        for nodeid in sorted(set(a.tests) | set(b.tests))
        if a.tests.get(nodeid, ("absent",))[0] != b.tests.get(nodeid, ("absent",))[0] and nodeid not in mode_skips
    ]
    registry = {**a.clauses, **b.clauses, **clause_registry.load()}
    for clause in sorted(set(a.clauses) | set(b.clauses)):
        forked_cell, launched_cell = (str(judge(r.citing(clause), clause, registry)) for r in (a, b))
        if forked_cell != launched_cell:
            problems.append(f"{clause}: forked {forked_cell}, launched {launched_cell}")
    return problems


def _json_path(args: list[str]) -> Path | None:
    for i, arg in enumerate(args):
        if arg == "--conformance-json" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--conformance-json="):
            return Path(arg.split("=", 1)[1])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckptspec.spec.harness.ranks.loopback", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the launched run (default 3600)")
    parser.add_argument("--forked", action="store_true", help="also run it forked and compare the verdicts")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then pytest's arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    json_path = _json_path(pytest_args)
    if args.forked and json_path is None:
        parser.error("--forked compares conformance JSON files: give --conformance-json PATH to pytest")
    if args.forked:
        assert json_path is not None
        forked_json = json_path.with_suffix(".forked.json")
        forked_args = [a if Path(a) != json_path else str(forked_json) for a in pytest_args]
        start_s = time.monotonic()
        code = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:xdist", *forked_args], cwd=REPO_ROOT
        ).returncode
        print(f"loopback: forked run exited {code} in {time.monotonic() - start_s:.0f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="ckptspec-loopback-") as tmp:
        start_s = time.monotonic()
        nodes = start(pytest_args, nodes=args.nodes, nproc_per_node=args.nproc_per_node, log_dir=Path(tmp))
        codes = wait(nodes, args.timeout)
        wall = time.monotonic() - start_s
        for i, node in enumerate(nodes):
            print(f"----- node {i} (exit {codes[i]}) -----\n{node.output}", flush=True)
    print(f"loopback: {args.nodes} node(s) x {args.nproc_per_node} exited {codes} in {wall:.0f}s", flush=True)
    ok = all(code in (0, 1) for code in codes)
    if args.forked and json_path is not None:
        a, b = load_run(forked_json), load_run(json_path)
        skips = _mode_skips(a, b)
        for nodeid in skips:
            print(f"loopback: skipped by the launched mode only (a harness test): {nodeid}")
        problems = _differences(a, b, set(skips))
        print("loopback: verdicts " + ("agree" if not problems else "differ:\n  " + "\n  ".join(problems)))
        ok = ok and not problems
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
