// The Ticktable web UI: the server's tables, and any of them live in <perspective-viewer>.
//
// The table list polls /api/tables every second. A grid is fed one of two ways (the
// server's default, or ?feed=):
//   perspective: Perspective's Python server holds the table; the viewer opens it over
//                Perspective's websocket protocol (/ws/perspective?table=NAME) and only
//                fetches what it shows.
//   arrow:       /ws/arrow?table=NAME streams the snapshot and every change as Arrow IPC
//                into Perspective's engine in a Web Worker here (the layout of a message
//                is in flight/web/gateway.py).
// Either way a table's row key is Perspective's index (column __row_key, hidden).
// A mirror (a table of another server) comes with its link's status in the list: the list
// and its grid show the table it mirrors, and while it is not in sync a badge in the list
// and a banner over the grid say so (with each poll: gone once it is back in sync).
// Each grid is a <perspective-viewer> titled with its table's name: a datagrid, or a chart
// (Y Bar, Y Line, X/Y Scatter, Heatmap, Treemap... picked in the viewer's settings), fed
// alike. Its info button shows the table's kind, keys, parents, step and schema
// (/api/tables/NAME, then each poll of the list).
// The URL lists the open grids and keeps each one's view: /?t=quotes&t=board (and
// &feed=arrow) then #quotes=CFG&board=CFG, CFG being the viewer's configuration (plugin,
// columns, sort, filter, group_by, split_by, aggregates, expressions...: viewerConfig) as
// base64url JSON, rewritten whenever a viewer reports a change; opening the link opens the
// same tables with the same views. Every request carries the session cookie set by the
// login page; a 401 goes back to it (and the login page back here, hash and all).

import perspective from "./vendor/@perspective-dev/client/dist/cdn/perspective.js";
// <perspective-viewer> with its datagrid and chart plugins (web/build.mjs)
import "./vendor/perspective-viewer/perspective-viewer.js";

const ROW_KEY = "__row_key";
const POLL_MS = 1000;
const params = new URLSearchParams(location.search);
// the parts of viewer.save() that make a view; the table and title are the grid's own
const VIEW_KEYS = ["plugin", "columns", "group_by", "split_by", "sort", "filter", "aggregates",
  "expressions", "group_rollup_mode", "split_rollup_mode", "columns_config", "plugin_config"];
const savedViews = readViews(location.hash);
const grids = new Map(); // name -> Grid
let tables = new Map(); // name -> row of /api/tables
let listed = false; // the list was read at least once
let serverFeed = "perspective";
let serverDown = false;
let worker = null;

const $ = (sel, root = document) => root.querySelector(sel);

function wsUrl(path) {
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${path}`;
}

// <perspective-viewer> defines itself only once its WebAssembly is compiled, after this
// module has run, and perspective.js finds its own engine through that element: before it,
// worker() and websocket() throw "Missing perspective-client.wasm". A grid's first data can
// come sooner (a reload, with everything cached), so both wait for the element.
const viewerDefined = customElements.whenDefined("perspective-viewer");

function getWorker() {
  worker ??= viewerDefined.then(() => perspective.worker());
  return worker;
}

function setUrl() {
  const p = new URLSearchParams();
  const views = new URLSearchParams();
  for (const [name, g] of grids) {
    p.append("t", name);
    if (g.cfg) views.set(name, encodeView(g.cfg));
  }
  if (params.get("feed")) p.set("feed", params.get("feed"));
  const q = p.toString();
  const h = views.toString();
  history.replaceState(null, "", (q ? `/?${q}` : "/") + (h ? `#${h}` : ""));
}

// A view's configuration, without what is empty or not part of the view, as base64url JSON.
function viewerConfig(cfg) {
  const out = {};
  for (const k of VIEW_KEYS) {
    const v = cfg?.[k];
    if (v === undefined || v === null) continue;
    if (Array.isArray(v) ? !v.length : typeof v === "object" && !Object.keys(v).length) continue;
    out[k] = v;
  }
  return out;
}

