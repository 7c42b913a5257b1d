"""The one place Redis clients are made: a single server, a Redis Cluster or a Sentinel-managed
primary, chosen by the URL's scheme (redis-py's own clients do the work):

    redis://[:password@]host:port/db            one server (also rediss://, unix://)
    redis+cluster://[:password@]host:port[,host:port...]
                                                a Redis Cluster: any reachable nodes to start from
                                                (rediss+cluster:// for TLS)
    redis+sentinel://[:password@]host:port[,host:port...]/service[/db]
                                                the primary that Sentinels name `service`, found
                                                again after a failover (rediss+sentinel:// for TLS)

In a cluster, keys that one command or transaction touches together must hash to one slot: the
gateway writes them under a hash tag (`SharedState.tagged_key`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff
from typing_extensions import TypeIs

AnyRedis = aioredis.Redis | RedisCluster
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
# Options of a single connection that the cluster client does not take as such.
_NOT_FOR_CLUSTER = ("health_check_interval", "retry_on_timeout")


def _hosts(parts: SplitResult, default_port: int) -> list[tuple[str, int]]:
    hosts = parts.netloc.rpartition("@")[2]
    out = []
    for item in hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            host, _, port = item[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
        out.append((host, int(port) if port else default_port))
    if not out:
        raise ValueError(f"{parts.scheme}:// URL names no host")
    return out


def _credentials(parts: SplitResult) -> dict[str, Any]:
    auth = parts.netloc.rpartition("@")[0]
    if not auth:
        return {}
    user, _, password = auth.partition(":")
    out: dict[str, Any] = {}
    if user:
        out["username"] = unquote(user)
    if password:
        out["password"] = unquote(password)
    return out


SINGLE_SCHEMES = ("redis", "rediss", "unix")


def url_problem(url: str) -> str | None:
    """What makes `url` (REDIS_URL) unusable, or None. Checked before the gateway listens, so a
    typo is one clear line at start, not a traceback in every worker; the message never quotes
    the URL's credentials."""
    if any(ord(c) <= 32 or ord(c) == 127 for c in url):
        return "holds a space or control character"
    try:
        parts = urlsplit(url)
    except ValueError as e:
        return str(e)
    schemes = SINGLE_SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES
    if parts.scheme not in schemes:
        return f"the scheme '{parts.scheme[:20]}' is not one of {', '.join(schemes)}"
    if parts.scheme == "unix":
        return None if parts.path else "a unix:// URL needs the socket's path"
    try:
        hosts = _hosts(parts, 26379 if kind_of(url) == "sentinel" else 6379)
    except ValueError as e:
        if "names no host" not in str(e):
            return "a port is not a number"
        if kind_of(url) != "single":
            return str(e)
        hosts = []  # redis:///0: the client's default, localhost
    for host, port in hosts:
        if not 0 < port < 65536:
            return f"port {port} of '{host[:100]}' is not a port number (1-65535)"
    if kind_of(url) == "single" and len(hosts) > 1:
        return "names several hosts: use redis+cluster:// or redis+sentinel://"
    path = [p for p in parts.path.split("/") if p]
    if kind_of(url) == "sentinel":
        if not path:
            return "a redis+sentinel:// URL needs the service name: .../service[/db]"
        path = path[1:]
    if kind_of(url) == "cluster":
        path = []  # a cluster has one database
    if len(path) > 1 or (path and not path[0].isdigit()):
        return f"the database '{'/'.join(path)[:40]}' is not a number"
    try:
        make_redis(url)  # query options (timeouts...) as the client reads them
    except (ValueError, TypeError) as e:
        return str(e)[:200]
    return None


def kind_of(url: str) -> str:
    """ "cluster", "sentinel" or "single"."""
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return "cluster"
    if scheme in SENTINEL_SCHEMES:
        return "sentinel"
    return "single"


def make_redis(url: str, **options: Any) -> AnyRedis:
    """A client for `url`; `options` are connection options (timeouts, pool size...)."""
    parts = urlsplit(url)
    kind = kind_of(url)
    if kind == "cluster":
        opts = {k: v for k, v in options.items() if k not in _NOT_FOR_CLUSTER}
        nodes = [ClusterNode(h, p) for h, p in _hosts(parts, 6379)]
        return RedisCluster(
            startup_nodes=nodes,
            # Retry a command briefly while the cluster fails over (a replica is promoted within
            # about a second); longer, the caller's own fallback (local state) serves instead.
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=3),
            ssl=parts.scheme.startswith("rediss"),
            **_credentials(parts),
            **opts,
        )
    if kind == "sentinel":
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError("redis+sentinel:// URL needs the service name: .../service[/db]")
        service, db = path[0], int(path[1]) if len(path) > 1 else 0
        conn = {**options, **_credentials(parts)}
        if parts.scheme.startswith("rediss"):
            conn["ssl"] = True
        timeouts = {
            k: v for k, v in options.items() if k in ("socket_timeout", "socket_connect_timeout")
        }
        sentinel = Sentinel(_hosts(parts, 26379), sentinel_kwargs=timeouts, **conn)
        return sentinel.master_for(service, db=db)
    return aioredis.Redis.from_url(url, **options)


def is_cluster(client: object) -> TypeIs[RedisCluster]:
    return isinstance(client, RedisCluster)
