#!/usr/bin/env python3
"""The browser half of scripts/dashboard-e2e.sh: drives headless Chromium through chromedriver's
WebDriver HTTP API (Python's standard library only) and checks the dashboard as a user would.
Every wait is bounded; any failed check raises and exits non-zero."""

import argparse
import base64
import json
import os
import subprocess
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def http(method, url, body=None, headers=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}


class Browser:
    def __init__(self, driver, profile):
        self.driver = driver
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": "/usr/bin/chromium",
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1300,1000",
                            f"--user-data-dir={profile}",
                        ],
                    },
                    "goog:loggingPrefs": {"browser": "ALL"},
                }
            }
        }
        status, body, _ = http("POST", f"{driver}/session", caps, timeout=60)
        if status != 200:
            raise SystemExit(f"chromedriver refused a session: {status} {body}")
        self.session = json.loads(body)["value"]["sessionId"]

    def call(self, method, path, body=None):
        status, text, _ = http(method, f"{self.driver}/session/{self.session}{path}", body)
        value = json.loads(text)["value"] if text else None
        if status != 200:
            raise AssertionError(f"WebDriver {method} {path}: {status} {value}")
        return value

    def go(self, url):
        self.call("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.call("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def type(self, css, text):
        element = self.find(css)
        self.call("POST", f"/element/{element}/clear", {})
        self.call("POST", f"/element/{element}/value", {"text": text})

    def select(self, css, value):
        # A <select>: set the value as a user's choice would, with its change event.
        self.js(
            "const s = document.querySelector(arguments[0]); s.value = arguments[1];"
            "s.dispatchEvent(new Event('input')); s.dispatchEvent(new Event('change'));"
            "return s.value;",
            css,
            value,
        )

    def click(self, css):
        self.call("POST", f"/element/{self.find(css)}/click", {})

    def text(self, css):
        return self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;", css
        )

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("GET", "/screenshot")))

    def console(self):
        for path in ("/se/log", "/log"):
            try:
                return self.call("POST", path, {"type": "browser"})
            except AssertionError:
                continue
        raise AssertionError("chromedriver gives no browser log")

    def quit(self):
        try:
            http("DELETE", f"{self.driver}/session/{self.session}", timeout=10)
        except OSError:
            pass