// The columns a view names that are neither among `columns` nor its own expressions.
function missingColumns(view, columns) {
  const known = new Set([...columns, ...Object.keys(view.expressions ?? {})]);
  const named = [...(view.columns ?? []), ...(view.group_by ?? []), ...(view.split_by ?? []),
    ...(view.sort ?? []).map((s) => s[0]), ...(view.filter ?? []).map((f) => f[0]),
    ...Object.keys(view.aggregates ?? {})];
  return [...new Set(named.filter((c) => typeof c === "string" && !known.has(c)))];
}

function encodeView(cfg) {
  const bytes = new TextEncoder().encode(JSON.stringify(viewerConfig(cfg)));
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

// name -> the view the URL's hash keeps for it; a part that does not decode is left out
// (that table opens as a plain grid) rather than breaking the page.
function readViews(hash) {
  const out = new Map();
  for (const [name, enc] of new URLSearchParams(hash.replace(/^#/, ""))) {
    try {
      const bin = atob(enc.replaceAll("-", "+").replaceAll("_", "/"));
      const cfg = JSON.parse(new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0))));
      if (cfg && typeof cfg === "object" && !Array.isArray(cfg)) out.set(name, viewerConfig(cfg));
    } catch (e) {
      console.warn(`the URL's view of ${name} does not decode: ${e}`);
    }
  }
  return out;
}

function setState(el, state, text) {
  el.className = `state ${state}`;
  el.textContent = text ?? state;
}

// ----------------------------------------------------------------------- the list
async function refresh() {
  let res;
  try {
    res = await fetch("/api/tables", {cache: "no-store"});
  } catch (e) {
    setState($("#connection"), "reconnecting", "server unreachable: retrying");
    serverDown = true;
    for (const g of grids.values()) g.serverGone();
    return;
  }
  if (res.status === 401) {
    location.replace(`/login`);
    return;
  }
  if (!res.ok) {
    setState($("#connection"), "error", `server answered ${res.status}`);
    return;
  }
  const body = await res.json();
  serverFeed = body.feed;
  $("#feed").textContent = `feed: ${params.get("feed") || serverFeed} · step ${body.step}`;
  setState($("#connection"), "live", "connected");
  tables = new Map(body.tables.map((t) => [t.name, t]));
  listed = true;
  if (serverDown) { // back (perhaps restarted): every grid connects again
    serverDown = false;
    for (const g of grids.values()) g.lost("the server was unreachable");
  }
  renderList(body.tables);
  for (const g of grids.values()) g.listed(tables.get(g.name));
}

// A mirror's link (row.link of /api/tables) while it is not in sync: a badge saying so with
// its state, why (the last error) in its tooltip.
function notInSync(link) {
  const badge = document.createElement("span");
  badge.className = "badge not-in-sync";
  badge.textContent = `not in sync: ${link.state}`;
  badge.title = `${link.origin}: ${link.state}${link.detail ? ` (${link.detail})` : ""}; ` +
    `out of sync for ${outFor(link)}, ${link.reconnects} reconnects`;
  return badge;
}

function outFor(link) {
  const s = Math.round(link.out_of_sync_seconds);
  return s < 120 ? `${s} s` : `${Math.round(s / 60)} min`;
}

function renderList(rows) {
  const tbody = $("#tables tbody");
  const out = rows.map((t) => {
    const tr = document.createElement("tr");
    tr.dataset.table = t.name;
    if (grids.has(t.name)) tr.classList.add("open");
    if (t.link) tr.dataset.link = t.link.in_sync ? "in-sync" : "not-in-sync";
    const cells = [t.name, t.kind, t.rows.toLocaleString("en-US"),
                   String(t.subscribers), String(t.last_step), t.state];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i >= 2 && i <= 4) td.className = "num";
      if (i === 5) td.title = t.error || "";
      if (i === 0 && t.link && !t.link.in_sync) td.append(" ", notInSync(t.link));
      if (i === 1 && t.link) { // a mirror: of which table, on which server
        const origin = document.createElement("span");
        origin.className = "origin";
        origin.textContent = `of ${t.link.origin}`;
        td.append(" ", origin);
        td.title = `a mirror of ${t.link.origin}`;
      }
      tr.append(td);
    });
    tr.addEventListener("click", () => openGrid(t.name));
    return tr;
  });
  tbody.replaceChildren(...out);
}

