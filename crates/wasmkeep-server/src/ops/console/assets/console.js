// The wasmkeep console (ADR 0067): reads the node's JSON API under
// /_wasmkeep/console/api/ and draws one page per location hash. Data is
// only ever put in the page as text (never as HTML).
"use strict";

const API = "/_wasmkeep/console/api/";
const TOKEN_KEY = "wasmkeep-console-token";
// The moves-and-drains page follows progress while it is shown.
const OPERATIONS_REFRESH_MS = 2000;
let refreshTimer = null;

class Unauthorized extends Error {}

async function api(call, params) {
  const query = new URLSearchParams(params || {}).toString();
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = "Bearer " + token;
  const response = await fetch(API + call + (query ? "?" + query : ""), { headers });
  const body = await response.json().catch(() => ({}));
  if (response.status === 401) throw new Unauthorized(body.error || "unauthorized");
  if (!response.ok) throw new Error(body.error || response.status + " " + response.statusText);
  return body;
}

// --- building the page (text only)

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    } else {
      node.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// columns: [{ label, value: row => text or node, num }]
function table(id, caption, columns, rows) {
  if (rows.length === 0) return el("p", { id, class: "empty" }, caption + ": none.");
  return el("table", { id },
    el("caption", {}, caption),
    el("thead", {}, el("tr", {}, columns.map(c => el("th", { scope: "col", class: c.num ? "num" : null }, c.label)))),
    el("tbody", {}, rows.map(row => el("tr", {},
      columns.map(c => el("td", { class: c.num ? "num" : null }, c.value(row)))))));
}

function sqlTable(id, caption, result) {
  const columns = result.columns.map((name, i) => ({ label: name, value: row => cell(row[i]) }));
  return table(id, caption, columns, result.rows);
}

function cell(value) {
  if (value === null) return el("code", {}, "NULL");
  if (typeof value === "object" && value.hex !== undefined) return el("code", {}, "x'" + value.hex + "'");
  return String(value);
}

function status(text, bad) {
  const line = document.getElementById("status");
  line.textContent = text || "";
  line.className = bad ? "bad" : "";
}

function show(...nodes) {
  const page = document.getElementById("page");
  page.replaceChildren(...nodes);
}

function actorLink(id, params) {
  const query = new URLSearchParams(Object.assign({ id }, params || {}));
  return el("a", { href: "#/actor?" + query }, id);
}

// "1 actor", "2 actors".
function count(n, one, many) {
  return n + " " + (n === 1 ? one : many);
}

function when(ms) {
  return ms === null || ms === undefined ? "-" : new Date(ms).toISOString();
}

// --- pages

async function nodesPage() {
  const { nodes } = await api("nodes");
  show(el("h2", {}, "Nodes"), table("nodes-table", count(nodes.length, "node", "nodes") + " with a heartbeat", [
    { label: "Node", value: n => n.node },
    { label: "Address", value: n => n.address },
    { label: "State", value: n => n.stale ? n.state + " (stale)" : n.state },
    { label: "Drain", value: n => n.drain_requested && n.drain === "none" ? "requested" : n.drain },
    { label: "Resident actors", value: n => n.resident_actors, num: true },
    { label: "Heartbeat age", value: n => n.heartbeat_age_s.toFixed(1) + " s", num: true },
    { label: "Capabilities", value: n => n.capabilities.join(" ") || "-" },
  ], nodes));
}

async function classesPage() {
  const { classes } = await api("classes");
  show(el("h2", {}, "Classes"), table("classes-table", count(classes.length, "deployed class", "deployed classes"), [
    { label: "Class", value: c => c.class },
    { label: "Version", value: c => c.digest ? el("code", { title: c.digest }, c.digest.slice(0, 12)) : "unreadable: " + c.error },
    { label: "Database maximum", value: c => c.database_bytes_max ?? "-", num: true },
    { label: "Outbound allowed", value: c => c.allow_outbound.join(" ") || "(nothing)" },
  ], classes));
}

async function actorsPage(params) {
  const prefix = params.get("prefix") || "";
  const after = params.get("after") || "";
  const input = el("input", { id: "search-prefix", name: "prefix", type: "search", value: prefix, placeholder: "tenant/class/", autocomplete: "off" });
  const form = el("form", { role: "search", on: { submit: event => {
    event.preventDefault();
    location.hash = "#/actors?" + new URLSearchParams({ prefix: input.value });
  } } },
    el("label", { for: "search-prefix" }, "Actor id starts with", input),
    el("button", { id: "search-button", type: "submit" }, "Search"));
  const { actors, next } = await api("actors", { prefix, after });
  const pager = el("p", { class: "pager" },
    after ? el("a", { href: "#/actors?" + new URLSearchParams({ prefix }) }, "First page") : null,
    next ? el("a", { id: "actors-next", href: "#/actors?" + new URLSearchParams({ prefix, after: next }) }, "Next page") : null);
  show(el("h2", {}, "Actors"), form, table("actors-table",
    count(actors.length, "actor", "actors") + (next ? " and more" : "") + (prefix ? " starting with " + prefix : ""), [
      { label: "Actor", value: a => actorLink(a.actor) },
      { label: "Owner", value: a => a.owner ? a.owner + (a.hold_valid ? "" : " (expired)") : "-" },
      { label: "Alarm", value: a => when(a.alarm_ms) },
      { label: "Data bytes", value: a => a.database_bytes, num: true },
      { label: "Log records", value: a => a.log_records, num: true },
    ], actors), pager);
  if (document.activeElement === document.body) input.focus();
}

async function actorPage(params) {
  const id = params.get("id");
  if (!id) throw new Error("no actor named: #/actor?id=TENANT/CLASS/NAME");
  const detail = await api("actor", { id });
  const a = detail.actor;
  const parts = [
    el("h2", {}, "Actor ", el("code", {}, id)),
    el("dl", { id: "actor-detail" },
      el("dt", {}, "Owner"), el("dd", {}, a.owner ? a.owner + (a.hold_valid ? "" : " (hold expired)") : "nobody (hibernated)"),
      el("dt", {}, "Alarm"), el("dd", {}, when(a.alarm_ms)),
      el("dt", {}, "Sockets"), el("dd", {}, detail.resident_here ? String(detail.sockets) : "known on the node that holds it"),
      el("dt", {}, "Data in the bucket"), el("dd", {}, a.database_bytes + " bytes in " + a.log_records + " log records and " + a.snapshots + " snapshots"),
      el("dt", {}, "Last write"), el("dd", {}, a.last_write_unix_s ? new Date(a.last_write_unix_s * 1000).toISOString() : "-")),
    table("tables-table", "Tables", [
      { label: "Table", value: t => el("a", { href: "#/actor?" + new URLSearchParams({ id, table: t.name }) }, t.name) },
      { label: "Kind", value: t => t.type },
      { label: "Rows", value: t => t.rows ?? "-", num: true },
    ], detail.tables),
  ];
  const tableName = params.get("table");
  if (tableName) {
    const offset = Number(params.get("offset") || 0);
    const page = await api("rows", { id, table: tableName, offset, limit: 50 });
    const at = o => "#/actor?" + new URLSearchParams({ id, table: tableName, offset: o });
    parts.push(el("h2", {}, "Rows of ", el("code", {}, tableName)),
      sqlTable("rows-table", "rows " + (offset + 1) + " to " + (offset + page.rows.length), page),
      el("p", { class: "pager" },
        offset > 0 ? el("a", { href: at(Math.max(0, offset - 50)) }, "Previous rows") : null,
        page.next_offset !== null ? el("a", { id: "rows-next", href: at(page.next_offset) }, "Next rows") : null));
  }
  const input = el("textarea", { id: "sql-input", name: "q", spellcheck: "false" }, params.get("q") || "");
  const result = el("div", { id: "sql-result", "aria-live": "polite" });
  const run = async event => {
    event.preventDefault();
    result.replaceChildren(el("p", { class: "empty" }, "Running…"));
    try {
      const rows = await api("sql", { id, q: input.value });
      result.replaceChildren(sqlTable("sql-table", count(rows.rows.length, "row", "rows"), rows));
    } catch (e) {
      result.replaceChildren(el("p", { id: "sql-error", class: "empty", role: "alert" }, String(e.message)));
    }
  };
  parts.push(el("h2", {}, "Read-only SQL"),
    el("form", { on: { submit: run } },
      el("label", { for: "sql-input" }, "One statement that reads (runs on the state the bucket holds)", input),
      el("button", { id: "sql-run", type: "submit" }, "Run")),
    result);
  show(...parts);
}

async function operationsPage() {
  const { drains, moves, deletes, imports } = await api("operations");
  show(el("h2", {}, "Moves and drains in progress"),
    table("drains-table", "Drains", [
      { label: "Node", value: d => d.node },
      { label: "State", value: d => d.requested && d.state === "none" ? "requested" : d.state },
      { label: "Resident actors", value: d => d.resident_actors, num: true },
      { label: "Sockets closing", value: d => d.sockets_closing, num: true },
      { label: "Failed releases", value: d => d.releases_failed, num: true },
    ], drains),
    table("moves-table", "Moves", [
      { label: "Actor", value: m => actorLink(m.actor) },
      { label: "To", value: m => m.target },
      { label: "Held by", value: m => m.holder || "-" },
      { label: "Progress", value: m => m.progress },
    ], moves),
    table("deletes-table", "Deletes", [
      { label: "Actor", value: d => d.actor },
      { label: "Request", value: d => el("code", {}, d.key) },
    ], deletes),
    table("imports-table", "Imports", [
      { label: "Actor", value: i => actorLink(i.actor) },
      { label: "Request", value: i => el("code", {}, i.key) },
      { label: "Bytes", value: i => i.bytes, num: true },
    ], imports),
    el("p", { class: "empty" }, "Refreshed every " + OPERATIONS_REFRESH_MS / 1000 + " s; last at " + new Date().toISOString()));
  refreshTimer = setTimeout(route, OPERATIONS_REFRESH_MS);
}

function signInPage(message) {
  const input = el("input", { id: "token-input", name: "token", type: "password", autocomplete: "current-password" });
  show(el("h2", {}, "Sign in"),
    el("form", { on: { submit: event => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      route();
    } } },
      el("label", { for: "token-input" }, "Operator token (--console-token-file)", input),
      el("button", { id: "token-submit", type: "submit" }, "Sign in")));
  status(message, true);
  input.focus();
}

const PAGES = { nodes: nodesPage, classes: classesPage, actors: actorsPage, actor: actorPage, operations: operationsPage };

async function route() {
  clearTimeout(refreshTimer);
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, query] = hash.split("?");
  const page = PAGES[name] ? name : "nodes";
  for (const link of document.querySelectorAll("nav a")) {
    const current = link.dataset.page === page || (page === "actor" && link.dataset.page === "actors");
    if (current) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  status("Loading…");
  try {
    const session = await api("session");
    document.getElementById("where").textContent = "app " + session.app + " · node " + session.node;
    await PAGES[page](new URLSearchParams(query || ""));
    status("");
  } catch (e) {
    if (e instanceof Unauthorized) {
      const hadToken = sessionStorage.getItem(TOKEN_KEY) !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      signInPage(hadToken ? "That token was refused." : "This console asks for its operator token.");
    } else {
      status(e.message, true);
    }
  }
}

window.addEventListener("hashchange", route);
route();
