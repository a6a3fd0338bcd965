"""The review page (/review): per camera a timeline of what was recorded with its events marked, the events
with their snapshots and filters, and a player for an event's clip or the recording around it. Plain
JavaScript on the review API (review.py); nothing from another site, so it works where there is no internet.

Keys: j / ArrowDown the next event, k / ArrowUp the one before, Enter plays it, Space pauses, ArrowLeft /
ArrowRight seek 5 s, r plays the recording (not the clip) around the selected event.
"""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>jetpipe review</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;background:#111;color:#ddd}
header{padding:8px 12px;background:#222;display:flex;gap:8px;align-items:center;flex-wrap:wrap}
header input,header select,header button{background:#333;color:#ddd;border:1px solid #555;padding:3px 6px}
main{display:flex;height:calc(100vh - 46px)}
#list{width:38%;overflow-y:auto;border-right:1px solid #333}
#events{list-style:none;margin:0;padding:0}
#events li{display:flex;gap:8px;padding:6px 8px;border-bottom:1px solid #2a2a2a;cursor:pointer}
#events li.on{background:#2d3f5a}
#events img{width:112px;height:63px;object-fit:cover;background:#000}
#view{flex:1;display:flex;flex-direction:column;padding:8px;gap:8px;min-width:0}
video{width:100%;max-height:60vh;background:#000}
.lane{position:relative;height:22px;background:#1c1c1c;margin:2px 0 8px}
.lane .rec{position:absolute;top:4px;height:14px;background:#3a6}
.lane .ev{position:absolute;top:0;width:2px;height:22px;background:#e84}
#more{margin:8px}
.muted{color:#888}
</style></head><body>
<header>
 <b>jetpipe review</b>
 <select id="stream" title="camera"><option value="">every camera</option></select>
 <input id="rule" placeholder="rule" size="8"><input id="type" placeholder="type" size="10">
 <input id="label" placeholder="label" size="8">
 <input id="from" type="datetime-local" step="1" title="from"><input id="to" type="datetime-local" step="1" title="to">
 <button id="apply">show</button>
 <input id="token" type="password" placeholder="token" size="12" style="display:none">
 <span id="status" class="muted"></span>
</header>
<main>
 <div id="list"><ul id="events"></ul><button id="more" style="display:none">older events</button></div>
 <div id="view">
  <video id="player" controls preload="metadata"></video>
  <div id="now" class="muted"></div>
  <div id="timeline"></div>
 </div>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let events = [], selected = -1, nextBefore = null, chain = null;
const token = () => sessionStorage.getItem("jetpipe-token") || "";
function when(t) { return new Date(t * 1000).toLocaleString(); }
async function api(path) {
  const headers = token() ? {"Authorization": "Bearer " + token()} : {};
  const reply = await fetch(path, {headers});
  if (reply.status === 401) {
    $("token").style.display = ""; $("status").textContent = "this server needs its token";
    throw new Error("401");
  }
  if (!reply.ok) throw new Error((await reply.json()).error || reply.status);
  return reply.json();
}
function filters(extra) {
  const q = new URLSearchParams();
  for (const key of ["stream", "rule", "type", "label"]) if ($(key).value) q.set(key, $(key).value);
  for (const key of ["from", "to"]) if ($(key).value) q.set(key, String(new Date($(key).value).getTime() / 1000));
  for (const [k, v] of Object.entries(extra || {})) q.set(k, v);
  return q;
}
function item(event, n) {
  const li = document.createElement("li");
  li.dataset.id = event.id; li.dataset.n = n;
  const img = document.createElement("img");
  if (event.snapshot) img.src = event.snapshot; else img.alt = "no snapshot";
  const text = document.createElement("div");
  text.innerHTML = "<b></b><br><span class=muted></span><br><span class=muted></span>";
  text.children[0].textContent = `${event.type} ${event.rule || ""}`;
  text.children[2].textContent = `camera ${event.stream} · ${event.label || "-"} · track ${event.track_id ?? "-"}`;
  text.children[4].textContent = when(event.time) + (event.clip ? " · clip" : "");
  li.append(img, text);
  li.onclick = () => { select(n); play(false); };
  return li;
}
async function load(more) {
  const q = filters(more && nextBefore !== null ? {before: String(nextBefore)} : {});
  const page = await api("/review/api/events?" + q);
  if (!more) { events = []; $("events").innerHTML = ""; selected = -1; }
  for (const event of page.events) { $("events").append(item(event, events.length)); events.push(event); }
  nextBefore = page.next_before;
  $("more").style.display = nextBefore === null ? "none" : "";
  $("status").textContent = `${events.length} event(s)`;
  await timeline();
}
async function timeline() {
  const box = $("timeline"); box.innerHTML = "";
  const streams = (await api("/review/api/streams")).streams;
  const picked = $("stream").value;
  if ($("stream").options.length === 1)
    for (const s of streams) $("stream").add(new Option(`camera ${s.stream} ${s.source}`, s.stream));
  for (const s of streams) {
    if (picked !== "" && String(s.stream) !== picked) continue;
    const from = $("from").value ? new Date($("from").value).getTime() / 1000 : Math.max(s.first, s.last - 86400);
    const to = $("to").value ? new Date($("to").value).getTime() / 1000 : s.last;
    const span = Math.max(1, to - from);
    const rec = await api(`/review/api/recordings?stream=${s.stream}&from=${from}&to=${to}`);
    const title = document.createElement("div");
    title.className = "muted"; title.textContent = `camera ${s.stream}: ${when(from)} - ${when(to)}`;
    const lane = document.createElement("div");
    lane.className = "lane"; lane.dataset.stream = s.stream;
    for (const seg of rec.segments) {
      const bar = document.createElement("div"); bar.className = "rec";
      bar.style.left = (100 * (Math.max(seg.start, from) - from) / span) + "%";
      bar.style.width = Math.max(0.2, 100 * (Math.min(seg.end, to) - Math.max(seg.start, from)) / span) + "%";
      lane.append(bar);
    }
    for (const event of events.filter((e) => e.stream === s.stream && e.time >= from && e.time <= to)) {
      const tick = document.createElement("div");
      tick.className = "ev"; tick.title = `${event.type} ${when(event.time)}`;
      tick.style.left = (100 * (event.time - from) / span) + "%"; lane.append(tick);
    }
    lane.onclick = (click) => {
      const at = from + span * (click.offsetX / lane.clientWidth);
      playRecording(s.stream, at);
    };
    box.append(title, lane);
  }
}
function select(n) {
  if (n < 0 || n >= events.length) return;
  const items = $("events").children;
  if (selected >= 0 && items[selected]) items[selected].classList.remove("on");
  selected = n; items[n].classList.add("on"); items[n].scrollIntoView({block: "nearest"});
}
function play(recording) {
  const event = events[selected];
  if (!event) return;
  if (event.clip && !recording) {
    chain = null; $("player").src = event.clip; $("player").play();
    $("now").textContent = `clip of ${event.type} at ${when(event.time)}`;
  } else if (event.recording) playRecording(event.stream, event.recording.start + Math.max(0, event.recording.at - 5));
  else $("now").textContent = `nothing recorded of camera ${event.stream} at ${when(event.time)}`;
}
async function playRecording(stream, at) {
  const rec = await api(`/review/api/recordings?stream=${stream}&from=${at}&to=${at + 3600}`);
  const segments = rec.segments;
  if (!segments.length) { $("now").textContent = `nothing recorded of camera ${stream} at ${when(at)}`; return; }
  chain = {segments, index: 0};
  const first = segments[0], player = $("player");
  player.src = first.url;
  player.addEventListener("loadedmetadata", () => {
    player.currentTime = Math.max(0, at - first.start); player.play();
  }, {once: true});
  $("now").textContent = `camera ${stream} from ${when(Math.max(at, first.start))}`;
}
$("player").addEventListener("ended", () => {
  if (!chain || chain.index + 1 >= chain.segments.length) return;
  chain.index += 1; $("player").src = chain.segments[chain.index].url; $("player").play();
});
document.addEventListener("keydown", (key) => {
  if (["INPUT", "SELECT"].includes(document.activeElement.tagName)) return;
  const player = $("player");
  if (key.key === "j" || key.key === "ArrowDown") { select(selected + 1); key.preventDefault(); }
  else if (key.key === "k" || key.key === "ArrowUp") { select(selected - 1); key.preventDefault(); }
  else if (key.key === "Enter") play(false);
  else if (key.key === "r") play(true);
  else if (key.key === " ") { player.paused ? player.play() : player.pause(); key.preventDefault(); }
  else if (key.key === "ArrowLeft") player.currentTime = Math.max(0, player.currentTime - 5);
  else if (key.key === "ArrowRight") player.currentTime += 5;
});
$("apply").onclick = () => load(false).catch((e) => $("status").textContent = e.message);
$("more").onclick = () => load(true).catch((e) => $("status").textContent = e.message);
$("token").onchange = () => {
  sessionStorage.setItem("jetpipe-token", $("token").value); $("token").style.display = "none";
  load(false).catch((e) => $("status").textContent = e.message);
};
load(false).catch((e) => $("status").textContent = e.message);
</script></body></html>
"""