// Open table `name` (or show it if it is open), as the view `view` if given (a
// viewerConfig: {plugin: "Y Bar", group_by: [...], ...}), else as a datagrid of its columns.
function openGrid(name, view = null) {
  if (!grids.has(name)) {
    const g = new Grid(name, params.get("feed") || serverFeed, view);
    grids.set(name, g);
    setUrl();
    g.start();
  }
  grids.get(name).el.scrollIntoView({behavior: "smooth", inline: "nearest"});
}

// ----------------------------------------------------------------------- a grid
class Grid {
  constructor(name, feed, view = null) {
    this.name = name;
    this.feed = feed;
    this.cfg = view; // the view as last reported by the viewer (or asked for)
    this.el = document.createElement("section");
    this.el.className = "grid";
    this.el.dataset.table = name;
    this.el.innerHTML = `<header><span class="name"></span><span class="state"></span>
      <span class="rows"></span><span class="feed"></span><span class="origin"></span>
      <button class="info-toggle" title="the table's kind, keys, parents, step and schema"
        aria-expanded="false">info</button>
      <button class="close" title="close">×</button></header>
      <div class="banner not-in-sync" role="status" hidden><div class="what"></div>
        <div class="detail"></div></div>
      <div class="note" role="status" hidden></div>
      <div class="info" hidden></div>
      <perspective-viewer></perspective-viewer>`;
    $(".name", this.el).textContent = name;
    $(".feed", this.el).textContent = feed;
    $(".close", this.el).addEventListener("click", () => this.close());
    $(".info-toggle", this.el).addEventListener("click", () => this.toggleInfo());
    this.viewer = $("perspective-viewer", this.el);
    this.watch(this.viewer);
    this.table = null;
    this.client = null;
    this.ws = null;
    this.closed = false;
    this.attempt = 0;
    this.retryTimer = null;
    this.configured = false;
    this.stopped = null; // "failed" / "dropped": the table stopped updating
    this.showLink(tables.get(name)?.link, tables.get(name)?.pending);
    $("#grids").append(this.el);
  }

  newViewer() {
    const v = document.createElement("perspective-viewer");
    this.watch(v);
    return v;
  }

  // The viewer says its configuration changed (the event carries none): read it, keep it
  // (a new viewer after a lost connection starts from it) and put it in the URL. One read
  // at a time, in order, so the last change is the one kept.
  watch(viewer) {
    let chain = Promise.resolve();
    viewer.addEventListener("perspective-config-update", () => {
      chain = chain.then(async () => {
        if (viewer !== this.viewer || !this.configured || this.closed) return;
        const cfg = viewerConfig(await viewer.save());
        if (viewer !== this.viewer || this.closed) return;
        this.cfg = cfg;
        setUrl();
      }).catch((e) => console.warn(`could not read the view of ${this.name}: ${e}`));
    });
  }

  // ----------------------------------------------------------------- the info panel
  async toggleInfo() {
    const panel = $(".info", this.el);
    const button = $(".info-toggle", this.el);
    if (!panel.hidden) {
      panel.hidden = true;
      button.setAttribute("aria-expanded", "false");
      return;
    }
    panel.hidden = false;
    button.setAttribute("aria-expanded", "true");
    panel.textContent = "loading…";
    let row;
    try {
      const res = await fetch(`/api/tables/${encodeURIComponent(this.name)}`, {cache: "no-store"});
      if (res.status === 401) { location.replace("/login"); return; }
      const body = await res.json();
      if (!res.ok) { panel.textContent = body.error || `server answered ${res.status}`; return; }
      row = body.table;
    } catch (e) {
      panel.textContent = `server unreachable: ${e.message || e}`;
      return;
    }
    this.showInfo(row);
  }

