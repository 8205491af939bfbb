// The episode browser's page: runs over time (uPlot charts of the server's smoothed, thinned
// curves), the episodes' table (sorted, filtered and paged by the server), one episode's
// timeline and observations. The URL's hash holds what is shown (run, sort, filters, page,
// episode, step, agents), so a view is a link.
"use strict";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"];
const PAGE = 50;
const SHOWN = 8; // agents shown in an episode until others are chosen
const state = Object.assign(
  { run: 0, sort: "episode", desc: 0, agent: "", ended: "", least: "", most: "", seed: "", offset: 0, episode: -1, step: 0, agents: "" },
  Object.fromEntries(new URLSearchParams(location.hash.slice(1)))
);
for (const key of ["run", "desc", "offset", "episode", "step"]) state[key] = Math.max(key === "episode" ? -1 : 0, Math.trunc(Number(state[key])) || 0);
if (!["episode", "length", "return", "ended", "deaths", "seed"].includes(state.sort)) state.sort = "episode";
for (const key of ["least", "most", "seed"]) if (state[key] !== "" && !Number.isFinite(Number(state[key]))) state[key] = "";
state.desc = state.desc ? 1 : 0;
let runs = [];
let charts = [];
let timeline = null;
let small = []; // an episode's observation plots
let total = 0;
let shownStep = 0; // the newest step asked for: an older answer arriving late is dropped
const number = (v, digits) => (v === null ? "–" : v.toFixed(digits)); // null: not finite (NaN, inf), or sat out

const $ = (id) => document.getElementById(id);
const api = async (path) => {
  const response = await fetch(path);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error);
  return body;
};
const remember = () => { location.hash = new URLSearchParams(state).toString(); };
const width = (element) => Math.min(element.parentElement.clientWidth || 800, 1100);
function png(link, plot) { // the chart's canvas with its title and the legend of the lines shown
  if (!plot) return;
  const chart = plot.root.querySelector("canvas");
  const shown = plot.series.slice(1).filter((s) => s.show);
  const rows = Math.ceil(shown.length / 4);
  const out = document.createElement("canvas");
  out.width = chart.width;
  out.height = chart.height + 30 + 20 * rows;
  const g = out.getContext("2d");
  g.fillStyle = "#fff";
  g.fillRect(0, 0, out.width, out.height);
  g.fillStyle = "#222";
  g.font = "bold 15px sans-serif";
  g.fillText(plot.root.querySelector(".u-title")?.textContent ?? "", 10, 20);
  g.drawImage(chart, 0, 30);
  g.font = "13px sans-serif";
  shown.forEach((s, k) => {
    const x = 10 + (k % 4) * Math.floor(out.width / 4), y = chart.height + 45 + 20 * Math.floor(k / 4);
    g.fillStyle = typeof s.stroke === "function" ? s.stroke(plot, k + 1) : s.stroke;
    g.fillRect(x, y - 10, 12, 12);
    g.fillStyle = "#222";
    g.fillText(s.label, x + 18, y);
  });
  link.href = out.toDataURL("image/png");
}

function chart(element, title, label, series, data) {
  element.replaceChildren();
  return new uPlot({
    title, width: width(element), height: 240,
    scales: { x: { time: false } },
    axes: [{ label, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000, 1000000] }, {}],
    series: [{ label }, ...series],
  }, data, element);
}

