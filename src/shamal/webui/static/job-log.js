// A job's log, followed while the job runs: the <pre class="log" data-log="/ui/api/jobs/ID/log">
// holds what the server rendered (up to `data-offset` bytes); this asks for what comes next
// (`?offset=N&attempt=A`, answered as JSON {text, offset, attempt, done, next_attempt, more})
// and appends it as text (textContent: never parsed as HTML). While nothing new arrives the
// wait doubles from 1 s to 15 s; new text brings it back to 1 s (at once while `more` says the
// next piece is already stored). Polling pauses while the tab is
// hidden and stops once the server says the job has ended and its log is whole. A retried
// job's next attempt follows its previous one under a marker line.
const MIN_MS = 1000;
const MAX_MS = 15000;
// The page keeps at most this many characters: the oldest go first.
const KEEP_CHARS = 2_000_000;

function follow(pre) {
  const url = pre.dataset.log;
  if (!url || !url.startsWith("/ui/api/jobs/")) return;
  const status = document.getElementById("log-status");
  let offset = Number(pre.dataset.offset) || 0;
  let attempt = Number(pre.dataset.attempt) || 0;
  let wait = MIN_MS;
  let timer = null;
  let stopped = pre.dataset.done === "1";
  let busy = false; // a request in flight: no second one may ask for the same offset

  function say(text) {
    if (status) status.textContent = text;
  }

  function append(text) {
    if (!text) return;
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(text));
    if (pre.textContent.length > KEEP_CHARS) {
      pre.textContent = "[earlier lines dropped from this page]\n" + pre.textContent.slice(-KEEP_CHARS / 2);
    }
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function schedule() {
    if (!stopped && !busy && timer === null && !document.hidden) timer = setTimeout(tick, wait);
  }
  // The wait after a piece that said `more` is 0: the next tick asks at once.

  async function tick() {
    timer = null;
    if (document.hidden || stopped || busy) return;
    busy = true;
    try {
      await ask();
    } finally {
      busy = false;
    }
    schedule();
  }

  // One request for what follows `offset`; `stopped` once the log is whole or signed out.
  async function ask() {
    try {
      const answer = await fetch(`${url}?offset=${offset}&attempt=${attempt}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (answer.redirected || answer.status === 401) {
        say("Signed out: sign in again to follow the log.");
        stopped = true;
        return;
      }
      if (!answer.ok) throw new Error(String(answer.status));
      const chunk = await answer.json();
      if (typeof chunk.text !== "string" || typeof chunk.offset !== "number") throw new Error("odd answer");
      const grew = chunk.text.length > 0;
      append(chunk.text);
      offset = chunk.offset;
      if (chunk.done) {
        stopped = true;
        say("The job has ended; this is its whole log.");
        return;
      }
      if (typeof chunk.next_attempt === "number" && chunk.next_attempt > attempt) {
        attempt = chunk.next_attempt;
        offset = 0;
        append(`\n--- attempt ${attempt} ---\n`);
        wait = MIN_MS;
      } else if (chunk.more === true) {
        wait = 0; // a long log catching up: the next piece is already there
      } else {
        wait = grew ? MIN_MS : Math.min(MAX_MS, wait * 2);
      }
      say(`Following attempt ${attempt}…`);
    } catch (error) {
      wait = Math.min(MAX_MS, wait * 2);
      say("The server did not answer; trying again.");
    }
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      if (timer !== null) clearTimeout(timer);
      timer = null;
    } else {
      wait = MIN_MS;
      schedule();
    }
  });
  if (pre.dataset.nextAttempt) {
    attempt = Number(pre.dataset.nextAttempt);
    offset = 0;
    append(`\n--- attempt ${attempt} ---\n`);
  }
  if (!stopped) {
    wait = MIN_MS;
    schedule();
  }
}

for (const pre of document.querySelectorAll("pre.log[data-log]")) follow(pre);