  // The table's kind, keys, parents, rows, step and schema, from the server's row for it.
  showInfo(row) {
    const panel = $(".info", this.el);
    if (panel.hidden) return;
    if (!row) {
      panel.textContent = `The server has no table named "${this.name}" now.`;
      return;
    }
    const dl = document.createElement("dl");
    const item = (key, ...value) => {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.dataset.key = key;
      dd.append(...value);
      dl.append(dt, dd);
    };
    item("kind", row.kind);
    item("keys", row.keys.length ? row.keys.join(", ") : "none (rows are appended)");
    const parents = row.parents.map((p, i) => {
      const a = document.createElement("a");
      a.href = "#";
      a.textContent = p;
      a.title = `open ${p}`;
      a.addEventListener("click", (ev) => { ev.preventDefault(); openGrid(p); });
      return i ? [", ", a] : [a];
    }).flat();
    item("parents", ...(parents.length ? parents : ["none (a source)"]));
    item("rows", row.rows.toLocaleString("en-US"));
    item("last step", String(row.last_step));
    item("state", row.error || row.state);
    const schema = document.createElement("table");
    schema.className = "schema";
    schema.innerHTML = "<thead><tr><th>column</th><th>type</th></tr></thead><tbody></tbody>";
    for (const [name, type] of row.schema) {
      const tr = document.createElement("tr");
      for (const text of [name, type]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.append(td);
      }
      $("tbody", schema).append(tr);
    }
    panel.replaceChildren(dl, schema);
  }

  // Under the header, `text` (why the saved view was not applied, say); none if empty.
  note(text) {
    const el = $(".note", this.el);
    el.textContent = text;
    el.hidden = !text;
  }

  state(state, text) {
    setState($(".state", this.el), state, text);
  }

  async start() {
    if (listed && !tables.has(this.name)) {
      this.unknown();
      return;
    }
    if (tables.get(this.name)?.pending) {
      this.waiting(tables.get(this.name));
      return;
    }
    this.state(this.attempt ? "reconnecting" : "connecting");
    try {
      if (this.feed === "arrow") await this.connectArrow();
      else await this.connectPerspective();
    } catch (e) {
      this.lost(String(e && e.message || e));
    }
  }

  unknown() {
    const have = [...tables.keys()].join(", ") || "none";
    this.state("unknown", "unknown table");
    this.message(`This server has no table named "${this.name}" (tables: ${have}).`);
  }

  // A mirror whose origin has not answered yet: no table (no columns) until it does.
  waiting(row) {
    this.state("waiting", row.state);
    this.message(`Mirror "${this.name}" has no rows yet: ${row.link.origin} has not answered ` +
                 `(${row.link.state}).`);
  }

  // Instead of the grid, `text`, until the table exists (listed() then connects).
  message(text) {
    this.isUnknown = true;
    let msg = $(".message", this.el);
    if (!msg) {
      msg = document.createElement("div");
      msg.className = "message";
      this.viewer.before(msg);
    }
    msg.textContent = text;
    this.viewer.hidden = true;
  }

  // A mirror's link, from the server's list: which table it mirrors, and a banner over the
  // grid while it is not in sync (the rows shown are the last it received), gone once it is.
  showLink(link, pending = false) {
    $(".origin", this.el).textContent = link ? `mirror of ${link.origin}` : "";
    const banner = $(".banner", this.el);
    if (!link || link.in_sync) {
      banner.hidden = true;
      return;
    }
    $(".what", banner).textContent = `Not in sync with ${link.origin}: ${link.state}, ` +
      `for ${outFor(link)} (${link.reconnects} reconnects)` +
      `${pending ? "." : "; the rows shown are the last received."}`;
    const detail = $(".detail", banner);
    detail.textContent = link.detail;
    detail.title = link.detail;
    banner.hidden = false;
  }