async function drawRuns() {
  const smooth = Math.max(1, Number($("smooth").value) || 1);
  const curves = await Promise.all(runs.map((_, r) => api(`/api/curves?run=${r}&smooth=${smooth}`)));
  charts.forEach((c) => c.destroy());
  const returns = [], lengths = [], deaths = [], returnTables = [], lengthTables = [], deathTables = [];
  curves.forEach((curve, r) => {
    const name = runs.length > 1 ? `run ${r} ` : "";
    curve.returns.forEach((line) => returns.push({ label: `${name}${line.label}`, stroke: COLORS[returns.length % COLORS.length] }));
    returnTables.push([curve.x, ...curve.returns.map((line) => line.values)]);
    lengths.push({ label: `${name}length`, stroke: COLORS[r % COLORS.length] });
    lengthTables.push([curve.x, curve.lengths]);
    if (curve.deaths && runs[r].deaths) { // a run where some agent died
      deaths.push({ label: `${name}deaths`, stroke: COLORS[r % COLORS.length] });
      deathTables.push([curve.x, curve.deaths]);
    }
  });
  const smoothing = smooth > 1 ? ` (mean of ${smooth})` : "";
  charts = [
    chart($("returns-chart"), `return per episode${smoothing}`, "episode", returns, uPlot.join(returnTables)),
    chart($("lengths-chart"), `episode length${smoothing}`, "episode", lengths, uPlot.join(lengthTables)),
  ];
  $("deaths-chart").hidden = !deaths.length;
  if (deaths.length) {
    charts.push(chart($("deaths-chart"), `agents terminated before the episode ended${smoothing}`, "episode", deaths, uPlot.join(deathTables)));
  }
}

function listRuns() {
  $("runs-list").replaceChildren(...runs.map((run, r) => {
    const item = document.createElement("li");
    const ended = Object.entries(run.ended).map(([k, v]) => `${v} ${k}`);
    if (run.deaths) ended.push(`${run.deaths} deaths`);
    item.textContent = `run ${r}: ${run.path} (${run.kind}), ${run.episodes} episodes` + (ended.length ? `: ${ended.join(", ")}` : "");
    return item;
  }));
  const select = $("run-select");
  select.replaceChildren(...runs.map((run, r) => new Option(`run ${r}`, r)));
  select.value = state.run;
  const agents = runs[state.run] ? runs[state.run].agents : [];
  $("agent-select").replaceChildren(new Option("team return", ""), ...agents.map((a, i) => new Option(a, i)));
  $("agent-select").value = state.agent;
  $("return-header").textContent = state.agent === "" ? "return" : `return of ${agents[Number(state.agent)] ?? "?"}`;
}

async function loadTable() {
  const query = new URLSearchParams({
    run: state.run, sort: state.sort, desc: state.desc, agent: state.agent, ended: state.ended,
    least: state.least, most: state.most, seed: state.seed, offset: state.offset, limit: PAGE,
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
    const cells = [row.episode, row.length, number(row.return, 3), row.returns.map((v) => number(v, 2)).join(" "), row.ended, row.deaths, row.seed ?? "-"];
    for (const value of cells) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    tr.addEventListener("click", () => { state.step = 0; openEpisode(row.episode); });
    return tr;
  }));
}

function chosenAgents() { // indices of the agents an episode shows ("": the first eight, "none": none)
  const agents = runs[state.run].agents;
  if (state.agents === "none") return [];
  const chosen = state.agents === "" ? agents.map((_, a) => a).slice(0, SHOWN) : state.agents.split(",").map(Number);
  return chosen.filter((a) => a >= 0 && a < agents.length);
}

function pickAgents() {
  const agents = runs[state.run].agents;
  $("agent-picker").hidden = agents.length < 2;
  const chosen = new Set(chosenAgents());
  $("agent-picker").replaceChildren(...agents.map((agent, a) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = chosen.has(a);
    box.addEventListener("change", () => {
      box.checked ? chosen.add(a) : chosen.delete(a);
      state.agents = [...chosen].sort((x, y) => x - y).join(",") || "none";
      openEpisode(state.episode);
    });
    label.append(box, ` ${agent}`);
    return label;
  }));
}

