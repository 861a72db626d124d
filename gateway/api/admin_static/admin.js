// vllm-gateway admin page: plain JavaScript, no dependencies, no build step.
// Every value from the API reaches the page through textContent or a DOM attribute, never as HTML.
"use strict";

(() => {
  const STORE_KEY = "vllm-gateway-admin-key";
  const DRAINED_KEY = "vllm-gateway-admin-drained";  // weights before a drain, to restore on undrain
  const REFRESH_MS = 5000;
  const SVG_NS = "http://www.w3.org/2000/svg";

  const state = {
    key: null,
    view: "models",
    timer: null,
    models: [],
    backends: [],
    keys: [],
    editing: null,  // the model object being edited (null: adding one)
    modelsSignature: null,  // what the models list shows, to skip redrawing the same
    store: null,  // "file" or "redis", from /admin/status
  };

  // ---- DOM helpers -------------------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  // el("td", {className: "num", title: "x"}, "text", child, ...): attributes set as DOM properties or
  // plain attributes; children are nodes or strings (as text). Event handlers only through `on`.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "on") {
        for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
      } else if (name === "className") {
        node.className = value;
      } else if (name === "dataset") {
        Object.assign(node.dataset, value);
      } else if (name.startsWith("on") || name === "style") {
        throw new Error("el(): inline handlers and styles are not allowed");
      } else if (name in node && typeof value !== "string") {
        node[name] = value;
      } else {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }

  function clear(node) {
    node.replaceChildren();
    return node;
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  function badge(text, kind) {
    return el("span", { className: `badge badge-${kind}` }, text);
  }

  // The backend's last vLLM /metrics reading (models on load_aware or with shed), or a dash.
  function fmtLoad(scrape) {
    if (!scrape) return "—";
    const kv = Math.round(Number(scrape.kv_cache_usage) * 100);
    return `${fmtNumber(scrape.running)} running · ${fmtNumber(scrape.waiting)} waiting · KV ${kv}%`;
  }

  function fmtNumber(n) {
    return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
  }

  function fmtLimit(n) {
    return n === null || n === undefined ? "—" : fmtNumber(n);
  }

  function fmtWhen(value) {
    if (value === null || value === undefined || value === "") return "never";
    let ms = typeof value === "number" ? (value < 1e12 ? value * 1000 : value) : Date.parse(value);
    if (Number.isNaN(ms)) return String(value);
    const ago = Math.round((Date.now() - ms) / 1000);
    if (ago < 0) return new Date(ms).toLocaleTimeString();
    if (ago < 60) return `${ago} s ago`;
    if (ago < 3600) return `${Math.floor(ago / 60)} min ago`;
    return new Date(ms).toLocaleString();
  }

  function table(headers, rows, className) {
    return el("table", { className: className || "data" },
      el("thead", {}, el("tr", {}, headers.map((h) => el("th", { className: h.num ? "num" : null }, h.label || h)))),
      el("tbody", {}, rows));
  }

  function emptyRow(colspan, text) {
    return el("tr", {}, el("td", { colSpan: colspan, className: "empty" }, text));
  }

  // ---- the API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, error) {
      super(error.message || `The gateway answered ${status}.`);
      this.status = status;
      this.param = error.param || null;
      this.code = error.code || null;
    }
  }

  async function api(method, path, body, extraHeaders) {
    const headers = { Authorization: `Bearer ${state.key}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    Object.assign(headers, extraHeaders || {});
    let response;
    try {
      response = await fetch(path, {
        method, headers, body: body === undefined ? undefined : JSON.stringify(body),
        cache: "no-store", credentials: "omit", redirect: "error",
      });
    } catch (err) {
      throw new ApiError(0, { message: "The gateway could not be reached." });
    }
    let data = null;
    const text = await response.text();
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (err) {
        data = null;
      }
    }
    if (!response.ok) {
      const error = (data && data.error) || { message: `The gateway answered ${response.status}.` };
      const failure = new ApiError(response.status, error);
      if (response.status === 401 && state.key !== null && path !== "/admin/status") {
        signOut("The admin key is no longer accepted; sign in again.");
      }
      throw failure;
    }
    return data;
  }

  const enc = encodeURIComponent;
  const ifMatch = (obj) => (obj && obj.version !== undefined && obj.version !== null
    ? { "If-Match": String(obj.version) } : {});

  // A stale If-Match (someone else changed the object since this page read it).
  const isStale = (err) => err.status === 409 && err.code === "version_conflict";

  function explain(err, what) {
    if (isStale(err)) {
      return `${what}: it was changed by someone else since this page showed it. The list is reloaded; look and try again.`;
    }
    return `${what}: ${err.message}`;
  }

  // ---- banner ------------------------------------------------------------------------------------

  let bannerTimer = null;

  function banner(text, kind) {
    const node = $("banner");
    node.className = `banner banner-${kind || "error"}`;
    node.textContent = text;
    show(node, true);
    clearTimeout(bannerTimer);
    if (kind === "ok") bannerTimer = setTimeout(() => show(node, false), 4000);
  }

  function clearBanner() {
    show($("banner"), false);
  }

  // ---- field errors (the API's `param` is a field path such as upstreams.0.url) ------------------

  function clearFieldErrors(form) {
    for (const node of form.querySelectorAll(".field-error")) node.remove();
    for (const node of form.querySelectorAll(".invalid")) node.classList.remove("invalid");
    for (const node of form.querySelectorAll("p.error")) {
      node.textContent = "";
      show(node, false);
    }
  }

  function findField(form, param) {
    const parts = String(param).split(".");
    while (parts.length) {
      const target = form.querySelector(`[data-param="${CSS.escape(parts.join("."))}"]`);
      if (target) return target;
      parts.pop();
    }
    return null;
  }

  function showError(form, err) {
    const target = err.param ? findField(form, err.param) : null;
    if (target && target.matches("p.error")) {
      target.textContent = err.message;
      show(target, true);
    } else if (target) {
      target.classList.add("invalid");
      const note = el("p", { className: "field-error", role: "alert" }, err.message);
      (target.closest("label") || target).insertAdjacentElement("afterend", note);
      if (typeof target.focus === "function") target.focus();
    } else {
      const note = form.querySelector(".form-error");
      note.textContent = err.param ? `${err.param}: ${err.message}` : err.message;
      show(note, true);
    }
  }

  // ---- sign in / out -----------------------------------------------------------------------------

  async function signIn(key) {
    state.key = key;
    let status;
    try {
      status = await api("GET", "/admin/status");
    } catch (err) {
      state.key = null;
      if (err.status === 401) throw new Error("That admin key was not accepted. Check it and try again.");
      if (err.status === 403) throw new Error("That is a client key, not an admin key.");
      throw new Error(`Could not sign in: ${err.message}`);
    }
    sessionStorage.setItem(STORE_KEY, key);
    showStatus(status);
    show($("signin"), false);
    show($("nav"), true);
    show($("sign-out"), true);
    selectView(state.view);
  }

  function signOut(message) {
    state.key = null;
    state.modelsSignature = null;
    state.store = null;
    sessionStorage.removeItem(STORE_KEY);
    stopTimer();
    for (const id of ["view-models", "view-keys", "view-backends", "view-usage", "nav", "sign-out", "banner"]) {
      show($(id), false);
    }
    for (const id of ["models-list", "keys-table", "backends-table", "usage-chart", "usage-table", "instance"]) {
      clear($(id));
    }
    hideSecret();
    $("admin-key").value = "";
    const error = $("signin-error");
    error.textContent = message || "";
    show(error, Boolean(message));
    show($("signin"), true);
    $("admin-key").focus();
  }

  function showStatus(status) {
    state.store = status.store || null;
    const parts = [];
    if (status.instance_id) parts.push(`instance ${status.instance_id}`);
    if (status.version !== undefined && status.version !== null) parts.push(`version ${status.version}`);
    if (status.store) parts.push(`${status.store} store`);
    $("instance").textContent = parts.join(" · ");
    $("instance").title = status.last_sync ? `last sync ${fmtWhen(status.last_sync)}` : "";
  }

  async function refreshStatus() {
    try {
      showStatus(await api("GET", "/admin/status"));
    } catch (err) {
      // the view's own call reports a failure
    }
  }

  // ---- views -------------------------------------------------------------------------------------

  const loaders = {
    models: loadModels,
    keys: loadKeys,
    backends: loadBackends,
    usage: loadUsage,
  };

  function selectView(view) {
    state.view = view;
    clearBanner();
    for (const name of Object.keys(loaders)) show($(`view-${name}`), name === view);
    for (const tab of document.querySelectorAll(".tab")) {
      tab.classList.toggle("active", tab.dataset.view === view);
      tab.setAttribute("aria-current", tab.dataset.view === view ? "page" : "false");
    }
    stopTimer();
    refresh();
    if (view === "models" || view === "backends") {
      state.timer = setInterval(() => refresh(true), REFRESH_MS);
    }
  }

  function stopTimer() {
    if (state.timer !== null) clearInterval(state.timer);
    state.timer = null;
  }

  async function refresh(quiet) {
    if (state.key === null) return;
    try {
      await Promise.all([loaders[state.view](quiet), refreshStatus()]);
    } catch (err) {
      if (state.key !== null && !quiet) banner(`Could not load ${state.view}: ${err.message}`);
    }
  }

  // ---- Models ------------------------------------------------------------------------------------

  function drainedWeights() {
    try {
      return JSON.parse(sessionStorage.getItem(DRAINED_KEY) || "{}");
    } catch (err) {
      return {};
    }
  }

  function rememberWeight(model, upstream, weight) {
    const saved = drainedWeights();
    saved[`${model}\u0000${upstream}`] = weight;
    sessionStorage.setItem(DRAINED_KEY, JSON.stringify(saved));
  }

  function weightBefore(model, upstream) {
    const saved = drainedWeights()[`${model}\u0000${upstream}`];
    return Number.isInteger(saved) && saved > 0 ? saved : 1;
  }

  async function loadModels(quiet) {
    const [models, backends] = await Promise.all([api("GET", "/admin/models"), api("GET", "/admin/backends")]);
    state.models = models.data || [];
    state.backends = backends.data || [];
    // A background refresh redraws only what changed, and never throws away what the operator is
    // doing (an open confirmation).
    const signature = JSON.stringify([state.models, state.backends.map((b) => [b.name, b.state, b.reason, b.in_flight])]);
    if (quiet && (signature === state.modelsSignature || $("models-list").querySelector(".confirming"))) return;
    state.modelsSignature = signature;
    renderModels();
  }

  function healthOf(name) {
    return state.backends.find((b) => b.name === name) || null;
  }

  function stateBadge(health) {
    const value = health ? health.state || "unknown" : "unknown";
    const kind = value === "up" ? "ok" : value === "down" ? "bad" : "neutral";
    const node = badge(value, kind);
    if (health && health.reason) node.title = health.reason;
    return node;
  }

  function renderModels() {
    const list = clear($("models-list"));
    if (!state.models.length) {
      list.append(el("div", { className: "card empty" }, "No models yet. Add one to start serving it."));
      return;
    }
    for (const model of state.models) list.append(modelCard(model));
  }

  function modelCard(model) {
    const limits = [];
    for (const field of ["rpm", "tpm", "max_parallel"]) {
      if (model[field] !== null && model[field] !== undefined) limits.push(`${field.replace("_", " ")} ${fmtNumber(model[field])}`);
    }
    const aliases = model.aliases || [];
    const rows = (model.upstreams || []).map((up) => upstreamRow(model, up));
    const card = el("article", { className: "card model", dataset: { model: model.id } },
      el("div", { className: "model-head" },
        el("div", {},
          el("h2", { className: "model-id" }, model.id),
          el("div", { className: "meta" },
            badge(model.source || "config", model.source === "admin" ? "info" : "neutral"),
            model.version !== undefined ? el("span", { className: "muted" }, `v${model.version}`) : null,
            aliases.length ? el("span", { className: "muted" }, "aliases: ", aliases.join(", ")) : null,
            limits.length ? el("span", { className: "muted" }, limits.join(" · ")) : null)),
        el("div", { className: "actions" },
          el("button", { type: "button", className: "btn", on: { click: () => openModelForm(model) } }, "Edit"),
          confirmButton("Delete", `Delete ${model.id}?`, () => deleteModel(model)))),
      table(["Upstream", "URL", "Served model", { label: "Weight", num: true }, "Health",
        { label: "In flight", num: true }, ""], rows));
    return card;
  }

  function upstreamRow(model, up) {
    const health = healthOf(up.name);
    const weight = up.weight ?? 1;
    const drained = Number(weight) === 0;
    const action = drained
      ? el("button", { type: "button", className: "btn btn-small", on: { click: () => setWeight(model, up, weightBefore(model.id, up.name)) } }, "Undrain")
      : el("button", { type: "button", className: "btn btn-small", on: { click: () => drain(model, up) } }, "Drain");
    return el("tr", { dataset: { upstream: up.name } },
      el("td", {}, up.name),
      el("td", { className: "mono" }, up.url),
      el("td", { className: "mono" }, up.model),
      el("td", { className: "num" }, String(weight), drained ? " " : null, drained ? badge("drained", "warn") : null),
      el("td", {}, stateBadge(health), health && health.reason && health.state !== "up" ? el("span", { className: "reason" }, health.reason) : null),
      el("td", { className: "num" }, health ? fmtNumber(health.in_flight) : "—"),
      el("td", { className: "row-actions" }, action));
  }

  async function drain(model, up) {
    rememberWeight(model.id, up.name, Number(up.weight ?? 1) || 1);
    await setWeight(model, up, 0);
  }

  async function setWeight(model, up, weight) {
    try {
      await api("PATCH", `/admin/models/${enc(model.id)}/upstreams/${enc(up.name)}`, { weight });
      banner(weight === 0 ? `${up.name} drained: it gets no new requests.` : `${up.name} back in rotation (weight ${weight}).`, "ok");
    } catch (err) {
      banner(explain(err, `Could not change ${up.name}`));
    }
    await refresh(true);
  }

  async function deleteModel(model) {
    try {
      await api("DELETE", `/admin/models/${enc(model.id)}`, undefined, ifMatch(model));
      banner(`Model ${model.id} deleted.`, "ok");
    } catch (err) {
      banner(explain(err, `Could not delete ${model.id}`));
    }
    await refresh(true);
  }

  // A two-step button instead of window.confirm (no native dialogs on this page).
  function confirmButton(label, question, action, small) {
    const size = small ? " btn-small" : "";
    const holder = el("span", { className: "confirm" });
    const start = el("button", { type: "button", className: `btn btn-danger${size}` }, label);
    holder.append(start);
    start.addEventListener("click", () => {
      holder.classList.add("confirming");
      const yes = el("button", { type: "button", className: `btn btn-danger${size}` }, `Yes, ${label.toLowerCase()}`);
      const no = el("button", { type: "button", className: `btn btn-quiet${size}` }, "Cancel");
      holder.replaceChildren(el("span", { className: "confirm-question" }, question), yes, no);
      no.addEventListener("click", () => {
        holder.classList.remove("confirming");
        holder.replaceChildren(start);
      });
      yes.addEventListener("click", async () => {
        yes.disabled = true;
        no.disabled = true;
        holder.classList.remove("confirming");  // let the refresh after the action redraw the list
        await action();
      });
      no.focus();
    });
    return holder;
  }

  // ---- the model form ----------------------------------------------------------------------------

  function csv(value) {
    return value.split(",").map((s) => s.trim()).filter(Boolean);
  }

  function intOrNull(input) {
    const text = input.value.trim();
    if (text === "") return null;
    const n = Number(text);
    return Number.isFinite(n) ? n : text;  // the API explains a bad value at the field
  }

  function upstreamEditor(up, index) {
    const input = (field, attrs) => el("input", Object.assign({ dataset: { param: `upstreams.${index}.${field}`, field } }, attrs));
    const apiKeyHint = up && up.api_key_set ? "set (leave blank to keep)" : "none";
    const row = el("fieldset", { className: "upstream-editor", dataset: { param: `upstreams.${index}`, index: String(index) } },
      el("legend", {}, `Upstream ${index + 1}`),
      el("div", { className: "form-grid" },
        el("div", { className: "field" }, el("label", {}, "Name", input("name", { value: up ? up.name || "" : "", placeholder: "gpu0-7b" }))),
        el("div", { className: "field wide" }, el("label", {}, "URL", input("url", { value: up ? up.url || "" : "", placeholder: "http://10.0.0.5:8000", required: true }))),
        el("div", { className: "field" }, el("label", {}, "Served model", input("model", { value: up ? up.model || "" : "", required: true }))),
        el("div", { className: "field narrow" }, el("label", {}, "Weight", input("weight", { type: "number", min: "0", value: up && up.weight !== undefined ? String(up.weight) : "1" }))),
        el("div", { className: "field" }, el("label", {}, "API key", input("api_key", { type: "password", placeholder: apiKeyHint, autocomplete: "new-password" }))),
        el("div", { className: "field field-submit" },
          el("button", { type: "button", className: "btn btn-quiet", on: { click: () => { row.remove(); renumberUpstreams(); } } }, "Remove"))));
    row.original = up || null;
    return row;
  }

  function renumberUpstreams() {
    const rows = $("m-upstreams").querySelectorAll(".upstream-editor");
    rows.forEach((row, i) => {
      row.dataset.index = String(i);
      row.dataset.param = `upstreams.${i}`;
      row.querySelector("legend").textContent = `Upstream ${i + 1}`;
      for (const input of row.querySelectorAll("input[data-field]")) input.dataset.param = `upstreams.${i}.${input.dataset.field}`;
    });
  }

  function openModelForm(model) {
    state.editing = model || null;
    const form = $("model-form");
    form.reset();
    clearFieldErrors(form);
    $("model-form-title").textContent = model ? `Edit ${model.id}` : "Add model";
    $("m-id").value = model ? model.id : "";
    $("m-id").readOnly = Boolean(model);
    $("m-aliases").value = model ? (model.aliases || []).join(", ") : "";
    $("m-owned").value = model && model.owned_by ? model.owned_by : "";
    $("m-rpm").value = model && model.rpm ? String(model.rpm) : "";
    $("m-tpm").value = model && model.tpm ? String(model.tpm) : "";
    $("m-parallel").value = model && model.max_parallel ? String(model.max_parallel) : "";
    const holder = clear($("m-upstreams"));
    const ups = model ? model.upstreams || [] : [null];
    ups.forEach((up, i) => holder.append(upstreamEditor(up, i)));
    $("model-dialog").showModal();
    (model ? $("m-aliases") : $("m-id")).focus();
  }

  function modelBody() {
    // Start from the object the API gave (fields this form does not show are kept), drop what the API
    // adds (source, version, api_key_set) and put the form's values in.
    const base = state.editing ? structuredClone(state.editing) : {};
    delete base.source;
    delete base.version;
    const body = base;
    body.id = $("m-id").value.trim();
    body.aliases = csv($("m-aliases").value);
    const owned = $("m-owned").value.trim();
    if (owned) body.owned_by = owned; else delete body.owned_by;
    for (const [field, id] of [["rpm", "m-rpm"], ["tpm", "m-tpm"], ["max_parallel", "m-parallel"]]) {
      const value = intOrNull($(id));
      if (value === null) delete body[field]; else body[field] = value;
    }
    body.upstreams = [...$("m-upstreams").querySelectorAll(".upstream-editor")].map((row) => {
      const up = row.original ? structuredClone(row.original) : {};
      delete up.api_key_set;
      const get = (field) => row.querySelector(`input[data-field="${field}"]`);
      const name = get("name").value.trim();
      if (name) up.name = name; else delete up.name;
      up.url = get("url").value.trim();
      up.model = get("model").value.trim();
      const weight = intOrNull(get("weight"));
      if (weight === null) delete up.weight; else up.weight = weight;
      const key = get("api_key").value;
      if (key) up.api_key = key; else delete up.api_key;  // absent: the gateway keeps the current key
      return up;
    });
    return body;
  }

  async function saveModel(event) {
    event.preventDefault();
    const form = $("model-form");
    clearFieldErrors(form);
    const body = modelBody();
    const editing = state.editing;
    try {
      if (editing) {
        await api("PUT", `/admin/models/${enc(editing.id)}`, body, ifMatch(editing));
      } else {
        await api("POST", "/admin/models", body);
      }
    } catch (err) {
      if (isStale(err) && editing) {
        showError(form, new ApiError(409, {
          message: "Not saved: someone else changed this model since you opened it. Cancel, then edit it again.",
        }));
        await refresh(true);
        return;
      }
      showError(form, err);
      return;
    }
    $("model-dialog").close();
    banner(editing ? `Model ${body.id} saved.` : `Model ${body.id} added.`, "ok");
    await refresh(true);
  }

  // ---- Keys --------------------------------------------------------------------------------------

  async function loadKeys(quiet) {
    const keys = await api("GET", "/admin/keys");
    state.keys = keys.data || [];
    if (quiet && $("keys-table").querySelector(".confirming, .editing")) return;
    renderKeys();
  }

  function renderKeys() {
    const rows = state.keys.map(keyRow);
    if (!rows.length) rows.push(emptyRow(8, "No client keys."));
    clear($("keys-table")).append(table(["Name", "Prefix", "Models", { label: "rpm", num: true },
      { label: "tpm", num: true }, { label: "max parallel", num: true }, "Source", ""], rows));
  }

  // Bucket sizes and per-model limits, in words (the table's columns hold the key-wide limits).
  function limitNotes(key) {
    const notes = [];
    const burst = [];
    if (key.burst_requests) burst.push(`${fmtNumber(key.burst_requests)} requests`);
    if (key.burst_tokens) burst.push(`${fmtNumber(key.burst_tokens)} tokens`);
    if (burst.length) notes.push(`burst ${burst.join(", ")}`);
    for (const [model, limits] of Object.entries(key.per_model || {})) {
      const parts = Object.entries(limits).filter(([, v]) => v !== null && v !== undefined)
        .map(([k, v]) => `${k.replace("_", " ")} ${fmtNumber(v)}`);
      if (parts.length) notes.push(`${model}: ${parts.join(", ")}`);
    }
    return notes.length ? el("div", { className: "limit-notes" }, notes.join(" · ")) : null;
  }

  function keyRow(key) {
    const row = el("tr", { dataset: { key: key.name } },
      el("td", {}, key.name),
      el("td", { className: "mono" }, key.prefix ? `${key.prefix}…` : "—"),
      el("td", {}, (key.models || []).join(", "), limitNotes(key)),
      el("td", { className: "num" }, fmtLimit(key.rpm)),
      el("td", { className: "num" }, fmtLimit(key.tpm)),
      el("td", { className: "num" }, fmtLimit(key.max_parallel)),
      el("td", {}, badge(key.source || "config", key.source === "admin" ? "info" : "neutral")),
      el("td", { className: "row-actions" },
        el("button", { type: "button", className: "btn btn-small", on: { click: () => editKey(row, key) } }, "Edit"),
        confirmButton("Revoke", `Revoke ${key.name}?`, () => revokeKey(key), true)));
    return row;
  }

  function editKey(row, key) {
    row.classList.add("editing");
    const form = el("form", { className: "key-edit", autocomplete: "off" });
    const field = (param, label, value, attrs) => el("div", { className: "field" },
      el("label", {}, label, el("input", Object.assign({ dataset: { param }, value: value ?? "" }, attrs || {}))));
    append(form, [
      field("models", "Models", (key.models || []).join(", ")),
      field("rpm", "rpm", key.rpm === null || key.rpm === undefined ? "" : String(key.rpm), { type: "number", min: "1", placeholder: "none" }),
      field("tpm", "tpm", key.tpm === null || key.tpm === undefined ? "" : String(key.tpm), { type: "number", min: "1", placeholder: "none" }),
      field("max_parallel", "max parallel", key.max_parallel === null || key.max_parallel === undefined ? "" : String(key.max_parallel), { type: "number", min: "1", placeholder: "none" }),
      el("div", { className: "field field-submit" },
        el("button", { type: "submit", className: "btn btn-primary btn-small" }, "Save"),
        el("button", { type: "button", className: "btn btn-quiet btn-small", on: { click: () => { row.classList.remove("editing"); renderKeys(); } } }, "Cancel")),
      el("p", { className: "error form-error", role: "alert", hidden: true }),
    ]);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      clearFieldErrors(form);
      const get = (param) => form.querySelector(`input[data-param="${param}"]`);
      const body = { models: csv(get("models").value) };
      for (const param of ["rpm", "tpm", "max_parallel"]) body[param] = intOrNull(get(param));
      try {
        await api("PATCH", `/admin/keys/${enc(key.name)}`, body, ifMatch(key));
      } catch (err) {
        showError(form, isStale(err) ? new ApiError(409, { message: explain(err, "Not saved") }) : err);
        return;
      }
      banner(`Key ${key.name} saved.`, "ok");
      row.classList.remove("editing");  // let the refresh redraw the row
      await refresh(true);
    });
    row.replaceChildren(el("td", {}, key.name), el("td", { colSpan: 7 }, form));
    form.querySelector("input").focus();
  }

  async function revokeKey(key) {
    try {
      await api("DELETE", `/admin/keys/${enc(key.name)}`, undefined, ifMatch(key));
      banner(`Key ${key.name} revoked: the gateway refuses it from now on.`, "ok");
    } catch (err) {
      banner(explain(err, `Could not revoke ${key.name}`));
    }
    await refresh(true);
  }

  async function createKey(event) {
    event.preventDefault();
    const form = $("key-form");
    clearFieldErrors(form);
    hideSecret();
    const body = { name: $("key-name").value.trim(), models: csv($("key-models").value) };
    for (const [field, id] of [["rpm", "key-rpm"], ["tpm", "key-tpm"], ["max_parallel", "key-parallel"]]) {
      const value = intOrNull($(id));
      if (value !== null) body[field] = value;
    }
    let created;
    try {
      created = await api("POST", "/admin/keys", body);
    } catch (err) {
      showError(form, err);
      return;
    }
    form.reset();
    $("key-secret-name").textContent = created.name;
    $("key-secret-value").textContent = created.key;
    $("key-copy-status").textContent = "";
    show($("key-secret"), true);
    await refresh(true);
  }

  function hideSecret() {
    $("key-secret-value").textContent = "";
    $("key-secret-name").textContent = "";
    show($("key-secret"), false);
  }

  async function copySecret() {
    const value = $("key-secret-value").textContent;
    try {
      await navigator.clipboard.writeText(value);
      $("key-copy-status").textContent = "Copied to the clipboard.";
    } catch (err) {
      // No clipboard permission (plain http on another host): select the text for Ctrl+C instead.
      const range = document.createRange();
      range.selectNodeContents($("key-secret-value"));
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      $("key-copy-status").textContent = "Selected: press Ctrl+C (or ⌘C) to copy.";
    }
  }

  // ---- Backends ----------------------------------------------------------------------------------

  async function loadBackends() {
    const backends = await api("GET", "/admin/backends");
    state.backends = backends.data || [];
    const rows = state.backends.map((b) => el("tr", { dataset: { backend: b.name } },
      el("td", {}, b.name),
      el("td", {}, b.model),
      el("td", { className: "mono" }, b.url),
      el("td", {}, stateBadge(b), b.circuit && b.circuit !== "closed" ? badge(`circuit ${b.circuit}`, "warn") : null),
      el("td", { className: "reason-cell" }, b.state === "up" ? "" : b.reason || ""),
      el("td", { className: "num" }, fmtNumber(b.in_flight)),
      el("td", { className: "num" }, b.weight === undefined ? "—" : String(b.weight)),
      el("td", {}, fmtLoad(b.scrape)),
      el("td", {}, fmtWhen(b.last_probe))));
    if (!rows.length) rows.push(emptyRow(9, "No backends configured."));
    clear($("backends-table")).append(table(["Name", "Model", "URL", "State", "Reason",
      { label: "In flight", num: true }, { label: "Weight", num: true }, "vLLM load", "Last probe"], rows));
    $("backends-updated").textContent = `Refreshed ${new Date().toLocaleTimeString()} · every ${REFRESH_MS / 1000} s`;
  }

  // ---- Usage -------------------------------------------------------------------------------------

  async function loadUsage() {
    const days = Number($("usage-days").value) || 7;
    const usage = await api("GET", `/admin/usage?days=${days}`);
    const data = usage.data || [];
    const rows = data.map((u) => el("tr", {},
      el("td", {}, u.day),
      el("td", {}, u.key),
      el("td", {}, u.model),
      el("td", { className: "num" }, fmtNumber(u.requests)),
      el("td", { className: "num" }, fmtNumber(u.prompt_tokens)),
      el("td", { className: "num" }, fmtNumber(u.completion_tokens)),
      el("td", { className: "num" }, fmtNumber(u.total_tokens)),
      el("td", { className: "num" }, fmtNumber(u.rate_limited))));
    if (!rows.length) {
      rows.push(emptyRow(8, state.store === "file"
        ? "Usage is recorded in Redis: this gateway runs without GATEWAY_REDIS_URL, so there is none to show."
        : `No usage recorded in the last ${days} day${days === 1 ? "" : "s"}.`));
    }
    clear($("usage-table")).append(table(["Day", "Key", "Model", { label: "Requests", num: true },
      { label: "Prompt tokens", num: true }, { label: "Completion tokens", num: true },
      { label: "Total tokens", num: true }, { label: "Rate-limited", num: true }], rows));
    renderChart(data, days);
  }

  function renderChart(data, days) {
    const holder = clear($("usage-chart"));
    const totals = new Map();
    for (const u of data) {
      const label = `${u.key} · ${u.model}`;
      const t = totals.get(label) || { prompt: 0, completion: 0 };
      t.prompt += Number(u.prompt_tokens) || 0;
      t.completion += Number(u.completion_tokens) || 0;
      totals.set(label, t);
    }
    const bars = [...totals.entries()].sort((a, b) => (b[1].prompt + b[1].completion) - (a[1].prompt + a[1].completion));
    holder.append(el("h2", {}, `Tokens by key and model, last ${days} day${days === 1 ? "" : "s"}`));
    if (!bars.length) {
      holder.append(el("p", { className: "muted" }, "Nothing to chart yet."));
      return;
    }
    const max = Math.max(1, ...bars.map(([, t]) => t.prompt + t.completion));
    const labelW = 260;
    const chartW = 520;
    const valueW = 120;
    const rowH = 28;
    const width = labelW + chartW + valueW;
    const height = bars.length * rowH + 30;
    const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "bars" });
    chart.append(svg("title", {}, "Tokens by key and model"));
    bars.forEach(([label, t], i) => {
      const y = i * rowH + 4;
      const total = t.prompt + t.completion;
      const promptW = (t.prompt / max) * chartW;
      const completionW = (t.completion / max) * chartW;
      const group = svg("g", { class: "bar-row" });
      const text = svg("text", { x: labelW - 10, y: y + rowH / 2 + 2, class: "bar-label", "text-anchor": "end", "dominant-baseline": "middle" });
      text.textContent = label.length > 36 ? `${label.slice(0, 35)}…` : label;
      group.append(svg("title", {}, `${label}: ${fmtNumber(t.prompt)} prompt + ${fmtNumber(t.completion)} completion tokens`));
      group.append(text);
      group.append(svg("rect", { x: labelW, y, width: Math.max(promptW, 0), height: rowH - 8, class: "bar-prompt", rx: 2 }));
      group.append(svg("rect", { x: labelW + promptW, y, width: Math.max(completionW, 0), height: rowH - 8, class: "bar-completion", rx: 2 }));
      const value = svg("text", { x: labelW + promptW + completionW + 8, y: y + rowH / 2 + 2, class: "bar-value", "dominant-baseline": "middle" });
      value.textContent = fmtNumber(total);
      group.append(value);
      chart.append(group);
    });
    const legendY = bars.length * rowH + 14;
    chart.append(svg("rect", { x: labelW, y: legendY, width: 12, height: 12, class: "bar-prompt" }));
    chart.append(svg("text", { x: labelW + 18, y: legendY + 10, class: "bar-legend" }, "prompt tokens"));
    chart.append(svg("rect", { x: labelW + 130, y: legendY, width: 12, height: 12, class: "bar-completion" }));
    chart.append(svg("text", { x: labelW + 148, y: legendY + 10, class: "bar-legend" }, "completion tokens"));
    holder.append(chart);
  }

  // ---- wiring ------------------------------------------------------------------------------------

  function start() {
    $("signin-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = $("admin-key").value.trim();
      const error = $("signin-error");
      show(error, false);
      if (!key) return;
      try {
        await signIn(key);
        $("admin-key").value = "";
      } catch (err) {
        error.textContent = err.message;
        show(error, true);
      }
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    for (const tab of document.querySelectorAll(".tab")) {
      tab.addEventListener("click", () => selectView(tab.dataset.view));
    }
    $("model-add").addEventListener("click", () => openModelForm(null));
    $("model-form").addEventListener("submit", saveModel);
    $("model-cancel").addEventListener("click", () => $("model-dialog").close());
    $("m-upstream-add").addEventListener("click", () => {
      const holder = $("m-upstreams");
      holder.append(upstreamEditor(null, holder.querySelectorAll(".upstream-editor").length));
    });
    $("key-form").addEventListener("submit", createKey);
    $("key-copy").addEventListener("click", copySecret);
    $("key-secret-done").addEventListener("click", hideSecret);
    $("usage-days").addEventListener("change", () => refresh());

    const saved = sessionStorage.getItem(STORE_KEY);
    if (saved) {
      signIn(saved).catch((err) => signOut(err.message));
    } else {
      $("admin-key").focus();
    }
  }

  start();
})();
