"""The explorer in a real browser: `streamlit run app.py` on a free localhost port, opened in
headless Chromium through selenium; the headline must appear, and a walk through the explorer
(another GPU and count, a model that does not fit, a pinned knob, an uploaded config.json, the
budget report downloaded) must work, with a screenshot of each step.

Skips cleanly when selenium, /usr/bin/chromium or /usr/bin/chromedriver is missing
(Debian: `apt-get install -y chromium chromium-driver`). Set APP_SCREENSHOT=path to also copy
the headline screenshot there (docs/app.png is made that way) and APP_SCREENSHOTS=folder for the
walks' screenshots (docs/app-*.png, docs/app_planner_*.png).
"""

from __future__ import annotations

import json
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
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
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
def browser(tmp_path):
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--window-size=1600,2200"):
        opts.add_argument(flag)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.downloads = downloads
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _body(d) -> str:
    return d.find_element(By.TAG_NAME, "body").text


def _settled(d) -> bool:
    """No script run in progress (Streamlit's status widget says 'Running' while it works)."""
    status = d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
    return not any("Running" in s.text for s in status)


def _wait_for(d, predicate, timeout: float = RESULT_TIMEOUT_S) -> None:
    time.sleep(0.5)  # let the rerun start
    WebDriverWait(d, timeout, poll_frequency=0.5, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda x: _settled(x) and predicate(x))


def _widget(d, testid: str, label: str):
    for w in d.find_elements(By.CSS_SELECTOR, f'[data-testid="{testid}"]'):
        if w.text.strip().startswith(label):
            d.execute_script("arguments[0].scrollIntoView({block: 'center'});", w)
            return w
    raise AssertionError(f"no {testid} labelled {label!r}")


def _choose(d, label: str, option: str) -> None:
    """Pick ``option`` in the selectbox labelled ``label`` (type to filter, Enter to pick)."""
    box = _widget(d, "stSelectbox", label)
    box.find_element(By.CSS_SELECTOR, "input").click()
    field = d.switch_to.active_element
    field.send_keys(option)
    time.sleep(0.3)
    field.send_keys(Keys.ENTER)


def _number(d, label: str, value: int) -> None:
    inp = _widget(d, "stNumberInput", label).find_element(By.CSS_SELECTOR, "input")
    inp.send_keys(Keys.CONTROL, "a")
    inp.send_keys(str(value), Keys.ENTER)


def _radio(d, option: str) -> None:
    for lab in d.find_elements(By.CSS_SELECTOR, '[data-testid="stRadio"] label'):
        if lab.text.strip() == option:
            d.execute_script("arguments[0].scrollIntoView({block: 'center'});", lab)
            lab.click()
            return
    raise AssertionError(f"no radio option {option!r}")


def _shot(d, tmp_path: Path, name: str, at: str | None = None) -> Path:
    """Save a screenshot, scrolled to the top or to the element with data-testid ``at``."""
    time.sleep(1.5)  # let the charts finish drawing
    if at is None:
        d.execute_script("window.scrollTo(0, 0);")
    else:
        el = d.find_elements(By.CSS_SELECTOR, f'[data-testid="{at}"]')[-1]
        d.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        time.sleep(0.5)
    shot = tmp_path / name
    assert d.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    dest = os.environ.get("APP_SCREENSHOTS")  # a folder (docs/ is refreshed that way)
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, Path(dest) / name)
    return shot


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


