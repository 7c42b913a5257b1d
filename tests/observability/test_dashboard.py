"""The dashboard in a real headless Chromium (selenium + Debian's chromium-driver).

Skipped when selenium, chromium or chromedriver is missing; install them with
`apt-get install -y chromium chromium-driver` and `pip install selenium`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (apt-get install -y chromium chromium-driver)"
    return None


pytestmark = pytest.mark.skipif(_browser_missing() is not None, reason=str(_browser_missing()))


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    opts.add_argument("--window-size=1400,1000")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    yield driver
    driver.quit()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """The browser with a blank page and an empty console log before and after each test."""
    browser.get("about:blank")
    browser.get_log("browser")
    yield browser
    browser.get("about:blank")  # stop polling a gateway that is about to stop


def wait_for(cond: Callable[[], object], timeout: float = 15.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def policy(fleet) -> str:
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}}}
  b: {{base_url: '{fleet.url("b")}', models: {{'*': sim}}}}
  slow: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}}}}
pools:
  main: {{members: [a, b]}}
  spare: {{members: [slow]}}
models:
  chat: {{pool: main}}
"""


def members(driver) -> list[str]:
    """Member names on the page (read in one script: the page re-renders on every poll)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('tr[data-member]')].map(r => r.dataset.member)"
    )


def text(driver, selector: str) -> str:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''", selector
    )


def severe_logs(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_dashboard_shows_members_and_updates(fleet, gateway, page, tmp_path) -> None:
    browser = page
    gw = gateway(policy(fleet))
    browser.get(gw.url + "/dashboard?interval=500")
    assert sorted(wait_for(lambda: members(browser))) == ["a", "b", "slow"]  # type: ignore[arg-type]
    assert text(browser, "#total-requests") == "0"
    with httpx.Client(base_url=gw.base_url) as c:
        for _ in range(5):
            assert c.post("/chat/completions", json=CHAT).status_code == 200
    wait_for(lambda: text(browser, "#total-requests") == "5")
    n_recent = "return document.querySelectorAll('#recent tbody tr').length"
    wait_for(lambda: browser.execute_script(n_recent) == 5)
    assert "main → " in text(browser, "#recent tbody tr")
    # The drain button works through the admin API.
    browser.execute_script("document.querySelector(\"tr[data-member='slow'] button\").click()")
    wait_for(lambda: gw.app.state.runtime.snapshot.providers["slow"].drained)
    wait_for(lambda: "drained" in text(browser, "tr[data-member='slow']"))
    out = _screenshot_path(tmp_path)
    browser.save_screenshot(str(out))
    print(f"dashboard screenshot: {out}")
    assert severe_logs(browser) == []


def test_dashboard_asks_for_the_admin_key(fleet, gateway, page, monkeypatch) -> None:
    browser = page
    from selenium.webdriver.common.by import By

    gw = gateway(policy(fleet))
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "dash-key")
    browser.get(gw.url + "/dashboard?interval=500")
    form = browser.find_element(By.ID, "keyform")
    wait_for(form.is_displayed)
    browser.find_element(By.ID, "key").send_keys("dash-key")
    browser.find_element(By.CSS_SELECTOR, "#keyform button").click()
    wait_for(lambda: members(browser))
    # ?key= is taken once, kept for the tab, and removed from the address bar.
    browser.execute_script("sessionStorage.clear()")
    browser.get(gw.url + "/dashboard?interval=500&key=dash-key")
    wait_for(lambda: members(browser))
    assert "key=" not in browser.current_url
    # Only the expected 401 of the first, keyless poll was logged.
    logs = severe_logs(browser)
    assert all("401" in e["message"] for e in logs), logs


def _screenshot_path(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("DASHBOARD_SCREENSHOT_DIR", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "dashboard.png"


def test_dashboard_shows_tenant_usage_against_limits(fleet, gateway, page, monkeypatch) -> None:
    browser = page
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:dash-a,team-b:dash-b")
    text_policy = policy(fleet).replace(
        "providers:",
        "governance:\n"
        "  tenants:\n"
        "    team-a:\n"
        "      limits: {requests_per_minute: 5, max_concurrent: 3}\n"
        "      budget: {daily_usd: 2}\n"
        "providers:",
        1,
    )
    gw = gateway(text_policy)
    with httpx.Client(base_url=gw.base_url) as c:
        statuses = [
            c.post(
                "/chat/completions", json=CHAT, headers={"authorization": "Bearer dash-a"}
            ).status_code
            for _ in range(6)
        ]
        assert (
            c.post(
                "/chat/completions", json=CHAT, headers={"authorization": "Bearer dash-b"}
            ).status_code
            == 200
        )
    assert statuses == [200] * 5 + [429]
    browser.get(gw.url + "/dashboard?interval=500")
    row = "tr[data-tenant='team-a']"
    wait_for(lambda: text(browser, row))
    cells = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' td')].map(td => td.textContent)",
        row,
    )
    # tenant, requests/min used of the limit, tokens/min (no limit), in flight, budget, counts
    assert cells[0] == "team-a"
    assert cells[1].startswith("5 / 5")
    assert cells[2] == "–"
    assert cells[3].startswith("0 / 3")
    assert cells[4].startswith("day: $0.0000 / $2.00")
    assert cells[5:7] == ["5", "1"]
    assert "team-b" in text(browser, "#tenants")
    assert "1 gateway process" in text(browser, "#limits-mode")
    assert severe_logs(browser) == []
