"""Read a Snakemake HTML report the way a person does: in a real (headless) Chromium, by clicking.

Snakemake 9's report (`snakemake --report report.html`) is one HTML file holding a small React app
and every result as a base64 data URI. Nothing of it is visible before its JavaScript has run, so a
text search of the file proves little; this module opens it in Chromium through Selenium and
chromedriver and walks it as a reader would:

1. the menu on the left lists the result categories under "Results" (a single category shows as one
   "Results" entry instead);
2. a click on a category shows its subcategories, or straight away its list of results when it has
   only one; each result is a table row (its labels, or its path when it has none) with an eye icon
   and an (i) icon;
3. the eye shows the result on the right: an <img> for PNG/JPEG/SVG, an <iframe> for HTML and PDF;
   any other type (csv, md, tex) is only offered as a download;
4. the (i) icon shows the result's path (the last breadcrumb), its caption under "Description", its
   size, and the rule that made it.

`read_report` returns every result it reached that way, with what the viewer showed and the caption
text; `check_report` / `assert_report_complete` compare that with the files a study wrote.

Needs Debian's `chromium` and `chromium-driver` (`apt-get install -y --no-install-recommends chromium
chromium-driver`) and `selenium` from PyPI; FEDFACTOR_CHROMIUM and FEDFACTOR_CHROMEDRIVER name other
binaries. Selenium is pointed at both binaries, so it never tries to download a driver.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = ("apt-get install -y --no-install-recommends chromium chromium-driver "
                "(Debian) and pip install selenium")
WAIT_S = 15.0  # the longest any one step of the app may take to show its result

# The parts of the app's DOM this module relies on (Snakemake 9.x, html_reporter/template/components).
_PANEL = "#app nav > div > div.p-3"  # the navbar's content: menu, category list, result table, info
_CRUMBS = "#app nav nav ol > li"  # breadcrumbs; the first holds the "home" link
# the list of results (a table, in a div when it has toggles); not the labels table of an (i) panel
_ROWS = f"{_PANEL} > table > tbody > tr, {_PANEL} > div > table > tbody > tr"
_HEADS = f"{_PANEL} > table > thead th, {_PANEL} > div > table > thead th"


class BrowserUnavailable(RuntimeError):
    """Chromium, chromedriver or selenium is missing, or the browser would not start."""


@dataclass
class ReportItem:
    """One result as the report shows it."""

    category: str
    subcategory: str | None  # None when the category has only one (the app then skips that level)
    path: str  # as Snakemake recorded it: the output path of the rule, relative to its working directory
    cells: dict[str, str]  # the result's row in the list: column heading -> text ("File" -> path without labels)
    view: str  # what the eye icon does: "img", "html", "pdf" (shown on the right) or "download"
    mime: str  # from the data URI
    filename: str  # from the data URI
    data: bytes  # the embedded file, decoded
    rendered: bool  # the image decoded (natural width > 0) / the frame's document has a body with text
    text: str = ""  # the frame's visible text (html); empty for images and downloads
    caption: str = ""  # the text under "Description" in the (i) panel; empty when there is none
    caption_html: str = ""

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass
class Report:
    """What a reader finds in a report: the front page's description and every result."""

    description: str
    items: list[ReportItem] = field(default_factory=list)
    seconds: float = 0.0  # time spent in the browser

    def by_category(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for item in self.items:
            out.setdefault(item.category, []).append(item.name)
        return out


# -- the browser ----------------------------------------------------------------------------------


def _binary(env: str, *names: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def start_browser(width: int = 1600, height: int = 1000):
    """A headless Chromium under chromedriver; raises BrowserUnavailable with the reason and the fix."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise BrowserUnavailable(f"selenium is not installed ({e}); {INSTALL_HINT}") from None
    chromium = _binary("FEDFACTOR_CHROMIUM", "chromium", "chromium-browser", "google-chrome")
    driver = _binary("FEDFACTOR_CHROMEDRIVER", "chromedriver")
    missing = [name for name, b in (("chromium", chromium), ("chromedriver", driver))
               if not b or not os.access(b, os.X_OK)]
    if missing:  # checked here: given a driver it cannot run, Selenium would try to download one
        raise BrowserUnavailable(f"no runnable {' or '.join(missing)} (PATH, FEDFACTOR_CHROMIUM, "
                                 f"FEDFACTOR_CHROMEDRIVER); {INSTALL_HINT}")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-extensions", f"--window-size={width},{height}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "SEVERE"})  # the app's JavaScript errors
    try:
        browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    except WebDriverException as e:
        raise BrowserUnavailable(f"{chromium} did not start under {driver}: {e.msg or e}; {INSTALL_HINT}") from None
    browser.set_page_load_timeout(60)
    return browser


# -- reading a report -----------------------------------------------------------------------------


def _wait(browser, condition, what: str, timeout: float = WAIT_S):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.05,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda b: condition())
    except TimeoutException:
        raise AssertionError(f"the report did not show {what} within {timeout:g} s") from None


def _css(browser, selector: str):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector)


# One script call per question (Selenium's get_attribute ships a large script each time: slow).
_JS_TEXTS = ("return [...document.querySelectorAll(arguments[0])]"
             "  .map(el => [(el.textContent || '').trim().replace(/\\s+/g, ' '), el]);")


_JS_CLICKABLE = """
const el = arguments[0];
el.scrollIntoView({block: 'nearest'});
if (document.getAnimations().some(a => a.playState === 'running')) return false;  // the navbar resizing
const r = el.getBoundingClientRect();
const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
return r.width > 0 && top !== null && (top === el || el.contains(top));
"""


def _click(browser, element, what: str) -> None:
    """Click like a person: once nothing moves any more (the navbar animates its width) and nothing
    covers the element."""
    _wait(browser, lambda: browser.execute_script(_JS_CLICKABLE, element), f"{what} clickable")
    element.click()


def _texts(browser, selector: str) -> list[tuple[str, object]]:
    """(text as written: textContent, whitespace collapsed; element) of every match of `selector`."""
    return [(t, el) for t, el in browser.execute_script(_JS_TEXTS, selector)]


def _links(browser) -> list[tuple[str, object]]:
    """The menu-like links of the navbar panel (menu items, subcategories), with their text."""
    return _texts(browser, f"{_PANEL} > ul > li > a")


def _click_link(browser, label: str) -> None:
    links = _links(browser)
    for text, a in links:
        if text == label:
            _click(browser, a, f"menu entry {label!r}")
            return
    raise AssertionError(f"the report's menu has no entry {label!r}; it shows {[t for t, _ in links]}")


def _crumbs(browser) -> list[str]:
    return [t for t, _ in _texts(browser, _CRUMBS) if t]


def _in_menu(browser) -> bool:
    return "Workflow" in [t for t, _ in _links(browser)]


def _home(browser) -> None:
    """Back to the main menu with the breadcrumbs' home icon."""
    _click(browser, _css(browser, f"{_CRUMBS}:first-child a")[0], "the home breadcrumb")
    _wait(browser, lambda: _in_menu(browser), "the main menu")


def _categories(browser) -> list[str]:
    """The category entries of the main menu: those under the "Results" heading, or the one "Results"
    entry of a report with a single category."""
    entries = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(li => [!!li.querySelector('a'),"
        "  (li.textContent || '').trim().replace(/\\s+/g, ' ')]);", f"{_PANEL} > ul > li")
    names, after_heading = [], False
    for is_link, label in entries:
        if not is_link:  # a heading: "General", "Results"
            after_heading = label.lower() == "results"
        elif after_heading or label == "Results":
            names.append(label)
    return names


def _n_rows(browser) -> int:
    return browser.execute_script("return document.querySelectorAll(arguments[0]).length;", _ROWS)


def _listing_shown(browser) -> bool:
    return _n_rows(browser) > 0 or (bool(_links(browser)) and not _in_menu(browser))


def _open(browser, category_link: str, subcategory: str | None) -> None:
    """From anywhere: home, the category, the subcategory: the list of results is shown."""
    _home(browser)
    _click_link(browser, category_link)
    _wait(browser, lambda: _listing_shown(browser), f"category {category_link!r}")
    if subcategory is not None:
        _click_link(browser, subcategory)
        _wait(browser, lambda: _n_rows(browser) > 0, f"subcategory {subcategory!r}")


def _back_to_list(browser) -> None:
    """From a result's (i) panel back to its list, by the breadcrumb before the result's path (its
    subcategory, or its category when that has only one)."""
    crumbs = [(t, li) for t, li in _texts(browser, _CRUMBS) if t]
    _click(browser, crumbs[-2][1].find_element("css selector", "a"), f"breadcrumb {crumbs[-2][0]!r}")
    _wait(browser, lambda: _n_rows(browser) > 0, f"the list of results of {crumbs[-2][0]!r}")


def _row(browser, i: int) -> tuple[list[str], object, object]:
    """Row i of the result list: (its cells' texts, its eye link, its (i) link)."""
    cells, eye, info = browser.execute_script(
        "const tr = document.querySelectorAll(arguments[0])[arguments[1]];"
        "const tds = [...tr.querySelectorAll(':scope > td')];"
        "const links = tds[tds.length - 1].querySelectorAll('a');"
        "return [tds.slice(0, -1).map(td => td.textContent.trim().replace(/\\s+/g, ' ')),"
        "        links[0], links[links.length - 1]];", _ROWS, i)
    return cells, eye, info


def _header(browser) -> list[str]:
    return [t for t, _ in _texts(browser, _HEADS)][:-1]  # the last: the icons' column


def parse_data_uri(uri: str) -> tuple[str, str, bytes]:
    """(mime type, filename, content) of a Snakemake data URI:
    data:<mime>;charset=<enc>;filename=<name>;base64,<data>."""
    head, _, payload = uri.partition(",")
    if not head.startswith("data:") or not head.endswith(";base64"):
        raise AssertionError(f"not a base64 data URI: {uri[:80]!r}")
    parts = head[len("data:"):-len(";base64")].split(";")
    params = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return parts[0], urllib.parse.unquote(params.get("filename", "")), base64.b64decode(payload)


_JS_SHOWN = """
const nav = document.querySelector('#app nav');
const el = [...document.querySelectorAll('#app img, #app iframe')]
  .find(e => !nav.contains(e) && (e.getAttribute('src') || '').startsWith('data:'));
if (!el || el.getAttribute('src') === arguments[0]) return null;
return [el, el.tagName.toLowerCase(), el.getAttribute('src'), el.tagName !== 'IMG' || el.complete];
"""


def _view(browser, eye, shown_before: str | None) -> tuple[str, str, bool, str]:
    """Click a result's eye icon; (view, data URI, rendered, text). The result is shown on the right:
    an <img> or an <iframe> outside the navbar."""
    download, href = browser.execute_script(
        "return [arguments[0].hasAttribute('download'), arguments[0].getAttribute('href')];", eye)
    if download:  # csv, md, ...: a download link, nothing to see in place
        return "download", href, True, ""
    _click(browser, eye, "the eye icon")
    el, tag, src, _ = _wait(browser, lambda: (lambda r: r if r and r[3] else None)(
        browser.execute_script(_JS_SHOWN, shown_before)), "the result after a click on its eye icon")
    if tag == "img":
        return "img", src, bool(browser.execute_script("return arguments[0].naturalWidth > 0;", el)), ""
    view = "pdf" if src.startswith("data:application/pdf") else "html"
    if view == "pdf":  # headless Chromium has no PDF viewer to look into
        return view, src, True, ""
    browser.switch_to.frame(el)
    try:
        text = _wait(browser, lambda: browser.execute_script(
            "return document.readyState === 'complete' && document.body ? document.body.innerText : null;"),
            "the HTML result's document in its frame")
    finally:
        browser.switch_to.default_content()
    return view, src, bool(text.strip()), " ".join(text.split())


def _info(browser, info_link) -> tuple[str, str, str]:
    """Click a result's (i) icon; (path from the last breadcrumb, caption text, caption HTML)."""
    _click(browser, info_link, "the (i) icon")
    _wait(browser, lambda: "Size" in [t for t, _ in _texts(browser, f"{_PANEL} > ul > li")],
          "the result's (i) panel")
    caption_text, caption_html = browser.execute_script(
        "const lis = [...document.querySelectorAll(arguments[0])];"
        "const i = lis.findIndex(li => li.textContent.trim() === 'Description');"
        "return i < 0 || !lis[i + 1] ? ['', ''] : [lis[i + 1].innerText, lis[i + 1].innerHTML];",
        f"{_PANEL} > ul > li")
    return _crumbs(browser)[-1], " ".join(caption_text.split()), caption_html


def read_report(html_path: str | Path, browser=None) -> Report:
    """Open the report, wait for the app, and visit every result of every (sub)category by clicking."""
    html_path = Path(html_path).resolve()
    if not html_path.is_file():
        raise FileNotFoundError(html_path)
    own = browser is None
    browser = browser or start_browser()
    t0 = time.perf_counter()
    try:
        browser.get(html_path.as_uri())
        _wait(browser, lambda: _in_menu(browser), "its menu (the app did not start)")
        errors = _console_errors(browser)
        if errors:
            raise AssertionError("the report's JavaScript failed: " + "; ".join(errors))
        _click_link(browser, "Workflow")
        description = _wait(browser, lambda: browser.execute_script(
            "const n = document.querySelector('#app nav');"
            "const d = [...document.querySelectorAll('#app .prose')].find(el => !n.contains(el));"
            "return d ? d.innerText : null;"), "the workflow description")
        report = Report(description=" ".join(description.split()))
        for category_link in _categories(browser):
            _open(browser, category_link, None)
            category = category_link
            if category_link == "Results":  # the report's only category; its crumb names it ("Results": "Other")
                category = {"Results": "Other"}.get(_crumbs(browser)[-1], _crumbs(browser)[-1])
            subcategories = [None] if _n_rows(browser) else [t for t, _ in _links(browser)]
            for sub in subcategories:
                _open(browser, category_link, sub)
                header, n, shown = _header(browser), _n_rows(browser), None
                for i in range(n):
                    if i:  # the (i) panel of the previous result replaced the list
                        _back_to_list(browser)
                    texts, eye, _ = _row(browser, i)
                    view, uri, rendered, text = _view(browser, eye, shown)
                    shown = uri if view != "download" else shown
                    mime, filename, data = parse_data_uri(uri)
                    # the list stays while the result is shown on the right; its row is drawn anew
                    path, caption, caption_html = _info(browser, _row(browser, i)[2])
                    report.items.append(ReportItem(
                        category=category, subcategory=sub, path=path, cells=dict(zip(header, texts)), view=view,
                        mime=mime, filename=filename, data=data, rendered=rendered, text=text, caption=caption,
                        caption_html=caption_html))
        errors = _console_errors(browser)
        if errors:
            raise AssertionError("the report's JavaScript failed while it was read: " + "; ".join(errors))
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        if own:
            browser.quit()


def _console_errors(browser) -> list[str]:
    try:
        logs = browser.get_log("browser")
    except Exception:  # not every driver keeps a console log
        return []
    return [entry["message"] for entry in logs if entry.get("level") == "SEVERE"
            and "favicon" not in entry.get("message", "")]


def report_items(html_path: str | Path, browser=None) -> dict[str, list[str]]:
    """Category -> the file names of the results a reader finds there."""
    return read_report(html_path, browser).by_category()


# -- comparing with the files on disk -------------------------------------------------------------


VIEWS = {".png": "img", ".jpg": "img", ".jpeg": "img", ".svg": "img", ".html": "html", ".htm": "html",
         ".pdf": "pdf"}


def check_report(report: Report, expected_files: Iterable[str | Path], *, root: str | Path = ".",
                 categories: Mapping[Path, str] | None = None,
                 captions: Mapping[Path, Iterable[str]] | None = None, exact: bool = True) -> list[str]:
    """Every problem found, as sentences (none: the report is complete).

    Each expected file must be listed once, be viewable in place (.png etc. as an image, .html in a
    frame with visible text), embed exactly the bytes on disk, and have a caption; with `categories`
    in the given category, with `captions` holding each given snippet. `root` is the directory the
    report's paths are relative to (Snakemake's working directory). With `exact`, results that are
    not expected are problems too.
    """
    root = Path(root)
    expected = [Path(f).resolve() for f in expected_files]
    found: dict[Path, list[ReportItem]] = {}
    for item in report.items:
        found.setdefault((root / item.path).resolve(), []).append(item)
    problems = []
    for f in expected:
        items = found.get(f, [])
        where = f"{f.name} ({f})"
        if not items:
            problems.append(f"{where} is missing from the report")
            continue
        if len(items) > 1:
            problems.append(f"{where} is listed {len(items)} times")
        item = items[0]
        want_view = VIEWS.get(f.suffix.lower(), "download")
        if item.view != want_view:
            problems.append(f"{where} is offered as {item.view!r}, not shown as {want_view!r}")
        if not item.rendered:
            problems.append(f"{where} does not render (an empty frame or an image that does not decode)")
        if f.is_file() and item.data != f.read_bytes():
            problems.append(f"{where}: the report embeds other content than the file on disk "
                            f"({len(item.data)} vs {f.stat().st_size} bytes): a stale report?")
        if not item.caption:
            problems.append(f"{where} has no caption")
        elif "System Message" in item.caption:  # docutils' inline report of a reStructuredText error
            problems.append(f"{where}: its caption does not render cleanly: {item.caption[:300]!r}")
        for snippet in (captions or {}).get(f, ()):
            if _norm(snippet) not in _norm(item.caption):
                problems.append(f"{where}: its caption lacks {snippet!r}; it reads {item.caption[:200]!r}")
        want_category = (categories or {}).get(f)
        if want_category is not None and item.category != want_category:
            problems.append(f"{where} is in category {item.category!r}, not {want_category!r}")
    if exact:
        for path, items in found.items():
            if path not in expected:
                problems.append(f"{items[0].path} is in the report (category {items[0].category!r}) but not expected")
    return problems


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


def assert_report_complete(html_path: str | Path | Report, expected_files: Iterable[str | Path], **kw) -> Report:
    """Open the report (or take one read before) and fail with every problem `check_report` finds."""
    report = html_path if isinstance(html_path, Report) else read_report(html_path)
    problems = check_report(report, expected_files, **kw)
    if problems:
        listing = "\n".join(f"  {c}: {', '.join(names)}" for c, names in report.by_category().items()) or "  (none)"
        raise AssertionError("the report is incomplete:\n- " + "\n- ".join(problems)
                             + f"\nit lists:\n{listing}")
    return report


def caption_lead(rst: str) -> str:
    """The bold lead phrase (**...**) a caption file opens with: the words every rendering of it shows."""
    m = re.search(r"\*\*(.+?)\*\*", re.sub(r"\{#.*?#\}", "", rst, flags=re.S))
    if not m:
        raise ValueError("the caption has no **bold** lead phrase")
    return m.group(1)
