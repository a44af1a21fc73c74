"""The web console in a real headless browser (issue 30 item 5): Debian's chromium driven by
playwright against a real `dpch serve` process. Log in, see the catalog, explain a query (nothing
charged), run it, see the result table, the charged cost and the budget drop with the spend chart,
then see a refusal rendered as ClickHouse's error text with nothing charged. Every request the page
makes goes to the gateway (no CDN). A screenshot is saved under tests/artifacts/ (git-ignored).

Skipped only when /usr/bin/chromium is absent (`make system-deps` installs it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from test_console_routes import ALICE, make_data_dir
from test_gateway import Server

CHROMIUM = Path("/usr/bin/chromium")
# the machine's closed network: no QUIC, no background fetches, no component updates
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
QUERY = "SELECT region, COUNT(*) AS n FROM demo.purchases GROUP BY region ORDER BY region"

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (Debian's chromium; "
                                "`make system-deps` installs it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(make_data_dir(tmp_path_factory, "console_browser")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


LEFT = '#budget-table tr[data-dataset="demo.purchases"] td.eps-left'


def eps_left(page) -> float:
    return float(page.locator(LEFT).inner_text())


def test_console_end_to_end(server, browser):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    requests, console_errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)
    left = page.locator(LEFT)
    page.goto(server.url + "/play")
    assert page.title() == "DPCH console"

    # a wrong password is an error, rendered, and nothing is shown
    page.fill("#user", ALICE[0])
    page.fill("#password", "wrong")
    page.click("#connect")
    page.wait_for_selector("#error:not([hidden])")
    assert "AUTHENTICATION_FAILED" in page.inner_text("#error")
    assert page.locator("#budget-table").count() == 0

    # log in: the catalog and the budget appear
    page.fill("#password", ALICE[1])
    page.click("#connect")
    page.wait_for_selector("body[data-connected='1']")
    assert page.inner_text("#who") == "connected as alice"
    catalog = page.inner_text("#catalog")
    assert "demo.purchases" in catalog and "unit user_id" in catalog and "public keys:" in catalog
    assert "privacy unit" in page.locator("#catalog tr", has_text="user_id").inner_text()
    assert eps_left(page) == 5
    assert "No charges yet." in page.inner_text("#chart")

    # explain first: the plan and its cost, nothing charged
    page.fill("#sql", QUERY)
    page.fill("#epsilon", "1")
    page.click("#explain")
    page.wait_for_selector("#explanation:not([hidden])")
    assert "total cost: ε=1" in page.inner_text("#explanation")
    assert "Would charge ε = 1" in page.inner_text("#cost")
    assert eps_left(page) == 5
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "console-explain.png"), full_page=True)

    # run it: the table, the charged cost, the budget drop and the chart
    page.click("#run")
    page.wait_for_selector("#result-table")
    expect(left).to_have_text("4")
    headers = page.locator("#result-table th").all_inner_texts()
    assert headers == ["region", "n"]
    regions = [r.split("\t")[0] for r in page.locator("#result-table tr").all_inner_texts()[1:]]
    assert len(regions) > 1 and regions == sorted(regions)
    assert page.inner_text("#cost") == "Charged ε = 1, δ = 0"
    assert page.locator("#error").is_hidden()
    assert eps_left(page) == 4
    assert page.locator('svg.chart polyline.spend[data-dataset="demo.purchases"]').get_attribute("data-charges") == "1"

    # a refused query: ClickHouse's error text, rendered; the table is cleared; nothing is charged
    page.fill("#sql", "SELECT user_id, amount FROM demo.purchases")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    error = page.inner_text("#error")
    assert error.startswith("Code: 9101.") and "DPCH_QUERY_REJECTED" in error
    assert page.locator("#result-table").count() == 0
    assert eps_left(page) == 4
    page.screenshot(path=str(ARTIFACTS / "console-refusal.png"), full_page=True)

    # more than is left: refused by the ledger, nothing charged
    page.fill("#sql", QUERY)
    page.fill("#epsilon", "10")
    page.click("#run")
    expect(page.locator("#error")).to_contain_text("DPCH_BUDGET_EXCEEDED")
    assert eps_left(page) == 4
    assert page.locator("svg.chart polyline.spend").get_attribute("data-charges") == "1"

    # a second query moves the chart
    page.fill("#epsilon", "0.5")
    page.click("#run")
    expect(left).to_have_text("3.5")
    assert page.locator("svg.chart polyline.spend").get_attribute("data-charges") == "2"
    assert page.locator("#error").is_hidden()

    shot = ARTIFACTS / "console.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"console screenshots: {shot} (and console-explain.png, console-refusal.png)")
    assert shot.stat().st_size > 10_000

    assert requests and all(u.startswith(server.url + "/") for u in requests), requests  # no CDN
    assert not [e for e in console_errors if "403" not in e and "400" not in e], console_errors
    page.close()