async function openEpisode(episode) {
  state.episode = episode;
  remember();
  const data = await api(`/api/episode?run=${state.run}&episode=${episode}`);
  $("episode").hidden = false;
  $("episode-title").textContent = `Episode ${episode} of run ${state.run}: ${data.length} steps`;
  $("episode-hash").textContent = "";
  pickAgents();
  const steps = Array.from({ length: data.length }, (_, i) => i);
  const series = [], values = [steps];
  const shown = chosenAgents();
  const extra = [["actions", "action"], ["active", "active"], ["legal", "legal actions"], ["values", "value"],
    ["discrete_log_probs", "log prob"], ["continuous_log_probs", "log prob"]];
  shown.forEach((a, i) => {
    const agent = data.agents[a], stroke = COLORS[i % COLORS.length];
    series.push({ label: `${agent} reward`, stroke });
    values.push(data.rewards[a]);
    series.push({ label: `${agent} return so far`, stroke, dash: [6, 4] });
    values.push(data.return_so_far[a]);
    for (const [key, label] of extra) {
      if (data[key]) {
        series.push({ label: `${agent} ${label}`, stroke, dash: [2, 3], show: key === "values" });
        values.push(data[key][a]);
      }
    }
  });
  if (timeline) timeline.destroy();
  timeline = new uPlot({
    title: "timeline", width: width($("timeline")), height: 260,
    scales: { x: { time: false } }, axes: [{ label: "step" }, {}],
    series: [{ label: "step" }, ...series],
  }, values, $("timeline"));
  timeline.over.addEventListener("click", () => { // a click picks the step; a drag zooms, as uPlot does
    if (timeline.cursor.idx != null && timeline.select.width === 0) showStep(timeline.cursor.idx);
  });
  const header = ["step", ...series.map((s) => s.label)].join(",");
  const lines = steps.map((t) => [t, ...values.slice(1).map((v) => v[t] ?? "")].join(","));
  $("episode-csv").href = URL.createObjectURL(new Blob([[header, ...lines].join("\n")], { type: "text/csv" }));
  $("episode-csv").download = `episode-${episode}.csv`;
  $("episode-parquet").href = `/api/export?run=${state.run}&episode=${episode}`;
  $("step").max = data.length - 1;
  $("observations").dataset.agents = shown.length;
  await plotObservations(shown, steps);
  await showStep(Math.min(state.step, data.length - 1));
  document.querySelectorAll("#episodes tbody tr").forEach((tr) => {
    tr.classList.toggle("chosen", Number(tr.dataset.episode) === episode);
  });
}

async function plotObservations(shown, steps) { // a vector observation: its values over the episode, per agent
  small.forEach((p) => p.destroy());
  small = [];
  $("observation-plots").replaceChildren();
  if (runs[state.run].image) return;
  const agents = runs[state.run].agents;
  const answers = await Promise.all(shown.map((a) => api(`/api/observations?run=${state.run}&episode=${state.episode}&agent=${a}`)));
  answers.forEach((answer, i) => {
    const element = document.createElement("div");
    element.className = "small";
    $("observation-plots").append(element);
    const more = answer.size > answer.series.length ? ` (first ${answer.series.length} of ${answer.size})` : "";
    small.push(new uPlot({
      title: `${agents[shown[i]]} observation${more}`, width: 340, height: 160, legend: { show: false },
      scales: { x: { time: false } }, axes: [{}, {}],
      series: [{}, ...answer.series.map((_, d) => ({ label: `obs[${d}]`, stroke: COLORS[d % COLORS.length], width: 1 }))],
    }, [steps, ...answer.series], element));
  });
}

function figure(agent, frame) {
  const figure = document.createElement("figure");
  const caption = document.createElement("figcaption");
  caption.textContent = agent;
  figure.append(caption);
  if (frame.inactive) {
    const note = document.createElement("p");
    note.className = "inactive";
    note.textContent = "not active at this step";
    figure.append(note);
  } else if (frame.pixels === undefined) {
    const pre = document.createElement("pre");
    pre.textContent = frame.values.map((v) => number(v, 3)).join(" ");
    figure.append(pre);
  } else {
    const canvas = document.createElement("canvas");
    canvas.width = frame.width;
    canvas.height = frame.height;
    canvas.className = "frame";
    const bytes = Uint8Array.from(atob(frame.pixels), (c) => c.charCodeAt(0));
    const image = new ImageData(frame.width, frame.height);
    const c = frame.channels;
    for (let p = 0; p < frame.width * frame.height; p++) {
      image.data[4 * p] = bytes[c * p];
      image.data[4 * p + 1] = bytes[c * p + (c >= 3 ? 1 : 0)];
      image.data[4 * p + 2] = bytes[c * p + (c >= 3 ? 2 : 0)];
      image.data[4 * p + 3] = 255;
    }
    canvas.getContext("2d").putImageData(image, 0, 0);
    canvas.style.width = `${Math.max(frame.width, 168)}px`;
    figure.append(canvas);
  }
  return figure;
}

