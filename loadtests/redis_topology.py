"""Local Redis topologies for tests and the scale benchmark, from Debian's `redis-server` and
`redis-sentinel`: a Redis Cluster (masters with one replica each) and a Sentinel-managed
primary/replica pair. Failover timeouts are tuned low so a killed primary is replaced within
about a second. Everything binds 127.0.0.1 and is stopped (killed) on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

COMMON = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "no"]
# Replicas sync at once (the default waits 5 s for more replicas to share one transfer).
COMMON += ["--repl-diskless-sync-delay", "0"]


def missing_binaries() -> str | None:
    """Why these topologies cannot run here, or None."""
    for name in ("redis-server", "redis-cli", "redis-sentinel"):
        if shutil.which(name) is None:
            return f"{name} not installed (Debian: apt-get install redis-server redis-sentinel)"
    return None


def _wait(check, what: str, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - not up yet
            last = e
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what} ({last})")


def _ping(port: int) -> bool:
    with redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5) as r:
        return bool(r.ping())


@dataclass
class Servers:
    workdir: Path
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, port: int, *args: str, binary: str = "redis-server") -> None:
        d = self.workdir / str(port)
        d.mkdir(parents=True, exist_ok=True)
        log = (d / "log").open("ab")
        self.procs[port] = subprocess.Popen(
            [binary, *args]
            if binary == "redis-sentinel"
            else [binary, "--port", str(port), *COMMON, "--dir", str(d), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=d,
        )

    def kill(self, port: int) -> None:
        """kill -9: no chance to hand anything over."""
        proc = self.procs.pop(port)
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)

    def stop_all(self) -> None:
        for port in list(self.procs):
            with contextlib.suppress(Exception):
                self.kill(port)


@dataclass
class Cluster:
    servers: Servers
    ports: list[int]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])

    def client(self) -> redis.RedisCluster:
        alive = next(p for p in self.ports if p in self.servers.procs)
        return redis.RedisCluster(host="127.0.0.1", port=alive, socket_timeout=1)

    def master_of(self, key: str) -> int:
        """Port of the master that serves `key` now."""
        with self.client() as c:
            node = c.get_node_from_key(key)
            return int(node.port)

    def masters(self) -> list[int]:
        with self.client() as c:
            return sorted(int(n.port) for n in c.get_primaries())

    def kill(self, port: int) -> None:
        self.servers.kill(port)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every slot served by a live master, seen from every live node."""

        def ok() -> bool:
            for p in self.servers.procs:
                with redis.Redis(port=p, socket_timeout=0.5) as r:
                    info = r.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
            return True

        _wait(ok, "cluster_state:ok", timeout)


@contextlib.contextmanager
def redis_cluster(ports: list[int], workdir: Path, node_timeout_ms: int = 500) -> Iterator[Cluster]:
    """len(ports) / 2 masters, one replica each (6 ports = 3 masters + 3 replicas)."""
    servers = Servers(workdir)
    try:
        for p in ports:
            servers.start(
                p,
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{p}.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                # A replica takes over however long it was cut off from its master.
                "--cluster-replica-validity-factor", "0",
            )  # fmt: skip
        for p in ports:
            _wait(lambda p=p: _ping(p), f"redis {p}")
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        cluster = Cluster(servers, ports)
        cluster.wait_healthy()
        # Replicas attached (a master killed before its replica synced would lose its slots).
        _wait(lambda: all(_replica_synced(p) for p in cluster.masters()), "replicas in sync")
        yield cluster
    finally:
        servers.stop_all()


def _replica_synced(master_port: int) -> bool:
    with redis.Redis(port=master_port, socket_timeout=0.5) as r:
        info = r.info("replication")
        return int(info.get("connected_slaves", 0)) >= 1 and "online" in str(info.get("slave0", ""))


@dataclass
class SentinelSet:
    servers: Servers
    primary: int
    replica: int
    sentinels: list[int]
    service: str

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def current_primary(self) -> int:
        with redis.Redis(port=self.sentinels[0], socket_timeout=0.5) as s:
            host, port = s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return int(port)

    def kill(self, port: int) -> None:
        self.servers.kill(port)


@contextlib.contextmanager
def redis_sentinel(
    primary: int, replica: int, sentinels: list[int], workdir: Path, service: str = "gw"
) -> Iterator[SentinelSet]:
    """A primary, one replica, and Sentinels (quorum 1) that fail over within about a second."""
    servers = Servers(workdir)
    try:
        servers.start(primary)
        servers.start(replica, "--replicaof", "127.0.0.1", str(primary))
        for p in (primary, replica):
            _wait(lambda p=p: _ping(p), f"redis {p}")
        _wait(lambda: _replica_synced(primary), "replica in sync")
        for p in sentinels:
            d = workdir / str(p)
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {p}\nbind 127.0.0.1\nprotected-mode no\ndir {d}\n"
                f"sentinel monitor {service} 127.0.0.1 {primary} 1\n"
                f"sentinel down-after-milliseconds {service} 300\n"
                f"sentinel failover-timeout {service} 2000\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
            servers.start(p, str(conf), binary="redis-sentinel")
        sset = SentinelSet(servers, primary, replica, sentinels, service)
        for p in sentinels:
            _wait(lambda p=p: _ping(p), f"sentinel {p}")
        _wait(lambda: sset.current_primary() == primary, "sentinels see the primary")
        yield sset
    finally:
        servers.stop_all()


__all__ = ["Cluster", "SentinelSet", "missing_binaries", "redis_cluster", "redis_sentinel"]
