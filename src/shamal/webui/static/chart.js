// Metric curves as SVG. The server cuts each curve to about two points per pixel, keeping
// every bucket's minimum and maximum; dragging across a chart asks for that range again,
// at full resolution once it fits.
const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 640;
const HEIGHT = 240;
const PAD = { left: 64, right: 12, top: 10, bottom: 28 };

function el(name, attrs = {}) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  return node;
}

function label(text, attrs) {
  const node = el("text", attrs);
  node.textContent = text;
  return node;
}

function fmt(value) {
  return Number.isInteger(value) ? String(value) : value.toPrecision(4);
}

async function fetchSeries(run, key, range) {
  const params = new URLSearchParams({ points: String(WIDTH * 2) });
  if (range) {
    params.set("from", String(Math.floor(range[0])));
    params.set("to", String(Math.ceil(range[1])));
  }
  const url = `/ui/api/runs/${run}/metrics/${encodeURIComponent(key)}?${params}`;
  const answer = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!answer.ok) throw new Error(`the server answered ${answer.status}`);
  return answer.json();
}

function bounds(series) {
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of series) {
    for (let i = 0; i < s.steps.length; i += 1) {
      x0 = Math.min(x0, s.steps[i]); x1 = Math.max(x1, s.steps[i]);
      y0 = Math.min(y0, s.values[i]); y1 = Math.max(y1, s.values[i]);
    }
  }
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= 1; y1 += 1; }
  return { x0, x1, y0, y1 };
}

function draw(figure, series, onZoom) {
  const b = bounds(series);
  const w = WIDTH - PAD.left - PAD.right;
  const h = HEIGHT - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - b.x0) / (b.x1 - b.x0)) * w;
  const sy = (y) => PAD.top + h - ((y - b.y0) / (b.y1 - b.y0)) * h;
  const svg = el("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: "img",
    class: "plot",
    "aria-label": `${figure.dataset.key}: curve from step ${fmt(b.x0)} to ${fmt(b.x1)}, values ${fmt(b.y0)} to ${fmt(b.y1)}`,
  });
  svg.appendChild(label(`${figure.dataset.key}: steps ${fmt(b.x0)} to ${fmt(b.x1)}`, { class: "visually-hidden" }));
  svg.appendChild(el("rect", { x: PAD.left, y: PAD.top, width: w, height: h, class: "frame" }));
  svg.appendChild(label(fmt(b.y1), { x: PAD.left - 6, y: PAD.top + 10, class: "tick end" }));
  svg.appendChild(label(fmt(b.y0), { x: PAD.left - 6, y: PAD.top + h, class: "tick end" }));
  svg.appendChild(label(fmt(b.x0), { x: PAD.left, y: HEIGHT - 8, class: "tick" }));
  svg.appendChild(label(fmt(b.x1), { x: WIDTH - PAD.right, y: HEIGHT - 8, class: "tick end" }));
  series.forEach((s, index) => {
    if (!s.steps.length) return;
    const parts = s.steps.map((x, i) => `${i ? "L" : "M"}${sx(x).toFixed(1)} ${sy(s.values[i]).toFixed(1)}`);
    svg.appendChild(el("path", { d: parts.join(""), class: `line series-${index}` }));
  });
  const band = el("rect", { y: PAD.top, height: h, width: 0, class: "band" });
  svg.appendChild(band);
  let start = null;
  const stepAt = (event) => {
    const box = svg.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * WIDTH;
    const clamped = Math.min(Math.max(x, PAD.left), PAD.left + w);
    return { x: clamped, step: b.x0 + ((clamped - PAD.left) / w) * (b.x1 - b.x0) };
  };
  svg.addEventListener("pointerdown", (event) => { start = stepAt(event); });
  svg.addEventListener("pointermove", (event) => {
    if (!start) return;
    const now = stepAt(event);
    band.setAttribute("x", String(Math.min(start.x, now.x)));
    band.setAttribute("width", String(Math.abs(now.x - start.x)));
  });
  svg.addEventListener("pointerup", (event) => {
    if (!start) return;
    const end = stepAt(event);
    const range = [Math.min(start.step, end.step), Math.max(start.step, end.step)];
    const dragged = Math.abs(end.x - start.x) > 4;
    start = null;
    band.setAttribute("width", "0");
    if (dragged && range[1] - range[0] >= 1) onZoom(range);
  });
  return svg;
}

function status(series) {
  const shown = series.reduce((n, s) => n + s.steps.length, 0);
  const total = series.reduce((n, s) => n + s.total, 0);
  const cut = series.some((s) => s.downsampled);
  return `${shown.toLocaleString()} of ${total.toLocaleString()} points${cut ? " (downsampled: every bucket's minimum and maximum kept)" : ""}`;
}

async function render(figure, range) {
  const runs = figure.dataset.runs.split(" ").filter(Boolean);
  const key = figure.dataset.key;
  figure.dataset.state = "loading";
  let series;
  try {
    series = await Promise.all(runs.map((run) => fetchSeries(run, key, range)));
  } catch (error) {
    figure.dataset.state = "failed";
    figure.querySelector(".chart-status").textContent = `Could not load the curve: ${error.message}`;
    return;
  }
  figure.querySelector("svg")?.remove();
  const svg = draw(figure, series, (zoomed) => render(figure, zoomed));
  figure.insertBefore(svg, figure.querySelector(".chart-tools"));
  figure.querySelector(".chart-status").textContent = status(series);
  figure.querySelector(".reset").hidden = !range;
  figure.dataset.points = String(series.reduce((n, s) => n + s.steps.length, 0));
  figure.dataset.state = "drawn";
  // For anyone timing the page (bench/ui.py): when this curve was on screen.
  performance.mark(`chart-drawn:${key}`);
}

for (const figure of document.querySelectorAll("figure.chart")) {
  const tools = document.createElement("div");
  tools.className = "chart-tools";
  const note = document.createElement("p");
  note.className = "chart-status";
  note.setAttribute("aria-live", "polite");
  const reset = document.createElement("button");
  reset.type = "button";
  reset.className = "reset";
  reset.textContent = "Show all steps";
  reset.hidden = true;
  reset.addEventListener("click", () => render(figure, null));
  tools.append(note, reset);
  figure.appendChild(tools);
  render(figure, null);
}
