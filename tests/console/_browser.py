"""A real headless Chromium (Debian's, through its chromedriver) for the console's tests."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests._tiers import needs

#: Markup for label values and annotations: shown as text, it never runs.
XSS = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'

FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
)


def _binaries() -> tuple[str, str] | None:
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    browser = shutil.which("chromium") or "/usr/bin/chromium"
    if os.path.exists(driver) and os.path.exists(browser):
        return browser, driver
    return None


@needs("chromium")
@contextmanager
def chromium() -> Iterator[Any]:
    """A fresh headless Chromium with its console log kept; skipped (failed in CI) without one."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    found = _binaries()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are needed (apt-get install chromium-driver)")
        pytest.skip("needs chromium and chromium-driver (apt-get install chromium-driver)")
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="aivitals-chromium-")
    opts = webdriver.ChromeOptions()
    for f in FLAGS:
        opts.add_argument(f)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = browser
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(fn: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as exc:  # a page still rendering: try again
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")


def problems(driver: Any) -> list[str]:
    """Console errors and warnings since the last call, and requests that failed."""
    out = [
        f"console {e['level']}: {e['message']}"
        for e in driver.get_log("browser")
        if e["level"] in ("SEVERE", "WARNING")
    ]
    failed = driver.execute_script(
        "return performance.getEntriesByType('resource')"
        ".filter(e => e.responseStatus >= 400).map(e => e.name + ' ' + e.responseStatus)"
    )
    out += [f"failed request: {f}" for f in failed]
    return out


def open_page(driver: Any, url: str, page: str) -> None:
    """``url``'s console at ``#/page``, once the console has its meta.

    The browser is shared between tests: the previous test's page keeps polling a
    server that has since stopped, so its errors are left behind on a blank page
    and drained, and ``problems`` then speaks of this page only."""
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get(f"{url.rstrip('/')}/#/{page}")
    wait_until(
        lambda: driver.execute_script(
            "return !!(window.__aivitals && window.__aivitals.state.meta)"
        ),
        20,
        f"{page}: the console's meta",
    )


def shot(driver: Any, name: str, height: int = 1000) -> None:
    """A screenshot to ``$AIVITALS_CONSOLE_SHOTS/name.png`` when that is set."""
    folder = os.environ.get("AIVITALS_CONSOLE_SHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1400, height)
    time.sleep(0.8)  # the charts follow the new width on their next frame
    driver.save_screenshot(str(Path(folder) / f"{name}.png"))
    driver.set_window_size(1400, 1000)
