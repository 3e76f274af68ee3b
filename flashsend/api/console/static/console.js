// The console's only script: times in the viewer's zone, live counts from the campaign's
// event stream, the rate chart, and the campaign list kept current. Everything it shows is
// on the page already when it is off.
"use strict";

const FINAL = new Set(["done", "cancelled", "failed"]);
const fmt = (n) => (n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }));

function localTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    const at = new Date(el.getAttribute("datetime"));
    if (isNaN(at)) continue;
    el.textContent = at.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "long" });
  }
}

function duration(s) {
  if (s === null || s === undefined) return "–";
  s = Math.round(s);
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${s} s`;
}

function drawChart(line, series) {
  if (series.length < 2) return;
  const top = Math.max(...series.map((p) => p.per_s)) || 1;
  const last = Math.max(...series.map((p) => p.t_s)) || 1;
  line.setAttribute("points", series.map((p) => `${(600 * p.t_s / last).toFixed(1)},${(160 - 160 * p.per_s / top).toFixed(1)}`).join(" "));
  const peak = document.querySelector('[data-field="peak"]');
  if (peak) peak.textContent = fmt(top);
}

function liveCampaign(article) {
  const shown = article.dataset.status;
  const line = document.getElementById("rate-line");
  const series = JSON.parse(line.dataset.series || "[]");
  let firstSent = parseFloat(line.dataset.firstSent || "NaN");
  let previous = null;
  const source = new EventSource(article.dataset.live);
  const set = (sel, text) => { for (const el of article.querySelectorAll(sel)) el.textContent = text; };
  source.addEventListener("progress", (event) => {
    const f = JSON.parse(event.data);
    if (isNaN(firstSent)) firstSent = f.at;  // nothing sent when the page was made
    for (const k of ["pending", "sending", "sent", "failed", "unknown", "skipped", "cancelled", "held", "recipients"]) {
      set(`[data-count="${k}"]`, fmt(f[k]));
    }
    const done = ["sent", "failed", "unknown", "skipped", "cancelled"].reduce((a, k) => a + (f[k] || 0), 0);
    const bar = document.getElementById("bar");
    bar.max = f.recipients || 0;
    bar.value = done;
    set('[data-field="done"]', fmt(done));
    set('[data-field="percent"]', f.recipients ? (100 * done / f.recipients).toFixed(1) : "0.0");
    set('[data-field="rate"]', fmt(f.status === "sending" ? f.rate_per_s : 0));
    set('[data-field="eta"]', f.status === "sending" ? duration(f.eta_s) : "–");
    set('[data-field="status"]', f.status);
    if (previous && f.at > previous.at) {
      series.push({ t_s: f.at - firstSent, per_s: Math.max(0, (f.sent - previous.sent) / (f.at - previous.at)) });
      drawChart(line, series);
    }
    if (!previous || f.at - previous.at >= 1 || f.sent < previous.sent) previous = f;
    if (f.status !== shown) {
      source.close();
      location.reload();  // the buttons and sections follow the new state
    }
  });
  source.addEventListener("gone", () => source.close());
  source.addEventListener("unauthorized", () => { source.close(); location.href = "/console/sign-in"; });
}

function liveList(table) {
  const active = () => [...table.querySelectorAll("tbody tr[data-status]")].some((tr) => !FINAL.has(tr.dataset.status) && tr.dataset.status !== "draft");
  const tick = async () => {
    if (!active()) return;
    try {
      const answer = await fetch(location.href, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (answer.redirected || !answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const body = page.querySelector("#campaigns tbody");
      if (body) {
        table.querySelector("tbody").replaceWith(body);
        localTimes(table);
      }
    } catch (e) {
      // the API is away for a moment: try again on the next tick
    }
    setTimeout(tick, 2000);
  };
  setTimeout(tick, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  const article = document.querySelector("article[data-live]");
  if (article && window.EventSource) liveCampaign(article);
  const table = document.querySelector('table[data-live="list"]');
  if (table) liveList(table);
});
