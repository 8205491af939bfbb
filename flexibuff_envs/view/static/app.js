// The episode browser's page: runs over time (uPlot charts), the episodes' table (sorted,
// filtered and paged by the server), one episode's timeline and observations. The URL's hash
// holds what is shown (run, sort, page, episode, step), so a view is a link.
"use strict";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
const PAGE = 50;
const state = Object.assign(
  { run: 0, sort: "episode", desc: 0, agent: "", ended: "", offset: 0, episode: -1, step: 0 },
  Object.fromEntries(new URLSearchParams(location.hash.slice(1)))
);
for (const key of ["run", "desc", "offset", "episode", "step"]) state[key] = Number(state[key]);
let runs = [];
let charts = [];
let timeline = null;
let total = 0;
const number = (v, digits) => (v === null ? "–" : v.toFixed(digits)); // null: not finite (NaN, inf)

const $ = (id) => document.getElementById(id);
const api = async (path) => {
  const response = await fetch(path);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error);
  return body;
};
const remember = () => { location.hash = new URLSearchParams(state).toString(); };

function smoothed(values, width) {
  const out = new Array(values.length);
  let sum = 0;
  for (let i = 0; i < values.length; i++) {
    sum += values[i];
    if (i >= width) sum -= values[i - width];
    out[i] = sum / Math.min(i + 1, width);
  }
  return out;
}

function chart(element, title, series, data) {
  element.replaceChildren();
  const options = {
    title, width: Math.min(element.parentElement.clientWidth, 1100), height: 260,
    scales: { x: { time: false } },
    axes: [{ label: "episode", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000] }, {}],
    series: [{ label: "episode" }, ...series],
  };
  return new uPlot(options, data, element);
}

function drawRuns() {
  charts.forEach((c) => c.destroy());
  const width = Math.max(1, Number($("smooth").value));
  const longest = Math.max(1, ...runs.map((r) => r.episodes));
  const x = Array.from({ length: longest }, (_, i) => i + 1);
  const pad = (values) => x.map((_, i) => (i < values.length ? values[i] : null));
  const returns = [], lengths = [], returnData = [x], lengthData = [x];
  runs.forEach((run, r) => {
    const name = runs.length > 1 ? `run ${r} ` : "";
    const groups = run.agents.length > 8 ? [] : run.agents.map((agent, a) => [agent, run.returns[a]]);
    for (const [label, values] of [[`${name}team`, run.team], ...groups.map(([agent, v]) => [`${name}${agent}`, v])]) {
      returns.push({ label, stroke: COLORS[returns.length % COLORS.length] });
      returnData.push(pad(smoothed(values, width)));
    }
    lengths.push({ label: `${name}length`, stroke: COLORS[r % COLORS.length] });
    lengthData.push(pad(smoothed(run.lengths, width)));
  });
  charts = [
    chart($("returns-chart"), "return per episode", returns, returnData),
    chart($("lengths-chart"), "episode length", lengths, lengthData),
  ];
}

function listRuns() {
  $("runs-list").replaceChildren(...runs.map((run, r) => {
    const item = document.createElement("li");
    const ended = {};
    run.ended.forEach((e) => { ended[e] = (ended[e] || 0) + 1; });
    item.textContent = `run ${r}: ${run.path} (${run.kind}), ${run.episodes} episodes, ` +
      Object.entries(ended).map(([k, v]) => `${v} ${k}`).join(", ");
    return item;
  }));
  const select = $("run-select");
  select.replaceChildren(...runs.map((run, r) => new Option(`run ${r}`, r)));
  select.value = state.run;
  const agents = runs[state.run] ? runs[state.run].agents : [];
  $("agent-select").replaceChildren(new Option("team return", ""), ...agents.map((a, i) => new Option(a, i)));
  $("agent-select").value = state.agent;
}

async function loadTable() {
  const query = new URLSearchParams({
    run: state.run, sort: state.sort, desc: state.desc, agent: state.agent, ended: state.ended,
    offset: state.offset, limit: PAGE,
  });
  const page = await api(`/api/episodes?${query}`);
  total = page.total;
  $("count").textContent = `${page.total} episodes`;
  $("page").textContent = `${Math.min(state.offset + 1, page.total)}-${Math.min(state.offset + PAGE, page.total)}`;
  $("prev").disabled = state.offset === 0;
  $("next").disabled = state.offset + PAGE >= page.total;
  document.querySelectorAll("th[data-sort]").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.sort === state.sort);
  });
  $("episodes").tBodies[0].replaceChildren(...page.rows.map((row) => {
    const tr = document.createElement("tr");
    tr.dataset.episode = row.episode;
    tr.classList.toggle("chosen", row.episode === state.episode);
    for (const value of [row.episode, row.length, number(row.return, 3), row.returns.map((v) => number(v, 2)).join(" "), row.ended]) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    tr.addEventListener("click", () => openEpisode(row.episode));
    return tr;
  }));
}

