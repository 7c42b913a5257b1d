"""`gateway keys create|list|rotate|revoke`: managed keys over the admin API of a running gateway."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote, urlencode

import httpx
import orjson
import typer

keys_app = typer.Typer(no_args_is_help=True, help="Managed API keys (over the admin API).")

Url = Annotated[str, typer.Option("--url", envvar="GATEWAY_URL", help="The gateway's base URL.")]
AdminKey = Annotated[
    str | None,
    typer.Option(
        "--admin-key", envvar="GATEWAY_ADMIN_KEY", help="Admin key (if the gateway has one)."
    ),
]


def _call(method: str, url: str, path: str, admin_key: str | None, body: Any = None) -> None:
    if admin_key is not None and not (admin_key.isascii() and admin_key.isprintable()):
        # Said without the key: a traceback would show it (httpx cannot send it anyway).
        typer.echo("the admin key must be printable ASCII", err=True)
        raise typer.Exit(2)
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        r = httpx.request(method, url.rstrip("/") + path, json=body, headers=headers, timeout=10)
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        typer.echo(f"cannot reach {url}: {e}", err=True)
        raise typer.Exit(2) from None
    if r.status_code >= 400:
        typer.echo(r.text, err=True)
        raise typer.Exit(1)
    try:
        doc = r.json()
    except ValueError:
        # Not the gateway's admin API (a proxy's page, another server): said, not a traceback.
        typer.echo(
            f"{url} did not answer JSON (HTTP {r.status_code}): is it the gateway?", err=True
        )
        raise typer.Exit(1) from None
    typer.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="Tenant the key belongs to.")],
    url: Url = "http://127.0.0.1:8080",
    admin_key: AdminKey = None,
    name: Annotated[str, typer.Option(help="A label for people.")] = "",
    alias: Annotated[
        list[str] | None, typer.Option(help="Allowed model alias (repeat; none = all).")
    ] = None,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute.")] = None,
    tpm: Annotated[int | None, typer.Option(help="Tokens per minute.")] = None,
    concurrent: Annotated[int | None, typer.Option(help="Requests in flight at once.")] = None,
    daily_usd: Annotated[float | None, typer.Option(help="Budget per day (USD).")] = None,
    weekly_usd: Annotated[float | None, typer.Option(help="Budget per ISO week (USD).")] = None,
    monthly_usd: Annotated[float | None, typer.Option(help="Budget per month (USD).")] = None,
    expires_in: Annotated[float | None, typer.Option(help="Seconds until the key expires.")] = None,
) -> None:
    """Create a key; its plaintext is printed this once (only a hash is stored)."""
    body: dict[str, Any] = {"tenant": tenant, "name": name, "aliases": alias or []}
    limits = {"requests_per_minute": rpm, "tokens_per_minute": tpm, "max_concurrent": concurrent}
    if any(v is not None for v in limits.values()):
        body["limits"] = {k: v for k, v in limits.items() if v is not None}
    budget = {"daily_usd": daily_usd, "weekly_usd": weekly_usd, "monthly_usd": monthly_usd}
    if any(v is not None for v in budget.values()):
        body["budget"] = {k: v for k, v in budget.items() if v is not None}
    if expires_in is not None:
        body["expires_in_s"] = expires_in
    _call("POST", url, "/admin/keys", admin_key, body)


@keys_app.command("list")
def list_keys(
    url: Url = "http://127.0.0.1:8080",
    admin_key: AdminKey = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """List keys (ids, tenants, limits; never secrets or hashes)."""
    # Tenant names may hold '+', '/', '@', ':': encoded, or '+' would arrive as a space.
    query = "?" + urlencode({"tenant": tenant}) if tenant else ""
    _call("GET", url, "/admin/keys" + query, admin_key)


@keys_app.command("rotate")
def rotate(
    key_id: Annotated[str, typer.Argument(help="Key id (mk_...).")],
    url: Url = "http://127.0.0.1:8080",
    admin_key: AdminKey = None,
) -> None:
    """New secret for the key (printed once); the old secret stops working at once."""
    _call("POST", url, f"/admin/keys/{quote(key_id, safe='')}/rotate", admin_key)


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="Key id (mk_...).")],
    url: Url = "http://127.0.0.1:8080",
    admin_key: AdminKey = None,
) -> None:
    """Revoke the key: every replica refuses it within a second."""
    _call("POST", url, f"/admin/keys/{quote(key_id, safe='')}/revoke", admin_key)