  // The server's list says how the table is: failed, dropped, or its row count.
  listed(row) {
    if (this.closed) return;
    this.showInfo(row);
    if (row) this.showLink(row.link, row.pending);
    if (!row) {
      if (this.table || this.stopped) {
        this.stopped = "dropped";
        this.state("dropped", "dropped: the last rows are shown");
      } else if (!this.retryTimer) {
        this.unknown();
      }
      return;
    }
    if (row.pending) { // a mirror not yet a table: connect once it is
      if (!this.table) this.waiting(row);
      return;
    }
    if (this.isUnknown || (this.stopped === "dropped" && !this.retryTimer)) {
      // it exists (again): created, created anew after a drop, or back after a restart
      // whose list came before the table did
      this.isUnknown = false;
      this.stopped = null;
      $(".message", this.el)?.remove();
      this.viewer.hidden = false;
      this.disconnect();
      this.start();
      return;
    }
    if (row.state === "failed") {
      this.stopped = "failed";
      this.state("failed", row.error || "failed");
    }
    this.showSize();
  }

  async showSize() {
    if (!this.table) return;
    try {
      const n = await this.table.size();
      $(".rows", this.el).textContent = `${n.toLocaleString("en-US")} rows`;
      $(".rows", this.el).dataset.rows = String(n);
    } catch (e) { /* the table is being replaced */ }
  }

  // Show `table` (named `tableName` on `client`), keeping the viewer's settings.
  async show(client, table, tableName) {
    if (this.configured) {
      // a viewer whose connection broke stays errored: a new one takes its place, with the
      // settings (sort, filters, columns...) the old one last reported
      const old = this.viewer;
      this.viewer = this.newViewer();
      old.replaceWith(this.viewer);
      old.delete?.().catch?.(() => {});
      await this.viewer.load(client);
      await this.viewer.restore({...viewerConfig(this.cfg), table: tableName, title: this.name});
    } else {
      await this.viewer.load(client);
      const columns = (await table.columns()).filter((c) => c !== ROW_KEY);
      const grid = {plugin: "Datagrid", columns, table: tableName, title: this.name};
      const missing = this.cfg ? missingColumns(this.cfg, columns) : [];
      if (missing.length) { // the view the URL kept no longer fits the table
        this.note(`The saved view no longer applies (the table has no column ` +
                  `${missing.map((c) => `"${c}"`).join(", ")}): showing its columns.`);
        this.cfg = null;
      }
      try {
        await this.viewer.restore(this.cfg ? {...grid, ...this.cfg, table: tableName,
                                              title: this.name} : grid);
      } catch (e) {
        if (!this.cfg) throw e;
        // the viewer refused it (and is errored, its connection closed): the next attempt
        // shows the table's columns in a new viewer
        this.note(`The saved view no longer applies (${e.message || e}): showing its columns.`);
        this.cfg = null;
        const old = this.viewer;
        this.viewer = this.newViewer();
        old.replaceWith(this.viewer);
        old.delete?.().catch?.(() => {});
        throw e;
      }
      this.cfg = viewerConfig(await this.viewer.save());
      this.configured = true;
      setUrl();
    }
    this.table = table;
    this.attempt = 0;
    if (!this.stopped) this.state("live");
    this.showSize();
  }

  async connectPerspective() {
    await viewerDefined;
    const client = await perspective.websocket(wsUrl(`/ws/perspective?table=${encodeURIComponent(this.name)}`));
    this.client = client;
    client.on_error((err) => {
      if (this.client === client) this.lost(String(err));
    });
    const table = await client.open_table(this.name);
    await this.show(client, table, this.name);
    // the remote table changes under the viewer; keep the row count current
    this.view = await table.view({columns: []});
    this.view.on_update(() => this.showSize());
  }