def wait(what, check, timeout=10.0, step=0.1):
    """Polls `check` until it returns something true; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError as e:
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def main():
    ap = argparse.ArgumentParser()
    for name in ("dashboard", "token-file", "driver", "profile", "shots", "fqdnd",
                 "admin-socket", "dns", "dns-port"):
        ap.add_argument(f"--{name}", required=True)
    a = ap.parse_args()
    token = open(a.token_file).read().strip()
    base = a.dashboard

    def cli(*args):
        out = subprocess.run([a.fqdnd, *args, "--admin-socket", a.admin_socket],
                             capture_output=True, text=True, timeout=30)
        if out.returncode not in (0, 1):
            raise AssertionError(f"fqdnd {' '.join(args)}: {out.returncode} {out.stderr}")
        return json.loads(out.stdout)

    def dig(name):
        subprocess.run(["dig", "+tries=1", "+time=2", "-p", a.dns_port, f"@{a.dns}", name, "A"],
                       capture_output=True, timeout=10)

    # 1. The token: the API refuses a request without it (or with another), the pages do not
    #    need it, and nothing but GET is served.
    auth = {"Authorization": f"Bearer {token}"}
    assert http("GET", f"{base}/api/status")[0] == 401, "no token: refused"
    assert http("GET", f"{base}/api/status", headers={"Authorization": "Bearer nope"})[0] == 401
    code, body, headers = http("GET", f"{base}/api/status", headers=auth)
    assert code == 200, (code, body)
    assert "default-src 'self'" in headers.get("content-security-policy", ""), headers
    assert not any(h.lower().startswith("access-control") for h in headers), headers
    assert http("POST", f"{base}/api/status", body={}, headers=auth)[0] == 405
    print("token: refused without it, served with it; POST: 405")

    browser = Browser(a.driver, a.profile)
    errors = []

    def console_errors(page):
        for entry in browser.console():
            if entry.get("level") == "SEVERE":
                errors.append(f"{page}: {entry.get('message')}")

    try:
        # 2. Opening the dashboard asks for the token; with it, the Overview shows.
        browser.go(base + "/#overview")
        wait("the token form", lambda: browser.js("return !document.getElementById('token-form').hidden"))
        browser.type("#token-input", token)
        browser.click("#token-go")
        wait("the Overview", lambda: browser.js("return !document.getElementById('page-overview').hidden"))

        # The figures match `fqdnd status --json` (no traffic meanwhile: they are still).
        status = cli("status", "--json")
        total = sum(n for _, n in status["queries"])
        want = {
            "#ov-queries-total": str(total),
            "#ov-identities": str(status["identities"]),
            "#ov-cache-names": str(status["cache_names"]),
            "#ov-cache-entries": str(status["cache_entries"]),
        }
        for css, value in want.items():
            wait(f"{css} = {value}", lambda css=css, value=value: browser.text(css) == value)
        c = status["answer_cache"]
        assert c and c["hits"] > 0, c
        rate = f"{100 * c['hits'] / (c['hits'] + c['misses']):.1f} %"
        wait(f"hit rate {rate}", lambda: browser.text("#ov-hit-rate") == rate)
        want["#ov-hit-rate"] = rate
        answered = dict(status["queries"]).get("answered", 0)
        assert total > 0 and answered > 0, status["queries"]
        # The hour's graph has the answered queries in its legend; hold percentiles are shown.
        wait("the graph's legend", lambda: "answered" in (browser.text("#ov-legend") or ""))
        wait("hold p50", lambda: browser.text("#ov-p50") not in ("–", None))
        time.sleep(0.5)  # the canvas is drawn with the legend; let it paint for the picture
        browser.screenshot(os.path.join(a.shots, "overview.png"))
        console_errors("overview")
        print(f"overview: {want} match `fqdnd status --json`; p50 {browser.text('#ov-p50')}, "
              f"p99 {browser.text('#ov-p99')}")

        # 3. Queries: the backlog, then a new query within 2 s, and markup shown as text.
        browser.go(base + "/#queries")
        wait("the tail's backlog", lambda: browser.js("return document.querySelectorAll('#q-rows tr').length") > 0)
        fresh = f"tail-{int(time.time() * 1000)}.example.test"
        sent = time.monotonic()
        dig(fresh)
        wait(f"{fresh} in the tail",
             lambda: browser.js("return [...document.querySelectorAll('#q-rows td.name')].some(t => t.textContent.startsWith(arguments[0]))", fresh),
             timeout=2.0, step=0.05)
        shown_after = time.monotonic() - sent
        group = browser.js("return [...document.querySelectorAll('#q-rows tr')].find(r => r.dataset.name.startsWith(arguments[0])).cells[1].textContent", fresh)
        assert group == "office", f"the client group of {fresh}: {group!r}"
        print(f"queries: {fresh} (client group {group}) shown {shown_after:.2f} s after dig sent it (at most 2 s)")
        for name in ("<script>.example.test", "<b>e2e</b>.example.test", "<img src=x onerror=alert(1)>.example.test"):
            dig(name)
        names = wait("the markup names in the tail", lambda: (lambda t: t if sum(1 for n in t if "<" in n) >= 3 else None)(
            browser.js("return [...document.querySelectorAll('#q-rows td.name')].map(t => t.textContent)")))
        shown = [n for n in names if "<" in n]
        assert any(n.startswith("<script>.example.test") for n in shown), shown
        assert any(n.startswith("<b>e2e</b>.example.test") for n in shown), shown
        markup = browser.js("return {scripts: document.scripts.length, b: document.querySelectorAll('#q-rows b').length,"
                            " img: document.querySelectorAll('img').length}")
        assert markup == {"scripts": 1, "b": 0, "img": 0}, markup
        print(f"queries: markup shown as text: {shown}")
        # The verdict filter keeps only the denied ones.
        browser.select("#q-verdict", "denied")
        visible = browser.js("return [...document.querySelectorAll('#q-rows tr')].filter(r => !r.hidden).map(r => r.dataset.result)")
        assert visible and set(visible) == {"denied"}, visible
        browser.select("#q-verdict", "")
        browser.type("#q-name", "tail-")
        browser.js("document.getElementById('q-name').dispatchEvent(new Event('input'))")
        visible = browser.js("return [...document.querySelectorAll('#q-rows tr')].filter(r => !r.hidden).map(r => r.dataset.name)")
        assert visible == [fresh + "."] or visible == [fresh], visible
        browser.type("#q-name", "")
        browser.js("document.getElementById('q-name').dispatchEvent(new Event('input'))")
        browser.screenshot(os.path.join(a.shots, "queries.png"))
        console_errors("queries")

        # 4. Names and addresses: the same as `fqdnd cache list --json`.
        browser.go(base + "/#names")
        cache = cli("cache", "list", "--json")
        want_names = sorted((r["fqdn"], ", ".join(r["ips"])) for r in cache)
        assert want_names, "the cache has names"

        def names_rows():
            rows = browser.js("return [...document.querySelectorAll('#names-rows tr')].map(r => [r.cells[2].textContent, r.cells[5].textContent])")
            return sorted(tuple(r) for r in rows) == want_names
        wait("the cache listing", names_rows)
        idents = sorted((str(r["identity"]), ", ".join(r["labels"])) for r in cli("identity", "list", "--json"))

        def ident_rows():
            rows = browser.js("return [...document.querySelectorAll('#ident-rows tr')].map(r => [r.cells[0].textContent, r.cells[1].textContent])")
            return sorted(tuple(r) for r in rows) == idents
        wait("the identities", ident_rows)
        browser.screenshot(os.path.join(a.shots, "names.png"))
        console_errors("names")
        print(f"names: {len(want_names)} rows match `fqdnd cache list --json`, {len(idents)} `fqdnd identity list --json`")

        # 5. Policy: the explain form agrees with `fqdnd policy explain` (allowed and denied).
        browser.go(base + "/#policy")
        wait("the endpoints", lambda: browser.js("return document.querySelectorAll('#x-endpoint option').length") > 0)
        wait("the rules", lambda: "office" in (browser.text("#policy-list") or ""))
        for peer, port, expect in (("192.0.2.10", "443", True), ("203.0.113.8", "443", False)):
            browser.select("#x-endpoint", "100")
            browser.select("#x-direction", "egress")
            browser.type("#x-peer", peer)
            browser.select("#x-protocol", "tcp")
            browser.type("#x-port", port)
            browser.click("#x-go")
            cli_says = cli("policy", "explain", "--endpoint", "100", f"{peer}:{port}/tcp", "--json")
            verdict = "allowed" if cli_says["allowed"] else "denied"
            assert cli_says["allowed"] == expect, cli_says
            wait(f"the explanation of {peer}",
                 lambda: browser.text("#x-verdict") == verdict and browser.text("#x-reason") == cli_says["reason"])
            print(f"policy: {peer}:{port}/tcp {verdict} — {cli_says['reason']} (form and CLI agree)")
        browser.screenshot(os.path.join(a.shots, "policy.png"))
        console_errors("policy")

        # 6. Drops: a gateway has no datapath; the page says so.
        browser.go(base + "/#drops")
        wait("the drops note", lambda: "node agent" in (browser.text("#drops-note") or ""))
        browser.screenshot(os.path.join(a.shots, "drops.png"))
        console_errors("drops")
        print("drops: the gateway's page says drops come from the node agent")

        assert not errors, "console errors:\n" + "\n".join(errors)
        print("console: no errors on any page")
    finally:
        browser.quit()


if __name__ == "__main__":
    main()
