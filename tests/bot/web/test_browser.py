"""The pages in a real browser: Debian's headless Chromium driven by Selenium (Debian's chromedriver),
every page screenshotted, the plots counted as the browser lays them out, a point clicked through."""
from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.bot.web.conftest import MAIN_POINTS

pytestmark = pytest.mark.services

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1200,1400"]
SHOTS = os.environ.get("TOKENGATE_SCREENSHOTS")  # keep the screenshots here (else the test's tmp dir)


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip(f"Chromium is not installed ({CHROMIUM}, {DRIVER}): apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install selenium")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def server(settings):
    """The real app (create_app) under uvicorn on a free local port, in a thread."""
    import uvicorn

    from bot.web.webhook import create_app
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.mark.sandbox
def test_every_page_in_chromium(browser, server, filled, tmp_path):
    from selenium.webdriver.common.by import By
    shots = Path(SHOTS) if SHOTS else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    repo = filled.repo_name
    pages = {"index": "/", "overview": f"/repos/{repo}", "history": f"/repos/{repo}/history",
             "journey": f"/repos/{repo}/journey", "evaluation": f"/evaluations/{filled.eval_ids['slow']}",
             "measurement": f"/measurements/{filled.main_ids[-1]}", "queue": "/queue", "hosts": "/hosts"}
    for name, path in pages.items():
        browser.get(server + path)
        assert "tokengate" in browser.title, (name, browser.title)
        assert browser.save_screenshot(str(shots / f"{name}.png")), name
        assert (shots / f"{name}.png").stat().st_size > 5000

    browser.get(server + f"/repos/{repo}/history")
    section = browser.find_element(By.ID, "qwen35-tiny-decode@512")
    assert section.screenshot(str(shots / "history-qwen35-tiny-decode@512.png"))
    dots = section.find_elements(By.CSS_SELECTOR, "svg.plot circle.point")
    assert len(dots) == MAIN_POINTS + 1  # the stand-in merges and the merged win
    assert all(d.is_displayed() and d.size["width"] > 0 for d in dots)  # laid out, not just in the markup
    xs = [d.location["x"] for d in dots]
    assert xs == sorted(xs) and len(set(xs)) == len(xs)  # commits left to right, none on top of another
    real = browser.find_element(By.ID, "fake-decode@32").find_elements(By.CSS_SELECTOR, "circle.point")
    assert len(real) == 2
    memory = browser.find_element(By.CSS_SELECTOR, "section.memory").find_elements(By.CSS_SELECTOR, "circle.point")
    assert len(memory) == 2
    # A point is a link to its measurement: click the last one of the real history.
    browser.execute_script("arguments[0].closest('a').dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                           real[-1])
    deadline = time.monotonic() + 10
    while "/measurements/" not in browser.current_url and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "/measurements/" in browser.current_url
    assert "Download the receipt" in browser.page_source

    browser.get(server + f"/repos/{repo}/journey")
    assert len(browser.find_elements(By.CSS_SELECTOR, "svg.journey circle.point")) >= 1
