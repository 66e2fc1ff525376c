"""/dashboard: the operator's page, driven in a real headless browser (Debian's chromium through
its chromedriver, nothing downloaded) against a real server on the tiny model."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from tests.support.browser import browser, row, until, visible  # noqa: F401 - browser: the fixture
from tests.support.chat import ask
from tests.support.inprocess import InProcessServer


# Markup, a slash, a query and a fragment, a percent escape: shown as text, sent encoded.
AGENT = 'dash <b>bold</b> & "a/b?c#d" %2F'
KEY = "dash+board/key=1&2"


def shown_tokens(driver, agent: str) -> int | None:
    from selenium.webdriver.common.by import By

    tr = row(driver, agent)
    return int(re.sub(r"\D", "", tr.find_element(By.CSS_SELECTOR, "td.tokens").text)) if tr else None


def agent_ids(server: InProcessServer, **headers) -> list[str]:
    with server.http() as http:
        return [a["id"] for a in http.get("/v1/agents", headers=headers).json()["data"]]


def api_tokens(server: InProcessServer, agent: str) -> int:
    with server.http() as http:
        return http.get("/v1/agents/" + quote(agent, safe="")).json()["tokens"]


def no_page_errors(driver) -> list:
    """Console errors: a blocked script or style (CSP), an exception, a failed request other
    than the 401s the key test provokes on purpose."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and " 401 " not in e["message"]]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("dash")) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("dash-key"), "--api-key", KEY) as s:
        yield s


def test_the_page_is_served_without_the_key_and_holds_no_data(keyed):
    with keyed.http() as http:
        page = http.get("/dashboard")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert page.headers["referrer-policy"] == "no-referrer"
        for asset, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
            r = http.get(f"/dashboard/{asset}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(media)
        assert http.head("/dashboard").status_code == 200
        # Only those three paths are open: the data and anything else under /dashboard are not.
        for path in ("/v1/agents", "/metrics", "/dashboard/other", "/dashboard/"):
            assert http.get(path).status_code == 401, path
        assert http.get("/v1/agents", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_dashboard_shows_updates_and_deletes_an_agent(browser, server):
    from selenium.webdriver.common.by import By

    client = server.client()
    messages = [{"role": "user", "content": "Plan a three day trip to the mountains."}]
    first = ask(client, messages, AGENT)

    browser.get(server.base_url + "/dashboard")
    until(browser, lambda d: row(d, AGENT) is not None, message="the agent never appeared")
    assert browser.find_elements(By.CSS_SELECTOR, "#agents tbody b") == []  # its id is text, not markup
    assert row(browser, AGENT).find_element(By.CSS_SELECTOR, "th").text == AGENT
    # What the API says, once the page has caught up (a turn's reply is committed just after it).
    until(browser, lambda d: shown_tokens(d, AGENT) == api_tokens(server, AGENT), message="tokens differ from the API")
    # Its first request's miss (docs/usage.md, "Why a request missed"): a new conversation.
    miss = lambda d: row(d, AGENT).find_element(By.CSS_SELECTOR, "td.miss").text  # noqa: E731
    until(browser, lambda d: miss(d).startswith("new conversation at "), message="no last miss shown")
    assert "MiB" in browser.find_element("id", "hot-text").text or "KiB" in browser.find_element("id", "hot-text").text
    assert not visible(browser, "keyform")

    # A second turn: the agent grows, and that turn was served from its cache.
    before = shown_tokens(browser, AGENT)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Now make it five days, with a rest day in the middle."},
    ]
    ask(client, messages, AGENT)
    until(browser, lambda d: (shown_tokens(d, AGENT) or 0) > before, message="the token count never grew")
    until(browser, lambda d: shown_tokens(d, AGENT) == api_tokens(server, AGENT), message="tokens differ from the API")
    until(browser, lambda d: d.find_element("id", "hit-value").text.endswith("%"), message="no hit ratio")
    until(browser, lambda d: re.search(r"\d (ms|s)$", d.find_element("id", "ttft-value").text), message="no TTFT")
    assert browser.find_elements(By.CSS_SELECTOR, "#hit-spark svg polyline, #hit-spark svg circle")

    # Delete asks first; cancelling keeps the agent.
    row(browser, AGENT).find_element(By.CSS_SELECTOR, "button.delete").click()
    until(browser, lambda d: visible(d, "confirm"))
    assert browser.find_element("id", "confirm-id").text == AGENT
    browser.find_element("id", "confirm-cancel").click()
    until(browser, lambda d: not visible(d, "confirm"))
    assert AGENT in agent_ids(server)

    row(browser, AGENT).find_element(By.CSS_SELECTOR, "button.delete").click()
    until(browser, lambda d: visible(d, "confirm"))
    browser.find_element("id", "confirm-delete").click()
    until(browser, lambda d: row(d, AGENT) is None, message="the row stayed")
    assert not visible(browser, "confirm")
    assert AGENT not in agent_ids(server)
    with server.http() as http:
        assert http.get("/v1/agents/" + quote(AGENT, safe="")).status_code == 404
    assert no_page_errors(browser) == []


def test_with_an_api_key_the_page_needs_it(browser, keyed):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    ask(keyed.client(api_key=KEY), [{"role": "user", "content": "Say hello."}], "keyed-agent")
    dashboard = keyed.base_url + "/dashboard"

    # Without the key: the key form, no data.
    browser.get(dashboard)
    until(browser, lambda d: visible(d, "keyform"), message="no key form")
    assert not visible(browser, "data")
    assert "keyed-agent" not in browser.page_source
    assert browser.find_element("id", "model").text == "—"

    # A wrong key, in the fragment: refused, forgotten, still no data.
    browser.get(dashboard + "#key=wrong")
    until(browser, lambda d: "refused" in d.find_element("id", "key-why").text, message="wrong key not refused")
    assert not visible(browser, "data") and "keyed-agent" not in browser.page_source
    assert browser.execute_script("return sessionStorage.length") == 0

    # The key typed into the form: the data.
    field = browser.find_element("id", "key-input")
    field.send_keys(KEY)
    field.send_keys(Keys.ENTER)
    until(browser, lambda d: row(d, "keyed-agent") is not None, message="no data with the key")
    assert not visible(browser, "keyform")
    assert browser.find_element("id", "model").text != "—"

    # "Forget key": back to the form, the data gone from the page.
    browser.find_element("id", "forget").click()
    until(browser, lambda d: visible(d, "keyform"))
    assert row(browser, "keyed-agent") is None and "keyed-agent" not in browser.page_source

    # The key in a link's fragment: taken, wiped from the address bar, kept for this tab.
    browser.get(dashboard + "#key=" + quote(KEY, safe=""))
    until(browser, lambda d: row(d, "keyed-agent") is not None, message="no data with the key in the fragment")
    assert "key" not in browser.current_url.split("/dashboard", 1)[1]
    browser.refresh()
    until(browser, lambda d: row(d, "keyed-agent") is not None, message="the key was not kept in the tab")
    assert browser.find_elements(By.CSS_SELECTOR, "#agents tbody tr")

    # A fragment never leaves the browser, and the page sends the key only as a header.
    assert KEY not in keyed.log() and quote(KEY, safe="") not in keyed.log()
    assert no_page_errors(browser) == []


@pytest.fixture(scope="module")
def two_models(tiny_model, tmp_path_factory):
    """A hybrid model (qwen3_5: recurrent layers, snapshots) served first, the tiny llama beside it."""
    from agent_memory.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("dash-two")
    with InProcessServer(build_tiny(root / "qwen3_5", arch="qwen3_5"), root / "cache", "--model", str(tiny_model)) as s:
        yield s


def plan(server: InProcessServer, model: str, agent: str) -> None:
    messages = [{"role": "user", "content": "Plan a three day trip to the mountains."}]
    server.client().chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, extra_body={"prompt_cache_key": agent}
    )