def test_walk_through_the_explorer(server, browser, tmp_path):
    """Default view; another GPU and count; a model that does not fit; a pinned knob; an uploaded
    config.json; the budget report downloaded. Screenshots of each step."""
    d = browser
    d.get(server)
    _wait_for(d, lambda x: "Pareto frontier" in _body(x) and "Days, likely range" in _body(x))
    body = _body(d)
    assert "Where the range comes from" in body and "Traceback" not in body
    _shot(d, tmp_path, "app-1-default.png")

    _choose(d, "GPU", "H100 80GB SXM")
    _wait_for(d, lambda x: "H100" in _body(x).split("Fastest feasible")[0])
    _number(d, "GPUs per node", 4)
    _wait_for(d, lambda x: "4 × " in _body(x) and "H100" in _body(x))
    _shot(d, tmp_path, "app-2-gpu-and-count.png")

    _choose(d, "Preset", "mpt-70b")
    _number(d, "GPUs per node", 1)
    _wait_for(d, lambda x: "Nothing fits" in _body(x))
    body = _body(d)
    assert "What would fit" in body and "Days, estimate" not in body
    _shot(d, tmp_path, "app-3-infeasible.png")

    _choose(d, "Preset", "pythia-1b")
    _number(d, "GPUs per node", 8)
    _wait_for(d, lambda x: "Fastest feasible" in _body(x))
    _radio(d, "Pin knobs")
    _wait_for(d, lambda x: "Sharding" in _body(x))
    _choose(d, "Sharding", "zero3")
    _wait_for(d, lambda x: "ZeRO-3" in _body(x).split("Top")[0])
    _shot(d, tmp_path, "app-4-pinned.png")

    _radio(d, "Upload config.json")
    _wait_for(d, lambda x: "Upload a Hugging Face config.json" in _body(x))
    up = d.find_element(By.CSS_SELECTOR, '[data-testid="stFileUploader"] input[type="file"]')
    up.send_keys(str(ROOT / "tests" / "fixtures" / "hf_configs" / "gpt2.json"))
    _wait_for(d, lambda x: "Fastest feasible" in _body(x) and "Upload a Hugging Face" not in _body(x))
    _shot(d, tmp_path, "app-5-upload.png")

    _radio(d, "Preset")
    _wait_for(d, lambda x: "Budget (Markdown)" in _body(x))
    button = _widget(d, "stDownloadButton", "Budget (Markdown)").find_element(By.TAG_NAME, "button")
    WebDriverWait(d, RESULT_TIMEOUT_S).until(lambda x: button.is_enabled())
    button.click()
    WebDriverWait(d, 30, poll_frequency=0.5).until(
        lambda x: any(p.suffix == ".md" for p in d.downloads.iterdir()))
    report = next(p for p in d.downloads.iterdir() if p.suffix == ".md").read_text()
    assert report.startswith("# Compute budget justification") and "configuration on screen" in report


def _verdict_text(d) -> str:
    for kind in ("stAlertContentSuccess", "stAlertContentWarning", "stAlertContentError"):
        for el in d.find_elements(By.CSS_SELECTOR, f'[data-testid="{kind}"]'):
            if el.text.startswith(("Fits", "Misses")):
                return el.text
    return ""


def _download(d, label: str, suffix: str) -> Path:
    button = _widget(d, "stDownloadButton", label).find_element(By.TAG_NAME, "button")
    WebDriverWait(d, RESULT_TIMEOUT_S).until(lambda x: button.is_enabled())
    button.click()
    WebDriverWait(d, 30, poll_frequency=0.5).until(
        lambda x: any(p.suffix == suffix for p in d.downloads.iterdir()))
    return next(p for p in d.downloads.iterdir() if p.suffix == suffix)


def test_planner_path(server, browser, tmp_path):
    """What a grant planner does: a model, the hardware, a budget and a deadline; the verdict on
    screen and on the chart; the plan and the budget report downloaded, saying the same."""
    d = browser
    d.get(server)
    _wait_for(d, lambda x: "Days, likely range" in _body(x) and "Pareto frontier" in _body(x))
    _choose(d, "Preset", "pythia-410m")
    _wait_for(d, lambda x: "Pythia-410M" in _body(x) and "Pareto frontier" in _body(x))
    assert "Recipe:" in _body(d)
    _shot(d, tmp_path, "app_planner_1_model.png")

    _choose(d, "GPU", "A100 80GB SXM")
    _wait_for(d, lambda x: "A100" in _body(x).split("Fastest feasible")[0])
    _number(d, "GPUs per node", 4)
    _wait_for(d, lambda x: "4 × A100" in _body(x) and "Pareto frontier" in _body(x))
    _shot(d, tmp_path, "app_planner_2_hardware.png")

    _number(d, "Budget, $", 100000)
    _wait_for(d, lambda x: "budget $100,000" in _verdict_text(x))
    _number(d, "Deadline, days", 5)
    _wait_for(d, lambda x: "deadline 5.0 days" in _verdict_text(x))
    verdict = _verdict_text(d)
    assert verdict.startswith("Misses") and "past the 5.0-day deadline" in verdict, verdict
    _shot(d, tmp_path, "app_planner_3_misses.png")

    _number(d, "Deadline, days", 60)
    _wait_for(d, lambda x: "deadline 60.0 days" in _verdict_text(x))
    verdict = _verdict_text(d)
    assert verdict.startswith("Fits the budget and the deadline"), verdict
    _shot(d, tmp_path, "app_planner_4_fits.png")
    _wait_for(d, lambda x: "Dashed lines: your budget and deadline" in _body(x))
    _shot(d, tmp_path, "app_planner_5_chart.png", at="stVegaLiteChart")

    plan = json.loads(_download(d, "Plan (JSON)", ".json").read_text())
    assert plan["budget_check"]["verdict"] == "fits" and plan["budget_check"]["deadline_days"] == 60
    report = _download(d, "Budget (Markdown)", ".md").read_text()
    assert report.startswith("# Compute budget justification") and "configuration on screen" in report
    assert "deadline 60.0 days" in report and "$100,000" in report
    assert "Traceback" not in _body(d)
