"""The chat page in a headless Chromium against `paradec serve` on the default model: its load time
and size, and a screenshot mid-answer (issue 34): a race of a method against `ar`, then the same
method answering a code question, captured while it streams.

    python benchmarks/page_shot.py --method eagle+ngram --out docs/chat_page.png

Needs `pip install -e ".[serve,test]"` and Debian's chromium + chromium-driver.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import httpx

QUESTION = "Write a Python function that returns the n-th Fibonacci number, with a docstring and two doctests."


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="eagle+ngram")
    ap.add_argument("--out", default="docs/chat_page.png")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--mid", type=int, default=60, help="screenshot once this many tokens are shown")
    args = ap.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    port = _port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "paradec", "serve", "--port", str(port), "--max-batch", "2"])
    try:
        deadline = time.time() + 600
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(1)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
            options.add_argument(flag)
        browser = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        try:
            wait = WebDriverWait(browser, 600)
            loads = []
            for _ in range(5):  # the page's load time: median of five cold loads
                browser.get(url + "/")
                wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#method option")) > 1)
                loads.append(
                    browser.execute_script(
                        "const t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime"
                    )
                )
            Select(browser.find_element(By.ID, "method")).select_by_value(args.method)
            box = browser.find_element(By.ID, "max-tokens")
            box.clear()
            box.send_keys(str(args.max_tokens))
            browser.find_element(By.ID, "prompt").send_keys(QUESTION)
            browser.find_element(By.ID, "race").click()
            wait.until(lambda b: "x ar" in b.find_element(By.ID, "lane-b-time").text)
            race = [browser.find_element(By.ID, i).text for i in ("lane-a-time", "lane-b-time")]
            browser.find_element(By.ID, "send").click()
            wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".turn.assistant .tok")) >= args.mid)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            browser.save_screenshot(args.out)
        finally:
            browser.quit()
    finally:
        server.terminate()
        server.wait(30)
    static = files("paradec") / "serve" / "static"
    sizes = {f.name: f.read_bytes().__len__() for f in static.iterdir()}
    loads.sort()
    print(
        json.dumps(
            {
                "load_ms_median": round(loads[len(loads) // 2], 1),
                "load_ms_all": [round(x, 1) for x in loads],
                "bytes": sizes,
                "kb_total": round(sum(sizes.values()) / 1024, 1),
                "race": race,
                "screenshot": args.out,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
