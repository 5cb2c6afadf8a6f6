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
// The URL lists the open grids: /?t=quotes&t=board (and &feed=arrow). Every request
// carries the session cookie set by the login page; a 401 goes back to it.

import perspective from "./vendor/@perspective-dev/client/dist/cdn/perspective.js";
// <perspective-viewer> with its datagrid and chart plugins (web/build.mjs)
import "./vendor/perspective-viewer/perspective-viewer.js";

const ROW_KEY = "__row_key";
const POLL_MS = 1000;
const params = new URLSearchParams(location.search);
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

function getWorker() {
  worker ??= perspective.worker();
  return worker;
}

function setUrl() {
  const p = new URLSearchParams();
  for (const name of grids.keys()) p.append("t", name);
  if (params.get("feed")) p.set("feed", params.get("feed"));
  const q = p.toString();
  history.replaceState(null, "", q ? `/?${q}` : "/");
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

function openGrid(name) {
  if (!grids.has(name)) {
    const g = new Grid(name, params.get("feed") || serverFeed);
    grids.set(name, g);
    setUrl();
    g.start();
  }
  grids.get(name).el.scrollIntoView({behavior: "smooth", inline: "nearest"});
}

// ----------------------------------------------------------------------- a grid
class Grid {
  constructor(name, feed) {
    this.name = name;
    this.feed = feed;
    this.el = document.createElement("section");
    this.el.className = "grid";
    this.el.dataset.table = name;
    this.el.innerHTML = `<header><span class="name"></span><span class="state"></span>
      <span class="rows"></span><span class="feed"></span><span class="origin"></span>
      <button class="close" title="close">×</button></header>
      <div class="banner not-in-sync" role="status" hidden><div class="what"></div>
        <div class="detail"></div></div>
      <perspective-viewer></perspective-viewer>`;
    $(".name", this.el).textContent = name;
    $(".feed", this.el).textContent = feed;
    $(".close", this.el).addEventListener("click", () => this.close());
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

  watch(viewer) {
    viewer.addEventListener("perspective-config-update", (ev) => {
      if (viewer === this.viewer && ev.detail) {
        this.cfg = JSON.parse(JSON.stringify({...this.cfg, ...ev.detail})); // data only
      }
    });
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
      await this.viewer.restore({...this.cfg, table: tableName});
    } else {
      await this.viewer.load(client);
      const columns = (await table.columns()).filter((c) => c !== ROW_KEY);
      await this.viewer.restore({table: tableName, plugin: "Datagrid", columns});
      this.cfg = await this.viewer.save();
      this.configured = true;
    }
    this.table = table;
    this.attempt = 0;
    if (!this.stopped) this.state("live");
    this.showSize();
  }

  async connectPerspective() {
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
for (const name of params.getAll("t")) openGrid(name);
setInterval(refresh, POLL_MS);
