/* aenv console: the API key (kept in this tab's session storage), htmx wiring, the buttons
   (they call the REST routes, with the same key, as the SDK does), the TTL countdown, the
   terminal (xterm.js over a WebSocket) and streamed build logs. No framework, no build. */
(function () {
  "use strict";
  const KEY = "aenv.apiKey";
  const key = () => sessionStorage.getItem(KEY);
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  function esc(text) {
    const d = document.createElement("div");
    d.textContent = String(text);
    return d.innerHTML;
  }

  let flashTimer = null;
  function flash(html, tone) {
    const el = $("#flash");
    el.innerHTML = html;
    el.className = "flash " + (tone || "ok");
    el.hidden = false;
    clearTimeout(flashTimer);
    flashTimer = setTimeout(() => { el.hidden = true; }, tone === "bad" ? 12000 : 6000);
  }

  async function errorText(resp) {
    try {
      const body = await resp.json();
      return body.message || resp.statusText;
    } catch (e) {
      return resp.status + " " + resp.statusText;
    }
  }

  /* --- the key ---------------------------------------------------------------------- */

  function showLogin(message) {
    $("#main").hidden = true;
    $("#who").hidden = true;
    $("#login").hidden = false;
    $("#login-error").textContent = message || "";
    $("#key").focus();
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    showLogin(message);
  }

  async function whoami(k) {
    const r = await fetch("/console/f/whoami", { headers: { "X-API-KEY": k } });
    if (!r.ok) throw new Error(await errorText(r));
    return r.json();
  }

  async function start() {
    const k = key();
    if (!k) { showLogin(""); return; }
    let who;
    try {
      who = await whoami(k);
    } catch (e) {
      signOut(e.message);
      return;
    }
    $("#login").hidden = true;
    $("#who-team").textContent = who.team;
    $("#who").hidden = false;
    $("#main").hidden = false;
    prefillFilters();
    htmx.trigger(document.body, "aenv:ready");
    startTerminal();
    startBuildLog();
  }

  document.addEventListener("submit", async (e) => {
    if (e.target.id === "filters") { e.preventDefault(); return; } // they apply as typed
    if (e.target.id !== "login-form") return;
    e.preventDefault();
    const input = $("#key");
    const k = input.value.trim();
    try {
      await whoami(k);
    } catch (err) {
      $("#login-error").textContent = err.message;
      return;
    }
    sessionStorage.setItem(KEY, k);
    input.value = "";
    start();
  });

  document.addEventListener("click", (e) => {
    if (e.target.id === "signout") signOut("");
  });

  /* --- htmx: every fragment request carries the key ---------------------------------- */

  document.addEventListener("htmx:configRequest", (e) => {
    if (!key()) { e.preventDefault(); return; } // signed out: the polls wait for a key
    e.detail.headers["X-API-KEY"] = key();
  });

  document.addEventListener("htmx:responseError", async (e) => {
    const xhr = e.detail.xhr;
    if (xhr.status === 401) { signOut("The API refused the key: sign in again."); return; }
    let message = xhr.statusText;
    try { message = JSON.parse(xhr.responseText).message || message; } catch (err) { /* */ }
    const target = e.detail.target;
    if (target.id === "history") { target.innerHTML = ""; return; } // the header says why
    if (target.id === "sandbox" && $("#actions")) $("#actions").hidden = true;
    target.innerHTML =
      '<div class="error-box" data-code="' + xhr.status + '">' + esc(message) + "</div>";
  });

  document.addEventListener("htmx:sendError", () => {
    flash("The API did not answer; retrying.", "bad");
  });

  let revision = null;
  document.addEventListener("htmx:afterSwap", (e) => {
    if (e.detail.target.id === "sandbox") {
      const head = $(".head", e.detail.target);
      if (!head) return;
      enableActions(head.dataset.status);
      $("#actions").hidden = false;
      if (head.dataset.revision !== revision) {
        const first = revision === null;
        revision = head.dataset.revision;
        if (!first) htmx.trigger(document.body, "aenv:changed");
      }
    }
    tick();
  });

  /* --- buttons: the REST routes themselves ------------------------------------------- */

  function enableActions(status) {
    $$("#actions [data-when]").forEach((el) => {
      const on = el.dataset.when.split(" ").includes(status);
      el.classList.toggle("disabled", !on);
      if (el.tagName === "BUTTON") el.disabled = !on;
    });
  }

  async function call(method, url, body) {
    const init = { method, headers: { "X-API-KEY": key() || "" } };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(url, init);
    if (r.status === 401) { signOut("The API refused the key: sign in again."); throw new Error("unauthorized"); }
    if (!r.ok) throw new Error(await errorText(r));
    return r.status === 204 ? null : r.json();
  }

  const ACTIONS = {
    pause: (sid) => call("POST", `/sandboxes/${sid}/pause`, {}).then(() => "Paused."),
    resume: (sid) => call("POST", `/sandboxes/${sid}/resume`, {}).then(() => "Resumed."),
    kill: (sid) => call("DELETE", `/sandboxes/${sid}`).then(() => "Killed."),
    fork: async (sid) => {
      const count = parseInt($("#fork-count").value, 10) || 1;
      const out = await call("POST", `/sandboxes/${sid}/fork`, { count });
      const links = out.map((c) => c.sandbox
        ? `<a class="mono" href="/console/sandboxes/${esc(c.sandbox.sandboxID)}">${esc(c.sandbox.sandboxID)}</a>`
        : `<span class="bad-t">${esc(c.error.message)}</span>`);
      return "Forked: " + links.join(", ");
    },
    snapshot: async (sid) => {
      const name = $("#snapshot-name").value.trim();
      const out = await call("POST", `/sandboxes/${sid}/snapshots`, name ? { name } : {});
      return `Snapshot <b class="mono">${esc(out.snapshotID)}</b> taken: new sandboxes can start from it.`;
    },
  };

  document.addEventListener("click", async (e) => {
    const btn = e.target.closest("[data-act]");
    if (!btn || btn.disabled) return;
    const sid = $("#actions").dataset.sid;
    const act = btn.dataset.act;
    if (act === "kill" && !confirm(`Kill sandbox ${sid}? Its VM and memory are gone for good.`)) return;
    const buttons = $$("#actions button");
    buttons.forEach((b) => { b.disabled = true; });
    btn.classList.add("working");
    flash(`${act}…`, "busy");
    try {
      flash(await ACTIONS[act](sid), "ok");
    } catch (err) {
      flash(`${esc(act)} failed: ${esc(err.message)}`, "bad");
    } finally {
      btn.classList.remove("working");
      htmx.trigger(document.body, "aenv:refresh");
    }
  });

  /* --- the sandbox list's filters and pages ----------------------------------------- */

  function prefillFilters() {
    const form = $("#filters");
    if (!form) return;
    const q = new URLSearchParams(location.search);
    for (const [k, v] of q) if (form.elements[k]) form.elements[k].value = v;
  }

  function filtersChanged(resetPage) {
    const form = $("#filters");
    if (resetPage) form.elements.page.value = "1";
    const q = new URLSearchParams(new FormData(form));
    for (const [k, v] of Array.from(q)) if (!v || (k === "page" && v === "1") || (k === "status" && v === "live")) q.delete(k);
    history.replaceState(null, "", location.pathname + (q.toString() ? "?" + q : ""));
    htmx.trigger(document.body, "aenv:refresh");
  }

  let typing = null;
  document.addEventListener("input", (e) => {
    if (!e.target.closest("#filters")) return;
    clearTimeout(typing);
    typing = setTimeout(() => filtersChanged(true), e.target.tagName === "SELECT" ? 0 : 350);
  });

  document.addEventListener("click", (e) => {
    const b = e.target.closest("#view [data-goto]");
    if (!b || b.disabled || !$("#filters")) return;
    $("#filters").elements.page.value = b.dataset.goto;
    filtersChanged(false);
  });

  /* --- time left ---------------------------------------------------------------------- */

  function duration(s) {
    s = Math.max(0, s);
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function tick() {
    const now = Date.now();
    $$(".ttl[data-end-at]").forEach((el) => {
      const left = (Date.parse(el.dataset.endAt) - now) / 1000;
      el.textContent = left > 0 ? `${duration(Math.floor(left))} left` : "expiring…";
    });
  }
  setInterval(tick, 1000);

  /* --- terminal ---------------------------------------------------------------------- */

  function termState(text, tone) {
    const el = $("#term-state");
    el.textContent = text;
    el.className = "pill " + tone;
  }

  function startTerminal() {
    const el = $("#terminal");
    if (!el || el.dataset.started) return;
    el.dataset.started = "1";
    const term = new Terminal({
      cursorBlink: true, fontSize: 14, scrollback: 5000,
      fontFamily: '"DejaVu Sans Mono", "Liberation Mono", monospace',
      theme: { background: "#0d1117", foreground: "#e6edf3", cursor: "#58a6ff" },
    });
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(el);
    fit.fit();
    window.aenvTerm = term;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/console/ws/sandboxes/${el.dataset.sid}/terminal`);
    ws.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    ws.onopen = () => ws.send(JSON.stringify({ key: key(), cols: term.cols, rows: term.rows }));
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") { term.write(new Uint8Array(m.data)); return; }
      const c = JSON.parse(m.data);
      if (c.type === "ready") { termState("connected", "ok"); term.focus(); }
      else if (c.type === "exit") termState(`shell exited (${c.code})`, "off");
      else if (c.type === "error") { termState("ended", "bad"); term.write(`\r\n\x1b[31m${c.message}\x1b[0m\r\n`); }
    };
    ws.onclose = (e) => {
      if (e.code === 4401) { signOut(e.reason); return; }
      if (e.code >= 4000) {
        termState("refused", "bad");
        term.write(`\x1b[31m${e.reason || "refused"}\x1b[0m\r\n`);
      } else if ($("#term-state").textContent === "connected") {
        termState("closed", "off");
      }
    };
    term.onData((d) => { if (ws.readyState === 1) ws.send(enc.encode(d)); });
    term.onResize(({ cols, rows }) => {
      if (ws.readyState === 1) ws.send(JSON.stringify({ type: "resize", cols, rows }));
    });
    window.addEventListener("resize", () => fit.fit());
  }

  /* --- build log ---------------------------------------------------------------------- */

  function logLine(e) {
    const t = e.at.slice(11, 23);
    const step = e.step ? `[${e.step}] ` : "";
    const span = document.createElement("span");
    span.className = "lvl-" + e.level;
    span.textContent = `${t}  ${e.level.padEnd(5)} ${step}${e.message}\n`;
    return span;
  }

  async function startBuildLog() {
    const pre = $("#build-log");
    if (!pre || pre.dataset.started) return;
    pre.dataset.started = "1";
    let offset = 0;
    for (;;) {
      let r;
      try {
        r = await fetch(`/console/f/builds/${pre.dataset.bid}/log?offset=${offset}`,
                        { headers: { "X-API-KEY": key() || "" } });
      } catch (err) {
        await new Promise((ok) => setTimeout(ok, 2000));
        continue;
      }
      if (!r.ok) {
        pre.appendChild(document.createTextNode(`(${await errorText(r)})\n`));
        return;
      }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line) continue;
          const e = JSON.parse(line);
          if (e.status) {
            const end = document.createElement("span");
            end.className = "end " + (e.status === "ready" ? "ok" : "bad");
            end.textContent = `— build ${e.status}${e.reason ? ": " + e.reason : ""}\n`;
            pre.appendChild(end);
            htmx.trigger(document.body, "aenv:refresh");
            return;
          }
          offset = e.idx + 1;
          const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.appendChild(logLine(e));
          if (stick) pre.scrollTop = pre.scrollHeight;
        }
      }
    }
  }

  document.addEventListener("DOMContentLoaded", () => setTimeout(start, 0));
})();