def test_a_hybrid_models_snapshots_have_their_own_part_of_the_memory_bar(browser, two_models):
    """A model with recurrent layers keeps snapshots beside its blocks: the hot bar draws them
    as their own segment and the legend names them (for other models it stays hidden)."""
    s = two_models
    plan(s, "qwen3_5", "hiker")
    browser.get(s.base_url + "/dashboard")
    until(browser, lambda d: visible(d, "hot-snapshots-key"), message="the snapshots' legend never appeared")
    assert re.search(r"\d (KiB|MiB)$", browser.find_element("id", "hot-snapshots").text)
    width = browser.execute_script("return document.querySelector('#hot-bar .seg.snapshots').style.width")
    assert width.endswith("%") and float(width[:-1]) > 0
    assert no_page_errors(browser) == []


def test_with_several_models_each_agent_row_names_its_model(browser, two_models):
    """Which models are loaded now, and an agent of two models as two rows."""
    from selenium.webdriver.common.by import By

    s = two_models
    plan(s, "qwen3_5", "walker")
    browser.get(s.base_url + "/dashboard")
    model_line = lambda d: d.find_element("id", "model").text  # noqa: E731
    until(browser, lambda d: model_line(d) == "qwen3_5 (loaded), tiny (not loaded)", message="no model line")
    plan(s, "tiny", "walker")
    until(browser, lambda d: model_line(d) == "qwen3_5 (loaded), tiny (loaded)", message="tiny never loaded")
    names = lambda d: sorted(e.text for e in d.find_elements(By.CSS_SELECTOR, "#agents tbody th.id"))  # noqa: E731
    until(browser, lambda d: {"walker · qwen3_5", "walker · tiny"} <= set(names(d)), message=str(names(browser)))
    assert no_page_errors(browser) == []


@pytest.fixture(scope="module")
def vision(tmp_path_factory):
    """The tiny Gemma 3 vision model (models/tiny_vision.py)."""
    from agent_memory.models.tiny_vision import build_tiny_vision

    root = tmp_path_factory.mktemp("dash-vision")
    with InProcessServer(build_tiny_vision(root / "gemma3", arch="gemma3"), root / "cache") as s:
        yield s


def test_images_in_prompts_are_counted_on_the_cache_card(browser, vision):
    """How many images came in, and how many the vision tower had to see (the rest: from memory)."""
    from tests.support.images import data_url, encoded, picture

    browser.get(vision.base_url + "/dashboard")
    until(browser, lambda d: "collecting" not in d.find_element("id", "hit-detail").text, message="no rates")
    look = [{"type": "image_url", "image_url": {"url": data_url(encoded(picture()))}}, {"type": "text", "text": "Hi"}]
    messages = [{"role": "user", "content": look}]
    for _ in range(2):  # the second time its image's tokens come from memory: no tower
        vision.client().chat.completions.create(
            model="gemma3", messages=messages, max_tokens=4, temperature=0, extra_body={"prompt_cache_key": "viewer"}
        )
    shown = lambda d: d.find_element("id", "hit-detail").text  # noqa: E731
    until(browser, lambda d: "2 images in prompts, 1 through the vision tower" in shown(d), message="no images shown")
    assert no_page_errors(browser) == []
