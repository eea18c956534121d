// treadle dashboard: live refresh and in-page actions.
//
// The server renders every page (Jinja escapes all data). This script only
// fetches the same page again, parses it with DOMParser (which runs no script)
// and swaps in the sections marked data-live; it never builds HTML from data.
"use strict";

(() => {
  const body = document.body;
  const refreshMs = Number(body.dataset.refresh || 0);
  const notice = document.getElementById("notice");
  let timer = null;
  let loading = false;

  function say(text, kind) {
    notice.replaceChildren();
    const line = document.createElement("p");
    line.textContent = text;
    notice.append(line);
    notice.className = "notice " + kind;
    notice.hidden = false;
  }

  function unsay(kind) {
    if (notice.classList.contains(kind)) notice.hidden = true;
  }

  function openRun() {
    const match = /^#run=(\d+)$/.exec(location.hash);
    return match ? match[1] : null;
  }

  // The URL that renders what the page shows now: the overview takes the open run as ?run=.
  function pageUrl() {
    const url = new URL(location.href);
    url.hash = "";
    if (body.dataset.page === "overview") {
      const run = openRun();
      if (run) url.searchParams.set("run", run);
      else url.searchParams.delete("run");
    }
    return url;
  }

  function updatedText() {
    const updated = document.getElementById("updated");
    return updated ? updated.textContent.replace(/^Updated /, "") : "";
  }

  // A fresh section keeps what the reader did to the old one: the details opened, and
  // where a scrolled box (the run's drawing) was scrolled to.
  function swap(fresh) {
    const opened = new Set(
      Array.from(document.querySelectorAll("details[open][data-key]"), (d) => d.dataset.key),
    );
    const scrolled = new Map(
      Array.from(document.querySelectorAll("div[data-key]"), (d) => [d.dataset.key, [d.scrollLeft, d.scrollTop]]),
    );
    for (const old of document.querySelectorAll("[data-live]")) {
      const next = fresh.getElementById(old.id);
      if (next) old.replaceWith(document.adoptNode(next));
    }
    for (const details of document.querySelectorAll("details[data-key]")) {
      if (opened.has(details.dataset.key)) details.open = true;
    }
    for (const box of document.querySelectorAll("div[data-key]")) {
      const at = scrolled.get(box.dataset.key);
      if (at) [box.scrollLeft, box.scrollTop] = at;
    }
  }

  async function refresh() {
    if (loading) return;
    loading = true;
    try {
      const response = await fetch(pageUrl(), {
        headers: { Accept: "text/html" },
        credentials: "same-origin",
        cache: "no-store",
      });
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      if (!response.ok) {
        const message = fresh.querySelector(".error-message");
        say(message ? message.textContent : "The dashboard answered HTTP " + response.status + ".", "stale");
        // a run that does not exist would fail every refresh: close it
        if (openRun() && (response.status === 404 || response.status === 400)) {
          history.replaceState(null, "", location.pathname + location.search);
        }
        return;
      }
      swap(fresh);
      unsay("offline");
      unsay("stale");
    } catch (error) {
      say("Cannot reach the dashboard; showing data from " + updatedText() + " UTC. Retrying.", "offline");
    } finally {
      loading = false;
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (refreshMs > 0) timer = setTimeout(tick, refreshMs);
  }

  async function tick() {
    if (!document.hidden) await refresh();
    schedule();
  }

  // Actions: post the form, say what happened, show the new state.
  document.addEventListener("submit", async (event) => {
    const form = event.target.closest("form[data-action]");
    if (!form) return;
    event.preventDefault();
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: new URLSearchParams(new FormData(form)),
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      let message = "The dashboard answered HTTP " + response.status + ".";
      try {
        message = (await response.json()).message || message;
      } catch (error) {
        // not JSON: keep the status line
      }
      say(response.ok ? message : "Did not apply: " + message, response.ok ? "done" : "problem");
    } catch (error) {
      say("Cannot reach the dashboard: the action was not sent.", "offline");
    } finally {
      if (button) button.disabled = false;
    }
    await refresh();
  });

  // A workflow run opens in place (#run=<id>); a modified click still opens its page.
  document.addEventListener("click", (event) => {
    const link = event.target.closest("a[data-run]");
    if (!link || body.dataset.page !== "overview") return;
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    event.preventDefault();
    if (openRun() === link.dataset.run) {
      history.replaceState(null, "", location.pathname + location.search);
      refresh();
    } else {
      location.hash = "run=" + link.dataset.run; // hashchange refreshes
    }
  });

  window.addEventListener("hashchange", refresh);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && refreshMs > 0) refresh();
  });

  if (body.dataset.page === "overview" && openRun()) refresh();
  schedule();
})();