async function openEpisode(episode) {
  state.episode = episode;
  remember();
  const data = await api(`/api/episode?run=${state.run}&episode=${episode}`);
  $("episode").hidden = false;
  $("episode-title").textContent = `Episode ${episode} of run ${state.run}: ${data.length} steps`;
  const steps = Array.from({ length: data.length }, (_, i) => i);
  const series = [], values = [steps];
  const shown = data.agents.slice(0, 8);
  shown.forEach((agent, a) => {
    series.push({ label: `${agent} reward`, stroke: COLORS[a % COLORS.length] });
    values.push(data.rewards[a]);
    series.push({ label: `${agent} return so far`, stroke: COLORS[a % COLORS.length], dash: [6, 4] });
    values.push(data.return_so_far[a]);
    for (const [key, label] of [["actions", "action"], ["active", "active"], ["legal", "legal actions"]]) {
      if (data[key]) {
        series.push({ label: `${agent} ${label}`, stroke: COLORS[a % COLORS.length], show: false });
        values.push(data[key][a]);
      }
    }
  });
  if (timeline) timeline.destroy();
  timeline = new uPlot({
    title: "timeline", width: Math.min($("episode").clientWidth, 1100), height: 260,
    scales: { x: { time: false } }, axes: [{ label: "step" }, {}],
    series: [{ label: "step" }, ...series],
    cursor: { bind: { mouseup: (u) => (e) => { if (u.cursor.idx != null) showStep(u.cursor.idx); return null; } } },
  }, values, $("timeline"));
  const header = ["step", ...series.map((s) => s.label)].join(",");
  const lines = steps.map((t) => [t, ...values.slice(1).map((v) => v[t])].join(","));
  $("episode-csv").href = URL.createObjectURL(new Blob([[header, ...lines].join("\n")], { type: "text/csv" }));
  $("episode-csv").download = `episode-${episode}.csv`;
  $("step").max = data.length - 1;
  $("observations").dataset.agents = shown.length;
  await showStep(Math.min(state.step, data.length - 1));
  document.querySelectorAll("#episodes tbody tr").forEach((tr) => {
    tr.classList.toggle("chosen", Number(tr.dataset.episode) === episode);
  });
}

async function showStep(step) {
  state.step = step;
  remember();
  $("step").value = step;
  $("step-value").textContent = step;
  const agents = runs[state.run].agents.slice(0, 8);
  const figures = await Promise.all(agents.map(async (agent, a) => {
    const frame = await api(`/api/frame?run=${state.run}&episode=${state.episode}&step=${step}&agent=${a}`);
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.textContent = agent;
    figure.append(caption);
    if (frame.pixels === undefined) {
      const pre = document.createElement("pre");
      pre.textContent = frame.values.map((v) => number(v, 3)).join(" ");
      figure.append(pre);
      return figure;
    }
    const canvas = document.createElement("canvas");
    canvas.width = frame.width;
    canvas.height = frame.height;
    canvas.className = "frame";
    const bytes = Uint8Array.from(atob(frame.pixels), (c) => c.charCodeAt(0));
    const image = new ImageData(frame.width, frame.height);
    for (let p = 0; p < frame.width * frame.height; p++) {
      const c = frame.channels;
      image.data[4 * p] = bytes[c * p];
      image.data[4 * p + 1] = bytes[c * p + (c >= 3 ? 1 : 0)];
      image.data[4 * p + 2] = bytes[c * p + (c >= 3 ? 2 : 0)];
      image.data[4 * p + 3] = 255;
    }
    canvas.getContext("2d").putImageData(image, 0, 0);
    canvas.style.width = `${Math.max(frame.width, 168)}px`;
    figure.append(canvas);
    return figure;
  }));
  $("observations").replaceChildren(...figures);
  $("observations").dataset.step = step;
}

async function refresh() {
  try {
    const fresh = await api("/api/runs");
    const grown = fresh.map((r) => r.episodes).join() !== runs.map((r) => r.episodes).join();
    runs = fresh;
    $("status").textContent = `${runs.reduce((n, r) => n + r.episodes, 0)} episodes in ${runs.length} run(s)`;
    if (grown) {
      listRuns();
      drawRuns();
      await loadTable();
    }
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
}

document.querySelectorAll("th[data-sort]").forEach((th) => th.addEventListener("click", () => {
  state.desc = state.sort === th.dataset.sort ? 1 - state.desc : th.dataset.sort === "episode" ? 0 : 1;
  state.sort = th.dataset.sort;
  state.offset = 0;
  remember();
  loadTable();
}));
for (const [id, key] of [["run-select", "run"], ["agent-select", "agent"], ["ended-select", "ended"]]) {
  $(id).addEventListener("change", () => {
    state[key] = key === "run" ? Number($(id).value) : $(id).value;
    state.offset = 0;
    remember();
    if (key === "run") { // the other run's episode is closed, its agent filter dropped
      Object.assign(state, { episode: -1, step: 0, agent: "" });
      $("episode").hidden = true;
      if (timeline) timeline.destroy();
      timeline = null;
      remember();
      listRuns();
    }
    loadTable();
  });
}
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); remember(); loadTable(); });
$("next").addEventListener("click", () => {
  if (state.offset + PAGE < total) { state.offset += PAGE; remember(); loadTable(); }
});
$("timeline-png").addEventListener("click", () => { // drawn by now
  if (timeline) $("timeline-png").href = timeline.root.querySelector("canvas").toDataURL("image/png");
});
$("smooth").addEventListener("change", drawRuns);
$("step").addEventListener("input", () => showStep(Number($("step").value)));

async function poll() { // the next refresh only once this one is done: slow ones do not pile up
  await refresh();
  setTimeout(poll, 2000);
}

(async () => {
  $("ended-select").value = state.ended;
  await poll();
  if (state.episode >= 0) {
    try {
      await openEpisode(state.episode);
    } catch (error) { // a link to an episode the run no longer holds
      $("status").textContent = `error: ${error.message}`;
    }
  }
})();
