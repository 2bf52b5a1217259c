"""The MLflow UI as a user opens it after a search: headless Chromium through Selenium.

Needs the `selenium` package (the `test` extra) and Chromium with its driver (Debian: `apt-get
install chromium chromium-driver`, which .ci/run does); without them the test is skipped and says
which is missing.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
DRIVER = shutil.which("chromedriver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NO_BROWSER = "needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)"


@pytest.mark.skipif(BROWSER is None or DRIVER is None, reason=NO_BROWSER)
@pytest.mark.xdist_group("finished_search")
def test_the_mlflow_ui_opens_on_the_runs_with_the_plans_metrics_and_its_trials(
    finished_search: tuple[Path, Any],
) -> None:
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[test]')")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    from pipeline.records import mlflow_ui as ui

    tmp_path, r = finished_search  # conftest's FINISHED_SEARCH: 12 trials on tiny_hetero
    assert r.returncode == 0, r.stderr
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    (run_dir,) = [p.parent for p in (tmp_path / "out").glob("*/*/plan.json")]
    plan = json.loads((run_dir / "plan.json").read_text())
    port = free_port()
    server = ui.start(uri, port)
    opts = Options()
    opts.binary_location = BROWSER
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1800,1000"):
        opts.add_argument(arg)
    browser = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        (url,) = [u for name, u in ui.experiment_urls(uri, port).items() if name == "archipelago"]
        browser.get(url)
        wait = WebDriverWait(browser, 60)
        # the runs table, not the GenAI overview, with the saved view's metric columns and the parent's values
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[@role='row']//a[contains(., 'tiny_hetero')]")))
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "best_rate_req_s" in body and "usd_per_m_output_tokens" in body and "layout_id" in body
        assert "Archipelago searches" in body  # the experiment's description
        assert f"{plan['rates']['rate_req_s']:.4f}"[:6] in body  # the plan's rate, in the parent's row
        # the parent expands to its trials
        expand = browser.find_element(
            By.XPATH, "//*[@role='row'][.//a[contains(., 'tiny_hetero')]]//button[contains(@data-component-id, "
            "'runnamecellrenderer')]"
        )  # fmt: skip
        expand.click()
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[@role='row']//a[contains(., 'trial-0000')]")))
        trials = browser.find_elements(By.XPATH, "//*[@role='row']//a[starts-with(normalize-space(.), 'trial-')]")
        assert len(trials) == 12
    finally:
        browser.quit()
        ui.stop(server)


def test_the_ui_stopped_by_sigterm_leaves_nothing_on_its_port(tmp_path: Path) -> None:
    """`python -m pipeline.ui` under a process manager ends with SIGTERM: the MLflow server and every worker it
    started end with it, and the port is free again."""
    import signal
    import time

    from pipeline.records.tracking import Tracker

    Tracker(f"sqlite:///{tmp_path}/mlflow.db", "archipelago")  # a store to show
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.ui", "--port", str(port), "--uri",
                             f"sqlite:///{tmp_path}/mlflow.db"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith(f"[ui] MLflow UI at http://127.0.0.1:{port}"), (line, proc.stderr.read() if proc.stderr
                                                                          else "")  # fmt: skip
    served = [int(p) for p in subprocess.run(["pgrep", "-f", f"mlflow.* {port}"], capture_output=True,
                                               text=True).stdout.split()]  # fmt: skip
    assert served  # the server (and its workers) run
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    deadline = time.time() + 15
    while time.time() < deadline and subprocess.run(["pgrep", "-f", f"mlflow.* {port}"], capture_output=True).stdout:
        time.sleep(0.2)
    assert not subprocess.run(["pgrep", "-f", f"mlflow.* {port}"], capture_output=True, text=True).stdout
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))  # nothing listens there any more