  connectArrow() {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(wsUrl(`/ws/arrow?table=${encodeURIComponent(this.name)}`));
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let chain = Promise.resolve();
      let opened = false;
      ws.onmessage = (ev) => {
        chain = chain.then(() => this.applyArrow(ev.data)).then(() => {
          // applied: the server may send another (it composes updates meanwhile)
          if (typeof ev.data !== "string" && ws.readyState === WebSocket.OPEN) ws.send("ack");
          if (!opened) { opened = true; resolve(); }
        }, (e) => { console.error(e); ws.close(); });
      };
      ws.onclose = (ev) => {
        if (this.ws !== ws || this.closed) return;
        if (ev.code === 4404) { this.unknown(); return; }
        if (this.stopped) return;
        if (!opened) reject(new Error(`closed ${ev.code} ${ev.reason}`));
        else this.lost(`closed ${ev.code} ${ev.reason}`);
      };
    });
  }

  async applyArrow(data) {
    if (typeof data === "string") { // the table stopped: {"state", "error"}
      const msg = JSON.parse(data);
      this.stopped = msg.state;
      this.state(msg.state, msg.state === "dropped" ? "dropped: the last rows are shown" : msg.error);
      return;
    }
    const dv = new DataView(data);
    const n = dv.getUint32(0, true);
    const header = JSON.parse(new TextDecoder().decode(new Uint8Array(data, 4, n)));
    let off = 4 + n;
    off += (8 - (off % 8)) % 8;
    const removes = new Float64Array(data, off, header.removes);
    off += 8 * header.removes;
    const ipc = data.slice(off);
    if (header.snapshot) {
      if (this.table && this.arrowTable) {
        await this.arrowTable.replace(ipc);
        this.attempt = 0;
        if (!this.stopped) this.state("live");
      } else {
        const w = await getWorker();
        const tableName = `${this.name}#${crypto.randomUUID()}`;
        this.arrowTable = await w.table(ipc, {index: ROW_KEY, name: tableName});
        await this.show(w, this.arrowTable, tableName);
        this.view = await this.arrowTable.view({columns: []});
        this.view.on_update(() => this.showSize());
      }
    } else {
      if (header.removes) await this.arrowTable.remove(Array.from(removes));
      if (header.rows) await this.arrowTable.update(ipc);
    }
    this.step = header.step;
  }

  // The connection broke (a server restart, a network cut): retry, backing off.
  lost(why) {
    if (this.closed || this.retryTimer) return;
    if (/4404/.test(why)) { this.unknown(); return; }
    this.attempt += 1;
    const wait = Math.min(5000, 250 * 2 ** Math.min(this.attempt, 5));
    this.state("reconnecting", `reconnecting (${why})`);
    this.disconnect();
    this.retryTimer = setTimeout(() => { this.retryTimer = null; this.start(); }, wait);
  }

  serverGone() {
    if (this.feed === "arrow" && this.ws && this.ws.readyState <= 1) return; // it will notice
    if (this.table && !this.retryTimer && !this.stopped) this.state("reconnecting", "server unreachable");
  }

  disconnect() {
    if (this.view) { this.view.delete().catch(() => {}); this.view = null; }
    if (this.ws) { const ws = this.ws; this.ws = null; ws.close(); }
    if (this.client) { const c = this.client; this.client = null; try { c.terminate(); } catch (e) { /* gone */ } }
  }

  close() {
    this.closed = true;
    clearTimeout(this.retryTimer);
    this.disconnect();
    this.viewer.delete?.();
    this.el.remove();
    grids.delete(this.name);
    setUrl();
    renderList([...tables.values()]);
  }
}

// ----------------------------------------------------------------------- start
window.ticktable = {grids, openGrid, refresh};
$("#logout").addEventListener("click", async () => {
  await fetch("/api/logout", {method: "POST"});
  location.replace("/login");
});
await refresh();
fetch("/api/login", {method: "POST", body: "{}"}).then((r) => { $("#logout").hidden = r.status === 204; });
for (const name of params.getAll("t")) openGrid(name, savedViews.get(name) ?? null);
// a link pasted over this one that differs only after the "#" loads no page by itself
// (history.replaceState above never fires this)
window.addEventListener("hashchange", () => location.reload());
setInterval(refresh, POLL_MS);
