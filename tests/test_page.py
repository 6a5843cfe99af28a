"""The chat page `paradec serve` serves at `/`: its files (no CDN, a strict CSP), the stream's `paradec`
trace (present when asked, absent otherwise, consistent with what was committed), the API key, and
a real headless Chromium that chats, races and shows model text as text, never as markup."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from importlib.resources import files

import httpx
import pytest

pytest.importorskip("uvicorn")
from test_serve import NAME, _engine, _Server  # noqa: E402

from paradec.serve import build_app  # noqa: E402

KEY = "page-key"
CHROMIUM_WAIT_S = 600  # .ci/run's background install of chromium, at most
STATIC = files("paradec") / "serve" / "static"


@pytest.fixture(scope="module")
def server(llama_dir, drafters):
    app = build_app(_engine(llama_dir, drafters), NAME, max_batch=4, api_key=KEY, max_tokens_limit=200)
    s = _Server(app)
    yield s
    s.stop()


def _auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_the_page_and_its_files_are_served_with_nothing_from_elsewhere(server):
    page = httpx.get(server.url + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/static/app.js">' in page.text
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = httpx.get(f"{server.url}/static/{name}", timeout=30)  # no key: static text, no data
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
    for f in STATIC.iterdir():
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", f.read_text()), f.name  # no CDN
        assert "innerHTML" not in f.read_text(), f.name  # model text is set as text only
    assert httpx.get(server.url + "/static/secret.py", headers=_auth(), timeout=30).status_code == 404
    # every route with data still asks for the key
    assert httpx.get(server.url + "/paradec/info", timeout=30).status_code == 401
    info = httpx.get(server.url + "/paradec/info", headers=_auth(), timeout=30).json()
    assert info["model"] == NAME and info["default_method"] == "auto" and {"ar", "auto", "pld"} <= set(info["methods"])


def _stream(server, trace: bool | None, method: str = "pld") -> list[dict]:
    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": "Write a stack class. Write a stack class."}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
        "method": method,
        "stream_options": {"include_usage": True},
    }
    if trace is not None:
        body["trace"] = trace
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=_auth(), timeout=60) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("method", ["pld", "auto", "ar"])
def test_the_trace_is_there_when_asked_and_says_how_each_token_was_committed(server, method):
    plain = _stream(server, None, method)
    assert not any("paradec" in c for c in plain)
    assert not any("paradec" in c for c in _stream(server, False, method))
    traced = _stream(server, True, method)
    text = lambda chunks: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])  # noqa: E731
    assert text(traced) == text(plain)  # the same answer, one token per chunk
    tokens = [c for c in traced if "paradec" in c]
    usage = traced[-1]["usage"]
    assert len(tokens) == usage["completion_tokens"]
    steps = {}
    for c in tokens:
        t = c["paradec"]
        steps.setdefault(t["step"], []).append(t)
    assert len(steps) == usage["paradec"]["steps"]
    for step in steps.values():
        kinds = [t["kind"] for t in step]
        accepted, drafted = step[0]["accepted"], step[0]["drafted"]
        if drafted == 0:
            assert kinds == ["plain"]
        else:
            assert kinds[:accepted] == ["draft"] * accepted and set(kinds[accepted:]) <= {"bonus"}
            assert accepted <= drafted and len(kinds) <= accepted + 1
    if method == "ar":
        assert {t["kind"] for s in steps.values() for t in s} == {"plain"}
    if method == "pld":
        assert any(t["kind"] == "draft" for s in steps.values() for t in s)  # the prompt repeats itself


# ---- a real browser ---------------------------------------------------------------------------------
def _chromium():
    """A headless Chromium through Selenium and Debian's chromedriver, or a skip that says what is missing
    (.ci/run installs them in the background and names a marker file it writes when done)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (a test extra)")
    marker = os.environ.get("PARADEC_CHROMIUM_MARKER")
    deadline = time.time() + CHROMIUM_WAIT_S
    while marker and not os.path.exists(marker) and time.time() < deadline:
        time.sleep(2)
    driver_path = shutil.which("chromedriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if driver_path is None or browser is None:
        pytest.skip("no Chromium here: apt-get install chromium chromium-driver (.ci/run does)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_a_browser_chats_shows_how_tokens_were_committed_and_races(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    prompt = "Write a stack class. Write a stack class."
    browser = _chromium()
    try:
        wait = WebDriverWait(browser, 120)
        browser.get(server.url + "/")
        browser.find_element(By.ID, "key").send_keys(KEY)  # the page asks for the key
        browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#method option")) > 2)
        Select(browser.find_element(By.ID, "method")).select_by_value("pld")
        browser.find_element(By.ID, "max-tokens").clear()
        browser.find_element(By.ID, "max-tokens").send_keys("40")
        browser.find_element(By.ID, "prompt").send_keys(prompt)
        browser.find_element(By.ID, "send").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".turn.assistant.done"))
        spans = browser.find_elements(By.CSS_SELECTOR, ".turn.assistant .tok")
        shown = browser.execute_script(
            "return Array.from(document.querySelectorAll('.turn.assistant .tok')).map(s => s.textContent).join('')"
        )
        api = httpx.post(
            server.url + "/v1/chat/completions",
            json={
                "model": NAME,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 40,
                "temperature": 0,
                "method": "pld",
            },
            headers=_auth(),
            timeout=60,
        ).json()
        assert shown == api["choices"][0]["message"]["content"]  # the coloured spans are the API's answer
        assert any("draft" in s.get_attribute("class") for s in spans)
        # the tau shown is that answer's own (tokens per verification pass, from its trace); a second
        # request may take other passes, since the server sizes drafts by measured cost
        titles = [s.get_attribute("title") or "" for s in spans]
        passes = [m.group(1) for m in map(re.compile(r"pass (\d+):").match, titles) if m]
        tau = float(browser.find_element(By.ID, "s-tau").get_attribute("data-value"))
        assert tau == pytest.approx(len(passes) / len(set(passes)), abs=1e-4)
        browser.find_element(By.ID, "race").click()  # the last question again: ar, then pld
        wait.until(lambda b: "x ar" in b.find_element(By.ID, "lane-b-time").text)
        assert "finished in" in browser.find_element(By.ID, "lane-a-time").text
        browser.save_screenshot(str(tmp_path / "page.png"))
        assert (tmp_path / "page.png").stat().st_size > 10_000
        # model text is text: markup in it is shown, never run or rendered
        evil = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'><b>bold</b>"
        browser.execute_script(
            "const box = window.paradec.turn('assistant');new window.paradec.Answer(box, 'x').add(arguments[0], null);",
            evil,
        )
        last = browser.find_elements(By.CSS_SELECTOR, ".turn.assistant .answer")[-1]
        assert last.text == evil and not last.find_elements(By.CSS_SELECTOR, "script, img, b")
        assert browser.execute_script("return window.pwned") is None
    finally:
        browser.quit()
