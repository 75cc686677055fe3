"""The fleet pages in a real browser: Debian's chromium, headless, driven by Selenium through Debian's chromedriver,
against ``airflow api-server`` serving the night of ``night.write_night`` (nothing downloads a browser).

Screenshots go to ``TRAINPIPE_FLEET_SCREENSHOTS`` when set (docs/img/ holds the ones the docs show).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from stack.helpers import wait_for

from .night import GATES_NOTE, PASSWORD, PIPELINES, USER

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SERVER_BOUND_SECONDS = 300  # "cannot hang" bound for the api-server to answer on a loaded machine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def api_server(fleet, tmp_path_factory) -> Iterator[str]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**fleet.env, "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__API__BASE_URL": base, "AIRFLOW__API__WORKERS": "1"}
    log_path = tmp_path_factory.mktemp("api-server") / "api-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(Path(sys.executable).with_name("airflow")), "api-server", "--port", str(port)],
                                   env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def up() -> bool:
                assert process.poll() is None, log_path.read_text()[-3000:]
                try:
                    return requests.get(f"{base}/api/v2/version", timeout=5).ok
                except requests.RequestException:
                    return False

            wait_for("airflow api-server", up, timeout=SERVER_BOUND_SECONDS, interval=1)
            yield base
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def browser(api_server: str) -> Iterator[object]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("Debian's chromium and chromium-driver are needed: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000"):
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="fleet-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        token = requests.post(f"{api_server}/auth/token", json={"username": USER, "password": PASSWORD},
                              timeout=60).json()["access_token"]
        # The UI's session: Airflow's JWT cookie on the api-server's origin, as its login page leaves it.
        driver.get(f"{api_server}/api/v2/version")
        driver.add_cookie({"name": "_token", "value": token, "path": "/"})
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _shot(driver, name: str) -> None:
    folder = os.environ.get("TRAINPIPE_FLEET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))


def _rows(driver) -> dict[str, dict[str, str]]:
    """The night's pipelines as the page lists them, in its order. The session's Airflow DB also holds the
    pipelines other test modules ran (``make test`` runs them first): the page rightly lists those too."""
    from selenium.webdriver.common.by import By

    out = {}
    for row in driver.find_elements(By.CSS_SELECTOR, "#pipelines tr[data-pipeline]"):
        if row.get_attribute("data-pipeline") not in PIPELINES:
            continue
        out[row.get_attribute("data-pipeline")] = {
            "outcome": row.get_attribute("data-outcome"),
            "reason": row.find_element(By.CSS_SELECTOR, ".reason").text}
    return out


def test_the_page_lists_every_pipeline_with_its_reason(browser, api_server: str) -> None:
    browser.get(f"{api_server}/trainpipe/")
    rows = _rows(browser)
    assert list(rows)[:4] == ["ltv_crash", "churn_drift", "ranker_gates", "fraud_approval"]  # needs attention first
    assert rows["churn_drift"]["reason"] == "validation failed: drift in amount (PSI 6.84, KS 0.71)"
    assert rows["ranker_gates"]["reason"] == GATES_NOTE
    assert rows["fraud_approval"]["reason"] == "awaiting approval for 3 h"
    assert rows["fraud_nightly"]["outcome"] == "promoted"
    _shot(browser, "fleet-list.png")


def test_filter_by_team(browser, api_server: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(f"{api_server}/trainpipe/")
    Select(browser.find_element(By.NAME, "team")).select_by_value("risk")
    wait_for("the team filter", lambda: "team=risk" in browser.current_url, timeout=60, interval=0.2)
    assert sorted(_rows(browser)) == ["fraud_approval", "fraud_nightly"]


def test_the_page_inside_airflows_ui(browser, api_server: str) -> None:
    """The nav entry: Airflow's UI shows the page in its frame, under its own menu."""
    from selenium.webdriver.common.by import By

    browser.get(f"{api_server}/plugin/training-pipelines")
    frame = wait_for("the plugin's frame", lambda: browser.find_elements(By.TAG_NAME, "iframe"), timeout=120,
                     interval=0.5)[0]
    browser.switch_to.frame(frame)
    try:
        wait_for("the fleet table in the frame", lambda: sorted(_rows(browser)) == sorted(PIPELINES), timeout=120,
                 interval=0.5)
    finally:
        browser.switch_to.default_content()
    _shot(browser, "fleet-in-airflow.png")


def test_pipeline_page_history_and_drift(browser, api_server: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{api_server}/trainpipe/pipelines/fraud_nightly")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.metric-history")
    assert len(charts) == 2  # auc and f1
    assert [len(c.find_elements(By.TAG_NAME, "circle")) for c in charts] == [6, 6]  # six versions each
    assert len(browser.find_elements(By.CSS_SELECTOR, "#promotion-log tr")) == 1 + 6
    _shot(browser, "fleet-pipeline.png")
    browser.get(f"{api_server}/trainpipe/pipelines/churn_drift")
    heat = browser.find_element(By.ID, "drift-heatmap")
    rows = heat.find_elements(By.TAG_NAME, "tr")[1:]
    assert "6.840" in rows[0].text and "fail" in rows[0].text  # last night's, newest first
    assert len(rows) == 4  # and the three versions' validations before it
    _shot(browser, "fleet-drift.png")


def test_approve_from_the_pipeline_page_answers_airflow(browser, api_server: str, fleet) -> None:
    """The buttons call Airflow's HITL endpoint with the browser's Airflow session: Airflow records the answer
    and who gave it (the promotion that follows is Airflow's and trainpipe's, tests/stack/test_stack_approval.py)."""
    from selenium.webdriver.common.by import By

    browser.get(f"{api_server}/trainpipe/pipelines/fraud_approval")
    _shot(browser, "fleet-approval.png")
    browser.find_element(By.CSS_SELECTOR, "#approval button.approve").click()
    wait_for("Airflow's answer", lambda: "sent to Airflow" in browser.find_element(By.ID, "approval-result").text
             or "refused" in browser.find_element(By.ID, "approval-result").text, timeout=60, interval=0.2)
    assert "sent to Airflow" in browser.find_element(By.ID, "approval-result").text
    run_id = fleet.night.runs["fraud_approval"]
    detail = requests.get(f"{api_server}/api/v2/dags/fraud_approval/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails",
                          headers={"Authorization": f"Bearer {fleet.token()}"}, timeout=60).json()
    assert detail["chosen_options"] == ["Approve"]
    assert detail["responded_by_user"]["name"] == USER
