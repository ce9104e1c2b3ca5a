"""The explorer in a real browser: `streamlit run app.py` on a free localhost port, opened in
headless Chromium through selenium; the headline must appear, and a screenshot is saved.

Skips cleanly when selenium, /usr/bin/chromium or /usr/bin/chromedriver is missing
(Debian: `apt-get install -y chromium chromium-driver`). Set APP_SCREENSHOT=path to also copy
the screenshot there (docs/app.png is made that way).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

selenium = pytest.importorskip("selenium")
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("chromium and chromedriver are not installed "
                "(apt-get install -y chromium chromium-driver)", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

START_TIMEOUT_S = 60
RESULT_TIMEOUT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if proc.poll() is not None:
            raise AssertionError(f"streamlit exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"streamlit did not answer on {url} within {timeout:.0f} s")


@pytest.fixture
def server(tmp_path):
    port = _free_port()
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    log = open(tmp_path / "streamlit.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url, proc, START_TIMEOUT_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def browser():
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--window-size=1600,2200"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_page_renders_headline_and_screenshot(server, browser, tmp_path):
    browser.get(server)
    wait = WebDriverWait(browser, RESULT_TIMEOUT_S, poll_frequency=0.5)
    # the headline metrics: "Days" and the floor "... days"
    wait.until(lambda d: any(m.text.strip().startswith("Days")
                             for m in d.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')))
    wait.until(lambda d: "Pareto frontier" in d.find_element(By.TAG_NAME, "body").text)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "days" in body
    assert "Fastest feasible" in body
    assert "Traceback" not in body
    # let the charts finish drawing, then save
    time.sleep(2)
    shot = tmp_path / "app.png"
    assert browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    dest = os.environ.get("APP_SCREENSHOT")
    if dest:
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)