async function showStep(step) {
  shownStep = step;
  state.step = step;
  remember();
  $("step").value = step;
  $("step-value").textContent = step;
  const agents = runs[state.run].agents;
  const shown = chosenAgents();
  const frames = await Promise.all(shown.map((a) => api(`/api/frame?run=${state.run}&episode=${state.episode}&step=${step}&agent=${a}`)));
  if (step !== shownStep) return; // the slider moved on while these were asked for
  $("observations").replaceChildren(...frames.map((frame, i) => figure(agents[shown[i]], frame)));
  $("observations").dataset.step = step;
  small.forEach((p) => p.setCursor({ left: p.valToPos(step, "x"), top: 0 }));
}

async function refresh() {
  try {
    const fresh = await api("/api/runs");
    const grown = fresh.map((r) => r.episodes).join() !== runs.map((r) => r.episodes).join();
    runs = fresh;
    $("status").textContent = `${runs.reduce((n, r) => n + r.episodes, 0)} episodes in ${runs.length} run(s)`;
    if (!runs[state.run]) { state.run = 0; closeEpisode(); remember(); }
    if (grown) {
      listRuns();
      await drawRuns();
      await loadTable();
      if (state.episode >= 0 && $("episode").hidden) await openEpisode(state.episode).catch(() => {}); // a link ahead of the log
    }
  } catch (error) {
    $("status").textContent = `error: ${error.message}`;
  }
}

function closeEpisode() {
  Object.assign(state, { episode: -1, step: 0, agent: "", agents: "" });
  $("episode").hidden = true;
  if (timeline) timeline.destroy();
  timeline = null;
}

document.querySelectorAll("th[data-sort]").forEach((th) => th.addEventListener("click", () => {
  state.desc = state.sort === th.dataset.sort ? 1 - state.desc : th.dataset.sort === "episode" ? 0 : 1;
  state.sort = th.dataset.sort;
  state.offset = 0;
  remember();
  loadTable();
}));
for (const [id, key] of [["run-select", "run"], ["agent-select", "agent"], ["ended-select", "ended"], ["least", "least"], ["most", "most"], ["seed", "seed"]]) {
  $(id).addEventListener("change", () => {
    state[key] = key === "run" ? Number($(id).value) : $(id).value;
    state.offset = 0;
    if (key === "run") closeEpisode(); // the other run's episode is closed, its agent filter dropped
    listRuns();
    remember();
    loadTable().catch((error) => { $("count").textContent = `error: ${error.message}`; });
  });
}
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); remember(); loadTable(); });
$("next").addEventListener("click", () => {
  if (state.offset + PAGE < total) { state.offset += PAGE; remember(); loadTable(); }
});
$("timeline-png").addEventListener("click", () => png($("timeline-png"), timeline));
$("episode-hash-button").addEventListener("click", async () => { // reads the whole episode: only when asked
  $("episode-hash").textContent = "hashing...";
  const answer = await api(`/api/hash?run=${state.run}&episode=${state.episode}`);
  $("episode-hash").textContent = answer.hash;
});
$("returns-png").addEventListener("click", () => png($("returns-png"), charts[0]));
$("lengths-png").addEventListener("click", () => png($("lengths-png"), charts[1]));
$("smooth").addEventListener("change", drawRuns);
$("step").addEventListener("input", () => showStep(Number($("step").value)));

async function poll() { // the next refresh only once this one is done: slow ones do not pile up
  await refresh();
  setTimeout(poll, 2000);
}

(async () => {
  $("ended-select").value = state.ended;
  $("least").value = state.least;
  $("most").value = state.most;
  $("seed").value = state.seed;
  await poll(); // it opens the episode the URL names, once the run holds it
})();
