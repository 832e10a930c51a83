// Parts of a page that follow the server without a reload: every element with a
// `data-live` attribute (one of the UI's own paths) is fetched again and its content
// replaced by the HTML fragment the server answers. The interval starts at `data-live-ms`
// (2 s when left out), doubles while nothing changes or the server does not answer, up to
// 30 s, and returns to the start after a change; polling pauses while the tab is hidden
// and stops for good once the server marks the fragment final (`X-Shamal-Final: 1`, e.g.
// a finished job). The fragment is server-rendered and escaped; the Content-Security-Policy
// keeps any script in it from running.
const MAX_MS = 30000;

function follow(element) {
  const url = element.dataset.live;
  if (!url || !url.startsWith("/ui/")) return;
  const base = Math.max(500, Number(element.dataset.liveMs) || 2000);
  let wait = base;
  let last = element.innerHTML;
  let timer = null;
  let busy = false; // a fetch in flight: the tab shown again must not start a second loop

  async function tick() {
    timer = null;
    if (document.hidden || busy) return; // resumed by visibilitychange
    busy = true;
    let final = false;
    try {
      const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (answer.redirected || answer.status === 401) {
        element.setAttribute("data-live-state", "signed-out");
        return;
      }
      if (!answer.ok) throw new Error(String(answer.status));
      const body = await answer.text();
      final = answer.headers.get("X-Shamal-Final") === "1";
      if (body !== last) {
        element.innerHTML = body;
        last = body;
        wait = base;
        element.dispatchEvent(new CustomEvent("live-updated", { bubbles: true }));
      } else {
        wait = Math.min(MAX_MS, wait * 2);
      }
      element.setAttribute("data-live-state", final ? "final" : "following");
    } catch (error) {
      element.setAttribute("data-live-state", "retrying");
      wait = Math.min(MAX_MS, wait * 2);
    } finally {
      busy = false;
    }
    if (!final) timer = setTimeout(tick, wait);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null && !busy && element.dataset.liveState !== "final") {
      wait = base;
      tick();
    }
  });
  timer = setTimeout(tick, base);
}

for (const element of document.querySelectorAll("[data-live]")) follow(element);
