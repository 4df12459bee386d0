// The developers' dashboard: sign in with an API key (or open a portal link,
// whose session token arrives in the URL fragment), then manage endpoints,
// upcoming events, delivery logs and API keys through the public /v0 API, and
// check delivery signatures in the browser. No framework and no build step:
// views are built with `h()`, which only ever inserts text (never HTML).
"use strict";

(() => {
  const KEY_STORAGE = "webhooks-dashboard-api-key";
  // A portal session's token starts so; it is sent as a bearer, not as Api-Key.
  const SESSION_PREFIX = "ps_";
  const UNRESTRICTED = "platform:api_unrestricted";
  const SCOPES = ["webhooks:read", "webhooks:write", "api_keys:read", "api_keys:write"];
  const REFRESH_MS = 3000;
  const LOG_PAGE = 20;
  const UPCOMING_LIMIT = 20;

  const state = { key: null, me: null, catalog: null, render: 0, refresh: null, refreshing: false, notBefore: 0, timer: null, afterSignIn: null, keepNotice: false };
  const $ = (id) => document.getElementById(id);

  // ---- DOM ----------------------------------------------------------------

  /** An element with attributes (`on…` are listeners) and children (text is text). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else if (name === "value" || name === "checked") el[name] = value;
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined && child !== false) el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  let uid = 0;
  /** A labelled control: `<label for>` and the control, in a `.field`. */
  function field(label, control, hint) {
    control.id = control.id || `f${++uid}`;
    const hintEl = hint ? h("p", { class: "hint", id: `${control.id}-hint` }, hint) : null;
    if (hintEl) control.setAttribute("aria-describedby", hintEl.id);
    return h("div", { class: "field" }, h("label", { for: control.id }, label), control, hintEl);
  }

  /** A fieldset of checkboxes, one per value; `checked` and `disabled` are sets. */
  function checkboxes(legend, name, values, checked, disabled, hint) {
    return h("fieldset", { class: "checks" }, h("legend", {}, legend), hint ? h("p", { class: "hint" }, hint) : null,
      h("div", { class: "check-grid" }, values.map((value) => h("label", { class: "check" },
        h("input", { type: "checkbox", name, value, checked: checked.has(value), disabled: disabled.has(value) }), value))));
  }

  const checkedValues = (form, name) => [...form.querySelectorAll(`input[name="${name}"]:checked`)].map((i) => i.value);

  function select(options, current) {
    return h("select", {}, options.map(([value, label]) => h("option", { value, selected: value === current }, label)));
  }

  /** `2026-11-21 10:04:05 UTC` for an RFC 3339 time (itself when it is not one). */
  function utc(iso) {
    const date = new Date(iso);
    return Number.isNaN(date.getTime()) ? String(iso) : date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  const when = (iso) => (iso ? h("time", { datetime: iso, title: iso }, utc(iso)) : "—");

  const badge = (text, kind) => h("span", { class: `badge ${kind || text}` }, text);

  /** An event type's name that may break after its dots, and nowhere else. */
  const typeName = (name) => name.split(".").flatMap((part, i) => (i ? [".", h("wbr"), part] : [part]));

  /** A Copy button for the text of `source()`. */
  function copyButton(label, source, size = "small") {
    const button = h("button", { type: "button", class: size, "aria-label": label }, "Copy");
    button.addEventListener("click", async () => {
      const text = source();
      try {
        await navigator.clipboard.writeText(text);
        button.textContent = "Copied";
        notice("Copied to the clipboard.");
      } catch {
        button.textContent = "Select and copy by hand";
      }
      setTimeout(() => { button.textContent = "Copy"; }, 2000);
    });
    return button;
  }

  /** A button that asks "Sure?" inline before running `action`. */
  function confirmButton(label, question, action) {
    const box = h("span", { class: "confirm" });
    const ask = h("button", { type: "button", class: "danger", onclick: () => {
      const yes = h("button", { type: "button", class: "danger", onclick: () => run(yes, action) }, `Yes, ${label.toLowerCase()}`);
      const no = h("button", { type: "button", onclick: () => { box.replaceChildren(ask); ask.focus(); } }, "Cancel");
      box.replaceChildren(h("span", { class: "question" }, question), yes, no);
      no.focus();
    } }, label);
    box.append(ask);
    return box;
  }

  // ---- messages -------------------------------------------------------------

  function showError(message) {
    clearNotice();
    const fresh = $("alert").hidden || $("alert-text").textContent !== message;
    $("alert-text").textContent = message;
    $("alert").hidden = false;
    if (fresh) $("alert").scrollIntoView({ block: "nearest" });
  }
  function clearError() {
    $("alert").hidden = true;
    $("alert-text").textContent = "";
  }
  let noticeTimer = null;
  function notice(message) {
    $("notice").textContent = message;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(clearNotice, 8000);
  }
  function clearNotice() {
    clearTimeout(noticeTimer);
    $("notice").textContent = "";
  }

  // ---- the API ----------------------------------------------------------------

  class ApiError extends Error {
    /** `retryAfter`: the seconds a 429 or 503 asks the caller to wait (0: none said). */
    constructor(status, message, retryAfter = 0) {
      super(message);
      this.status = status;
      this.retryAfter = retryAfter;
    }
  }

  function randomId() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const hex = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
    return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
  }

  /** One call to `/v0`; resolves to the JSON answer, throws `ApiError` with the API's message. */
  async function api(method, path, body, key = state.key) {
    const credential = String(key || "");
    const headers = credential.startsWith(SESSION_PREFIX)
      ? { Authorization: `Bearer ${credential}` }
      : { "Api-Key": credential };
    headers["Webhooks-Client"] = "dashboard";
    headers.Accept = "application/json";
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (method === "POST") headers["Idempotency-Key"] = randomId();
    if (method === "POST" || body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body ?? {});
    }
    let response;
    try {
      response = await fetch(`/v0${path}`, init);
    } catch {
      throw new ApiError(0, "The API could not be reached. Check the connection and try again.");
    }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!response.ok) {
      const message = data && typeof data.message === "string" ? data.message : `The API answered ${response.status}.`;
      if (response.status === 401 && key === state.key && state.key) signOut(message);
      const retryAfter = Number.parseInt(response.headers.get("Retry-After") || "", 10);
      throw new ApiError(response.status, message, Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter : 0);
    }
    return data;
  }

  /** Runs a user action from `button`: one at a time, its refusal shown in the alert. */
  async function run(button, action) {
    if (button) button.disabled = true;
    clearError();
    try {
      await action();
    } catch (error) {
      if (error instanceof ApiError) showError(error.message);
      else { showError(`Something went wrong: ${error.message}`); console.error(error); }
    } finally {
      if (button) button.disabled = false;
    }
  }

  // ---- session --------------------------------------------------------------------

  const isSession = () => !!state.key && state.key.startsWith(SESSION_PREFIX);

  /**
   * A portal link (`/dashboard#session=<token>`): keeps the token in this tab's
   * session storage and takes it out of the address bar and the history at once,
   * so it is never bookmarked, shared or sent anywhere but as a bearer.
   */
  function takeSessionFromUrl() {
    const match = /^#session=([A-Za-z0-9_]+)$/.exec(location.hash);
    if (!match) return false;
    history.replaceState(null, "", `${location.pathname}${location.search}#/endpoints`);
    sessionStorage.setItem(KEY_STORAGE, match[1]);
    return true;
  }

  const can = (scope) => !!state.me && (state.me.scopes.includes(UNRESTRICTED) || state.me.scopes.includes(scope));

  function signOut(message) {
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = null;
    state.me = null;
    state.catalog = null;
    stopRefresh();
    updateHeader();
    // No hashchange (which clears the alert): the reason stays on screen.
    history.replaceState(null, "", "#/signin");
    route();
    if (message) showError(message);
  }

  function updateHeader() {
    const signedIn = !!state.me;
    $("nav-endpoints").hidden = !signedIn;
    $("nav-catalog").hidden = !signedIn;
    $("nav-keys").hidden = !can("api_keys:read");
    $("nav-signin").hidden = signedIn;
    $("session").hidden = !signedIn;
    if (signedIn) {
      const me = state.me;
      const scopes = me.scopes.includes(UNRESTRICTED) ? "unrestricted" : me.scopes.join(", ");
      $("who").textContent = isSession()
        ? `Portal session · ${scopes}`
        : `${me.name ? `${me.name} · ` : ""}${me.prefix}-…${me.last_4} · ${scopes}`;
    }
    const current = (location.hash.split("/")[1] || "endpoints");
    for (const link of document.querySelectorAll("#nav a")) {
      if (link.dataset.route === current) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
  }

  // ---- routing and refresh ------------------------------------------------------------

  function stopRefresh() {
    clearTimeout(state.timer);
    state.refresh = null;
  }

  /**
   * Calls `refresh` every few seconds while the view is shown and the tab is
   * visible: one call at a time (a slow answer is waited for, never stacked
   * on), and after a 429 or 503 not before the `Retry-After` it names.
   */
  function startRefresh(refresh) {
    stopRefresh();
    state.refresh = refresh;
    if (!state.refreshing) schedule(REFRESH_MS);
  }
  function schedule(wait) {
    clearTimeout(state.timer);
    state.timer = setTimeout(tick, wait);
  }
  async function tick() {
    const refresh = state.refresh;
    // A refresh still waiting for its answer schedules the next when it ends.
    if (!refresh || document.hidden || state.refreshing) return;
    // Not even when the tab shows again before the API's Retry-After.
    const early = state.notBefore - Date.now();
    if (early > 0) return schedule(early);
    state.refreshing = true;
    let wait = REFRESH_MS;
    try {
      await refresh();
    } catch (error) {
      if (error instanceof ApiError) {
        wait = Math.max(wait, error.retryAfter * 1000);
        if (state.refresh === refresh) showError(error.message);
      }
    } finally {
      state.refreshing = false;
    }
    state.notBefore = wait > REFRESH_MS ? Date.now() + wait : 0;
    if (state.refresh && !document.hidden) schedule(wait);
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) clearTimeout(state.timer);
    else if (state.refresh) tick();
  });

  /** `children` without the absent ones (`replaceChildren` would write "null"). */
  const present = (children) => children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);

  /** Shows `children` as the current view and focuses its heading. */
  function show(...children) {
    $("view").replaceChildren(...present(children));
    const heading = $("view").querySelector("h1");
    if (heading) {
      heading.tabIndex = -1;
      heading.focus({ preventScroll: true });
    }
  }

  async function route() {
    stopRefresh();
    const token = ++state.render;
    const [page, id] = location.hash.replace(/^#\/?/, "").split("/").map((part) => {
      try { return decodeURIComponent(part); } catch { return part; }
    });
    updateHeader();
    if (page === "checker") return viewChecker();
    if (!state.me) {
      if (page && page !== "signin") state.afterSignIn = location.hash;
      return viewSignIn();
    }
    const current = () => token === state.render;
    try {
      if (page === "keys") await viewKeys(current);
      else if (page === "catalog") await viewCatalog(current, id);
      else if (page === "endpoints" && id) await viewEndpoint(id, current);
      else if (page === "endpoints") await viewEndpoints(current);
      else location.hash = "#/endpoints";
    } catch (error) {
      if (!current()) return;
      if (error instanceof ApiError) {
        showError(error.message);
        if (state.me) show(h("h1", {}, "Not available"), h("p", {}, error.message), h("p", {}, h("a", { href: "#/endpoints" }, "All endpoints")));
      } else throw error;
    }
  }
  window.addEventListener("hashchange", () => {
    if (takeSessionFromUrl()) {
      state.key = null;
      state.me = null;
      start();
      return;
    }
    clearError();
    if (!state.keepNotice) clearNotice();
    state.keepNotice = false;
    route();
  });
  /** Goes to `hash`, keeping the notice that the action which goes there just showed. */
  function go(hash) {
    state.keepNotice = true;
    location.hash = hash;
  }

  // ---- sign in ------------------------------------------------------------------------

  function viewSignIn() {
    const input = h("input", { type: "password", name: "api-key", autocomplete: "off", spellcheck: "false", required: true });
    const form = h("form", { class: "panel narrow" },
      field("API key", input, "It stays in this tab's session storage only, and is forgotten when you sign out or close the tab."),
      h("button", { type: "submit", class: "primary" }, "Sign in"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button"), async () => {
        const key = input.value.trim();
        if (/[^\x21-\x7e]/.test(key)) throw new ApiError(0, "An API key has letters, digits and dashes only.");
        const me = await api("GET", "/api_keys/whoami", undefined, key);
        sessionStorage.setItem(KEY_STORAGE, key);
        state.key = key;
        state.me = me;
        const target = state.afterSignIn || "#/endpoints";
        state.afterSignIn = null;
        if (location.hash === target) route();
        else location.hash = target;
      });
    });
    show(h("h1", {}, "Sign in"), h("p", {}, "Sign in with an API key of the webhooks service."), form);
    input.focus();
  }

  // ---- endpoints ------------------------------------------------------------------------

  const endpointPath = (id) => `#/endpoints/${encodeURIComponent(id)}`;
  const categoriesText = (list) => (list && list.length ? list.join(", ") : "all categories");
  const SCHEMES = [["platform", "platform (RSA)"], ["standard", "standard (Ed25519)"]];
  const ORDERS = [["none", "any order"], ["ordered", "in sequence"]];
  const paceText = (limit) => (limit ? `${limit} deliveries/s` : "no limit");
  const orderText = (ordering) => (ordering === "ordered" ? "in sequence" : "any order");
  /** The pace control: a whole number, empty for no limit. Its range is the API's to check (its message is shown). */
  const paceInput = (limit) => h("input", { type: "number", step: 1, inputmode: "numeric", value: limit ?? "" });
  /** The pace to send: null (no limit) when the control is empty. */
  const paceValue = (input) => (input.value.trim() === "" ? null : Number(input.value));
  const PACE_HINT = "1 to 10000; empty: no limit. Deliveries above it wait; none fails for it.";
  const ORDER_HINT = "In sequence: by event_sequence; a failing event holds back the later ones.";

  // ---- the event catalog ----------------------------------------------------------------

  /** The event types (GET /v0/event_types), fetched once per sign-in; `fresh` fetches again. */
  async function eventTypes(fresh = false) {
    if (!state.catalog || fresh) state.catalog = (await api("GET", "/event_types")).data;
    return state.catalog;
  }
  /** The categories the catalog's types name, sorted. */
  const categoriesOf = (types) => [...new Set(types.map((t) => t.category))].sort();
  const typesText = (list) => (list && list.length ? list.join(", ") : "all types of its categories");

  async function viewCatalog(current, focus) {
    const types = await eventTypes(true);
    if (!current()) return;
    const filter = select([["", "all categories"], ...categoriesOf(types).map((c) => [c, c])], "");
    const list = h("ul", { class: "cards", id: "event-types" });
    const render = () => list.replaceChildren(...types.filter((t) => !filter.value || t.category === filter.value).map((t) =>
      h("li", { class: "card", "data-event-type": t.name, id: `type-${t.name}` },
        h("h2", { class: "mono type-name" }, typeName(t.name)),
        h("div", { class: "badges" }, badge(t.category, "scheme"), t.deprecated ? badge("deprecated", "failing") : null),
        h("p", {}, t.description),
        h("details", { open: t.name === focus }, h("summary", {}, "Example event_object"), h("pre", { class: "json" }, JSON.stringify(t.example, null, 2))),
        h("details", {}, h("summary", {}, "JSON Schema of event_object"), h("pre", { class: "json" }, JSON.stringify(t.schema, null, 2))),
        h("p", { class: "meta" }, "updated ", when(t.updated_at)))));
    filter.addEventListener("change", render);
    render();
    show(h("h1", {}, "Event types"),
      h("p", { class: "hint" }, `${types.length} types in the catalog. Each event's event_object satisfies its type's schema; endpoints can narrow to categories and types.`),
      field("Category", filter), list);
  }

  async function viewEndpoints(current) {
    if (!can("webhooks:read")) {
      return show(h("h1", {}, "Endpoints"), h("p", {}, "This key cannot list endpoints: it lacks the webhooks:read scope."));
    }
    const [list, types] = await Promise.all([api("GET", "/webhooks"), eventTypes()]);
    if (!current()) return;
    const items = list.data.map((ep) => h("li", { class: "card" },
      h("a", { href: endpointPath(ep.id), class: "url" }, ep.url),
      h("div", { class: "badges" }, badge(ep.status), ep.signature_scheme ? badge(ep.signature_scheme, "scheme") : null,
        ep.disabled_reason ? badge(`disabled: ${ep.disabled_reason}`, "failing") : null),
      h("p", { class: "meta" }, `${ep.id} · ${categoriesText(ep.event_categories)} · created `, when(ep.created_at))));
    show(h("h1", {}, "Endpoints"),
      can("webhooks:write") ? createEndpointForm(list.data.length === 0, categoriesOf(types))
        : h("p", { class: "hint" }, "This key can look but not change: it lacks the webhooks:write scope."),
      items.length ? h("ul", { class: "cards", id: "endpoint-list" }, items) : h("p", { class: "empty" }, "No endpoints yet."));
  }

  function createEndpointForm(open, categories) {
    const url = h("input", { type: "url", required: true, placeholder: "https://example.com/webhooks", autocomplete: "url" });
    const epoch = select([["webhook_creation", "events created from now on"], ["beginning_of_time", "earlier events too"]], "webhook_creation");
    const scheme = select(SCHEMES, "platform");
    const pace = paceInput(null);
    const order = select(ORDERS, "none");
    const form = h("form", {},
      field("URL", url, "HTTPS only; its host must answer a TLS handshake now."),
      checkboxes("Categories", "category", categories, new Set(), new Set(), "None checked: every category."),
      h("div", { class: "row" }, field("Events", epoch), field("Signature scheme", scheme)),
      h("div", { class: "row" }, field("Pace (deliveries per second)", pace, PACE_HINT), field("Order", order, ORDER_HINT)),
      h("button", { type: "submit", class: "primary" }, "Create endpoint"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button[type=submit]"), async () => {
        const body = { url: url.value.trim(), event_epoch: epoch.value };
        const categories = checkedValues(form, "category");
        if (categories.length) body.event_categories = categories;
        // `platform` is the default; name the scheme only when it is another.
        if (scheme.value !== "platform") body.signature_scheme = scheme.value;
        if (paceValue(pace) !== null) body.rate_limit_per_second = paceValue(pace);
        if (order.value !== "none") body.ordering = order.value;
        const created = await api("POST", "/webhooks", body);
        notice("Endpoint created, disabled: activate it to receive events.");
        go(endpointPath(created.id));
      });
    });
    return h("details", { class: "panel", open }, h("summary", {}, "New endpoint"), form);
  }

  async function viewEndpoint(id, current) {
    const path = `/webhooks/${encodeURIComponent(id)}`;
    const [endpoint, types] = await Promise.all([api("GET", path), eventTypes()]);
    if (!current()) return;
    const top = h("div", {});
    const upcoming = h("section", { "aria-labelledby": "upcoming-h" });
    const logs = h("section", { "aria-labelledby": "logs-h" });
    const reload = async () => {
      const fresh = await api("GET", path);
      if (!current()) return;
      renderEndpointTop(top, fresh, path, reload, refreshLists, types);
      // The button that was pressed is gone: keep the focus in the view.
      if (!top.contains(document.activeElement)) {
        const heading = top.querySelector("h1");
        heading.tabIndex = -1;
        heading.focus({ preventScroll: true });
      }
    };
    const upcomingView = upcomingSection(upcoming, path);
    const logsView = logsSection(logs, path);
    // New log entries move the endpoint's health, which the service may
    // write just after them: read it again with them and once more after.
    let healthReads = 0;
    const refreshLists = async () => {
      const [, added] = await Promise.all([upcomingView.refresh(), logsView.refresh()]);
      if (added) healthReads = 2;
      if (!healthReads) return;
      healthReads -= 1;
      const fresh = await api("GET", path);
      if (current()) updateHealth(top, fresh);
    };
    renderEndpointTop(top, endpoint, path, reload, refreshLists, types);
    show(h("p", { class: "back" }, h("a", { href: "#/endpoints" }, "← All endpoints")), top, upcoming, logs);
    await refreshLists();
    if (current()) startRefresh(refreshLists);
  }

  const healthText = (health, field) => (health ? when(health[field]) : "not reported");

  /** Shows the endpoint's health as `ep` has it, leaving the rest of the page (and any open form) alone. */
  function updateHealth(top, ep) {
    for (const dd of top.querySelectorAll("dd[data-health]")) {
      dd.replaceChildren(healthText(ep.health, dd.dataset.health));
    }
  }

  function renderEndpointTop(top, ep, path, reload, refreshLists, types) {
    const write = can("webhooks:write");
    const actions = write ? h("div", { class: "actions" },
      ep.status === "active"
        ? h("button", { type: "button", onclick: (e) => run(e.currentTarget, async () => {
          await api("PUT", path, { status: "disabled" });
          notice("Endpoint disabled: events wait as upcoming.");
          await reload();
        }) }, "Disable")
        : h("button", { type: "button", class: "primary", onclick: (e) => run(e.currentTarget, async () => {
          await api("PUT", path, { status: "active" });
          notice("Endpoint active: new events are delivered.");
          await reload();
        }) }, "Activate"),
      h("button", { type: "button", onclick: (e) => run(e.currentTarget, async () => {
        const rotated = await api("POST", `${path}/rotate_key`);
        notice(`Key rotated. The previous key also signs until ${rotated.previous_key_expires_at ? utc(rotated.previous_key_expires_at) : "the overlap ends"}.`);
        await reload();
      }) }, "Rotate key"),
      confirmButton("Delete", "Delete this endpoint for good?", async () => {
        await api("DELETE", path);
        notice("Endpoint deleted.");
        go("#/endpoints");
      })) : null;

    const health = ep.health;
    const details = h("dl", { class: "details" },
      h("dt", {}, "ID"), h("dd", { class: "mono" }, ep.id),
      h("dt", {}, "Signature scheme"), h("dd", {}, ep.signature_scheme || "platform"),
      h("dt", {}, "Events"), h("dd", {}, ep.event_epoch === "beginning_of_time" ? "earlier events too" : "from creation on"),
      h("dt", {}, "Categories"), h("dd", {}, categoriesText(ep.event_categories)),
      h("dt", {}, "Event types"), h("dd", {}, typesText(ep.event_types)),
      h("dt", {}, "Pace"), h("dd", {}, paceText(ep.rate_limit_per_second)),
      h("dt", {}, "Order"), h("dd", {}, orderText(ep.ordering)),
      h("dt", {}, "Last success"), h("dd", { "data-health": "last_success_at" }, healthText(health, "last_success_at")),
      h("dt", {}, "Last failure"), h("dd", { "data-health": "last_failure_at" }, healthText(health, "last_failure_at")),
      h("dt", {}, "Failing since"), h("dd", { "data-health": "failing_since" }, healthText(health, "failing_since")),
      h("dt", {}, "Created"), h("dd", {}, when(ep.created_at)),
      h("dt", {}, "Updated"), h("dd", {}, when(ep.updated_at)));

    const keys = h("section", { class: "panel key-panel", "aria-labelledby": "key-h" },
      h("h2", { id: "key-h" }, "Public key"),
      h("p", { class: "hint" }, "Receivers verify each delivery's signature with it."),
      h("pre", { class: "key", id: "public-key" }, ep.public_key),
      copyButton("Copy the public key", () => ep.public_key),
      ep.previous_public_key ? [
        h("h3", {}, "Previous key, still signing until ", when(ep.previous_key_expires_at)),
        h("pre", { class: "key", id: "previous-public-key" }, ep.previous_public_key),
        copyButton("Copy the previous public key", () => ep.previous_public_key),
      ] : null);

    top.replaceChildren(...present([
      h("h1", { class: "url" }, ep.url),
      h("div", { class: "badges" }, badge(ep.status), badge(ep.signature_scheme || "platform", "scheme"),
        ep.disabled_reason ? badge(`disabled by the service: ${ep.disabled_reason}`, "failing") : null),
      actions, h("div", { class: "overview" }, details, keys),
      write ? testForm(ep, path, types, refreshLists) : null,
      write ? editForm(ep, path, reload, categoriesOf(types)) : null,
      write ? recoverForm(path, refreshLists) : null]));
  }

  /** Sends the example of a catalog type to the endpoint now (POST /webhooks/{id}/test). */
  function testForm(ep, path, types, refreshLists) {
    // The endpoint's own categories and types first: what it would get.
    const wanted = (t) => (!ep.event_categories || !ep.event_categories.length || ep.event_categories.includes(t.category))
      && (!ep.event_types || !ep.event_types.length || ep.event_types.includes(t.name));
    const ordered = [...types.filter(wanted), ...types.filter((t) => !wanted(t))];
    const type = select(ordered.map((t) => [t.name, t.deprecated ? `${t.name} (deprecated)` : t.name]), ordered.length ? ordered[0].name : "");
    type.name = "test-event-type";
    const result = h("p", { class: "result", role: "status", id: "test-result" });
    const form = h("form", {},
      h("p", { class: "hint" }, "Sends the type's example to this endpoint now, marked \"test\": true and signed like every delivery, whether the endpoint is active or not. One attempt, no retry; it is not kept as an event or in the log."),
      field("Test event type", type), h("button", { type: "submit", class: "primary" }, "Send test"), result);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button[type=submit]"), async () => {
        result.textContent = "";
        const log = await api("POST", `${path}/test`, { event_type: type.value });
        const ok = log.status !== null && log.status >= 200 && log.status < 300 && !log.error;
        const answer = log.status !== null ? `HTTP ${log.status}` : "no answer";
        result.replaceChildren(badge(ok ? "delivered" : "failed", ok ? "ok" : "bad"),
          ` ${answer}${log.error ? ` (${log.error})` : ""} in ${log.duration_ms} ms · event `, h("span", { class: "mono" }, log.event_id));
        await refreshLists();
      });
    });
    return h("details", { class: "panel", id: "test-event" }, h("summary", {}, "Send a test event"), form);
  }

  function editForm(ep, path, reload, categories) {
    const url = h("input", { type: "url", required: true, value: ep.url });
    const scheme = select(SCHEMES, ep.signature_scheme || "platform");
    const pace = paceInput(ep.rate_limit_per_second);
    const order = select(ORDERS, ep.ordering || "none");
    const form = h("form", {},
      field("URL", url, "The URL can change only while the endpoint is disabled."),
      checkboxes("Categories", "edit-category", categories, new Set(ep.event_categories || []), new Set(), "None checked: every category."),
      field("Signature scheme", scheme, "Changing it makes a new key pair; the old key keeps signing for an overlap."),
      h("div", { class: "row" }, field("Pace (deliveries per second)", pace, PACE_HINT),
        field("Order", order, `${ORDER_HINT} Back to any order, the events waiting for their turn go at once.`)),
      h("button", { type: "submit", class: "primary" }, "Save changes"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button[type=submit]"), async () => {
        const body = {};
        if (url.value.trim() !== ep.url) body.url = url.value.trim();
        const categories = checkedValues(form, "edit-category");
        if (categories.slice().sort().join() !== (ep.event_categories || []).slice().sort().join()) body.event_categories = categories;
        if (scheme.value !== (ep.signature_scheme || "platform")) body.signature_scheme = scheme.value;
        // An emptied pace is sent as null, which removes the limit.
        if (paceValue(pace) !== (ep.rate_limit_per_second ?? null)) body.rate_limit_per_second = paceValue(pace);
        if (order.value !== (ep.ordering || "none")) body.ordering = order.value;
        if (!Object.keys(body).length) return notice("Nothing to change.");
        await api("PUT", path, body);
        notice("Endpoint saved.");
        await reload();
      });
    });
    return h("details", { class: "panel" }, h("summary", {}, "Edit endpoint"), form);
  }

  function recoverForm(path, refreshLists) {
    const since = h("input", { type: "datetime-local", step: 1, required: true });
    const until = h("input", { type: "datetime-local", step: 1 });
    const result = h("p", { class: "result", role: "status", id: "recover-result" });
    const form = h("form", {},
      h("p", { class: "hint" }, "Queues again every event of the window whose delivery failed or is still upcoming. Times are your local time."),
      h("div", { class: "row" }, field("From", since), field("Until (empty: now)", until)),
      h("button", { type: "submit", class: "primary" }, "Recover"), result);
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button[type=submit]"), async () => {
        result.textContent = "";
        const body = { since: new Date(since.value).toISOString() };
        if (until.value) body.until = new Date(until.value).toISOString();
        const answer = await api("POST", `${path}/recover`, body);
        result.textContent = `${answer.queued} queued`;
        await refreshLists();
      });
    });
    return h("details", { class: "panel" }, h("summary", {}, "Recover a time window"), form);
  }

  function table(headings, id) {
    return h("div", { class: "table" }, h("table", { id },
      h("thead", {}, h("tr", {}, headings.map((text) => h("th", { scope: "col" }, text)))), h("tbody", {})));
  }
  const cell = (label, ...content) => h("td", { "data-label": label }, h("div", {}, ...content));

  /** How an upcoming delivery's state reads, where its name alone says too little. */
  const STATE_TEXT = { waiting: "waiting for its turn" };

  function upcomingSection(section, path) {
    const tbl = table(["Event", "Type", "Created", "Delivery", ""], "upcoming");
    const empty = h("p", { class: "empty" }, "Nothing upcoming.");
    let shown = null;
    section.append(h("h2", { id: "upcoming-h" }, "Upcoming events"),
      h("p", { class: "hint" }, "Events meant for this endpoint that it has not been sent yet, oldest first. Refreshes every few seconds."),
      tbl, empty);
    const refresh = async () => {
      const list = await api("GET", `${path}/events?limit=${UPCOMING_LIMIT}`);
      const signature = JSON.stringify(list.data.map((e) => [e.event_id, e.delivery || null]));
      if (signature === shown) return;
      shown = signature;
      tbl.hidden = !list.data.length;
      empty.hidden = !!list.data.length;
      tbl.querySelector("tbody").replaceChildren(...list.data.map((ev) => {
        const d = ev.delivery;
        return h("tr", { "data-event-id": ev.event_id },
          cell("Event", h("span", { class: "mono" }, ev.event_id), h("br"), `#${ev.event_sequence} · ${ev.event_category}`),
          cell("Type", ev.event_type ? typeName(ev.event_type) : "—"),
          cell("Created", when(ev.event_created_at)),
          cell("Delivery", d ? [badge(STATE_TEXT[d.state] || d.state, "state"), ` ${d.attempts} attempt${d.attempts === 1 ? "" : "s"}`,
            d.next_attempt_at ? [", next ", when(d.next_attempt_at)] : null] : "—"),
          cell("", can("webhooks:write") ? h("button", { type: "button", "aria-label": `Send ${ev.event_id}`,
            onclick: (e) => run(e.currentTarget, async () => {
              const answer = await api("POST", `${path}/send`, { event_id: ev.event_id });
              notice(answer && answer.message ? answer.message : "Queued.");
              await refresh();
            }) }, "Send") : null));
      }));
    };
    return { refresh };
  }

  function logsSection(section, path) {
    const tbl = table(["Time", "Event", "Attempt", "Result", "Duration", "Response"], "logs");
    const tbody = tbl.querySelector("tbody");
    const empty = h("p", { class: "empty" }, "No deliveries yet.");
    const older = h("button", { type: "button", hidden: true }, "Older");
    const seen = new Set();
    let last = null;
    // The log's filters (GET …/logs?status=&event_type=), kept by every page.
    let filter = "";
    const status = select([["", "All attempts"], ["failed", "Failed"], ["succeeded", "Succeeded"]], "");
    const eventType = h("input", { type: "text", name: "event-type", autocomplete: "off", spellcheck: "false" });
    // A search landmark of its own: its "Event type" is the log's filter, not the test event's type.
    const filters = h("form", { class: "filters", role: "search", "aria-label": "Filter the delivery log" },
      field("Status", status), field("Event type", eventType, "An exact type, such as transfer.created; empty for all."),
      h("button", { type: "submit" }, "Filter"));
    filters.addEventListener("submit", (event) => {
      event.preventDefault();
      run(filters.querySelector("button"), async () => {
        const params = new URLSearchParams();
        if (status.value) params.set("status", status.value);
        if (eventType.value.trim()) params.set("event_type", eventType.value.trim());
        filter = params.toString() ? `&${params}` : "";
        empty.textContent = filter ? "No attempt matches these filters." : "No deliveries yet.";
        seen.clear();
        tbody.replaceChildren();
        last = null;
        await refresh();
      });
    });
    status.addEventListener("change", () => filters.requestSubmit());
    section.append(h("h2", { id: "logs-h" }, "Delivery log"),
      h("p", { class: "hint" }, "Every attempt, newest first. Refreshes every few seconds."), filters, tbl, empty, older);

    /** The event as it was sent, read when its panel first opens. */
    const payload = (log) => {
      const pre = h("pre", { class: "payload" }, "Loading…");
      return h("details", {
        ontoggle: (event) => {
          const panel = event.currentTarget;
          if (!panel.open || panel.dataset.loaded) return;
          panel.dataset.loaded = "yes";
          run(null, async () => {
            try {
              const sent = await api("GET", `/webhook_events/${encodeURIComponent(log.event_id)}`);
              delete sent.deliveries;
              pre.textContent = JSON.stringify(sent, null, 2);
            } catch (error) {
              delete panel.dataset.loaded;
              pre.textContent = "Not available.";
              throw error;
            }
          });
        },
      }, h("summary", {}, "Payload sent"), pre);
    };

    const row = (log) => {
      const ok = log.status !== null && log.status >= 200 && log.status < 300;
      const result = log.status !== null ? badge(String(log.status), ok ? "ok" : "bad") : badge(log.error || "error", "bad");
      const body = log.response_body
        ? h("details", {}, h("summary", {}, `${log.response_body.length} characters`), h("pre", {}, log.response_body))
        : null;
      return h("tr", { "data-log-id": log.id, "data-event-id": log.event_id },
        cell("Time", when(log.created_at)),
        cell("Event", h("span", { class: "mono" }, log.event_id), log.event_type ? [h("br"), typeName(log.event_type)] : null),
        cell("Attempt", String(log.attempt)),
        cell("Result", result, log.status !== null && log.error ? ` ${log.error}` : null,
          log.error_detail ? h("p", { class: "why" }, log.error_detail) : null),
        cell("Duration", `${log.duration_ms} ms`), cell("Response", body, payload(log)));
    };
    const hasMore = (page) => (typeof page.has_more === "boolean" ? page.has_more : page.data.length === LOG_PAGE);
    const update = () => {
      tbl.hidden = !seen.size;
      empty.hidden = !!seen.size;
    };

    const refresh = async () => {
      const page = await api("GET", `${path}/logs?limit=${LOG_PAGE}${filter}`);
      const fresh = page.data.filter((log) => !seen.has(log.id));
      if (fresh.length === page.data.length && seen.size && hasMore(page)) {
        // More new entries than a page: start over from the newest.
        seen.clear();
        tbody.replaceChildren();
      }
      if (!seen.size) {
        last = page.data.length ? page.data[page.data.length - 1].id : null;
        older.hidden = !hasMore(page);
      }
      fresh.forEach((log) => seen.add(log.id));
      tbody.prepend(...fresh.map(row));
      update();
      return fresh.length;
    };
    older.addEventListener("click", () => run(older, async () => {
      const page = await api("GET", `${path}/logs?limit=${LOG_PAGE}${filter}&starting_after=${encodeURIComponent(last)}`);
      const rows = page.data.filter((log) => !seen.has(log.id));
      rows.forEach((log) => seen.add(log.id));
      tbody.append(...rows.map(row));
      if (page.data.length) last = page.data[page.data.length - 1].id;
      older.hidden = !hasMore(page);
      update();
    }));
    return { refresh };
  }

  // ---- API keys ------------------------------------------------------------------------

  async function viewKeys(current, createdKey) {
    if (!can("api_keys:read")) {
      return show(h("h1", {}, "API keys"), h("p", {}, "This key cannot list API keys: it lacks the api_keys:read scope."));
    }
    const list = await api("GET", "/api_keys");
    if (!current()) return;
    const created = h("div", {});
    const rows = list.data.map((key) => h("tr", { "data-key-id": key.id },
      cell("Name", key.name || "—", key.id === state.me.id ? h("span", { class: "this" }, " (this key)") : null),
      cell("Key", h("span", { class: "mono" }, `${key.prefix}-…${key.last_4}`)),
      cell("Type", key.type),
      cell("Scopes", key.scopes.includes(UNRESTRICTED) ? "unrestricted" : key.scopes.join(", ")),
      cell("Created", when(key.created_at)),
      cell("", can("api_keys:write") ? confirmButton("Delete", "Delete this key? It stops working at once.", async () => {
        await api("DELETE", `/api_keys/${encodeURIComponent(key.id)}`);
        if (key.id === state.me.id) return signOut("You deleted the key you signed in with.");
        notice("API key deleted.");
        route();
      }) : null)));
    const tbl = table(["Name", "Key", "Type", "Scopes", "Created", ""], "keys");
    tbl.querySelector("tbody").append(...rows);
    show(h("h1", {}, "API keys"), created, can("api_keys:write") ? createKeyForm(current) : null,
      h("h2", {}, "Active keys"), tbl);
    if (createdKey) showCreatedKey(created, createdKey);
  }

  function createKeyForm(current) {
    const name = h("input", { type: "text", maxlength: 100, autocomplete: "off" });
    const held = new Set(SCOPES.filter((s) => !can(s)));
    const form = h("form", {},
      field("Name (optional)", name),
      checkboxes("Scopes", "scope", SCOPES, new Set(), held,
        can(UNRESTRICTED) ? "None checked: unrestricted." : "A key can only give scopes it holds itself."),
      h("button", { type: "submit", class: "primary" }, "Create key"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button[type=submit]"), async () => {
        const body = {};
        if (name.value.trim()) body.name = name.value.trim();
        const scopes = checkedValues(form, "scope");
        if (scopes.length) body.scopes = scopes;
        const answer = await api("POST", "/api_keys", body);
        await viewKeys(current, answer);
      });
    });
    return h("details", { class: "panel" }, h("summary", {}, "New API key"), form);
  }

  function showCreatedKey(box, answer) {
    const value = h("input", { type: "text", readonly: true, value: answer.key, class: "mono", spellcheck: "false" });
    box.replaceChildren(h("section", { class: "panel secret", "aria-labelledby": "secret-h" },
      h("h2", { id: "secret-h" }, `New key${answer.name ? ` “${answer.name}”` : ""} created`),
      h("p", { class: "warning" }, "Copy it now: it will not be shown again."),
      field("The new API key", value),
      h("div", { class: "actions" }, copyButton("Copy the new API key", () => answer.key, "primary"),
        h("button", { type: "button", onclick: () => { box.replaceChildren(); $("view").querySelector("h1").focus(); } }, "Done"))));
    value.focus();
    value.select();
  }

  // ---- signature checker ------------------------------------------------------------------------
  // The rules of the receiver kits (kits/README.md): the key picks the scheme and
  // only that scheme's headers count; every signature is tried; the replay window
  // is looked at only once a signature verified. Refusals use the kits' reasons.

  const utf8 = (text) => new TextEncoder().encode(text);
  const PLATFORM_WINDOW_MS = 10 * 60 * 1000;
  const STANDARD_WINDOW_MS = 5 * 60 * 1000;

  /** Standard base64, padding optional; null when it is not base64. */
  function base64(text) {
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(text) || text.replace(/=+$/, "").length % 4 === 1) return null;
    try { return Uint8Array.from(atob(text), (c) => c.charCodeAt(0)); } catch { return null; }
  }

  class Refused {
    constructor(reason, detail) { this.reason = reason; this.detail = detail; }
  }
  class Unusable {
    constructor(detail) { this.detail = detail; }
  }
  const malformed = (detail) => new Refused("malformed header", detail);

  /** `Name: value` lines into a Map by lower-case name (a bare `t=…,v0=…` line is X-Webhook-Signature); names given twice are noted. */
  function parseHeaders(text) {
    const headers = new Map();
    const twice = new Set();
    for (const line of text.split(/\r?\n/).map((l) => l.trim()).filter(Boolean)) {
      const named = /^([A-Za-z0-9-]+)\s*:(.*)$/.exec(line);
      const [name, value] = named ? [named[1].toLowerCase(), named[2].trim()] : /^t=/.test(line) ? ["x-webhook-signature", line] : [null, null];
      if (!name) continue;
      if (headers.has(name)) twice.add(name);
      headers.set(name, value);
    }
    return { get: (name) => headers.get(name), twice: (name) => twice.has(name) };
  }

  /** The DER of a SubjectPublicKeyInfo around a PKCS#1 RSAPublicKey. */
  function spkiFromPkcs1(pkcs1) {
    const length = (n) => (n < 128 ? [n] : n < 256 ? [0x81, n] : [0x82, n >> 8, n & 0xff]);
    const der = (tag, content) => [tag, ...length(content.length), ...content];
    const rsaEncryption = [0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00];
    return Uint8Array.from(der(0x30, [...rsaEncryption, ...der(0x03, [0, ...pkcs1])]));
  }

  async function rsaKey(pem) {
    const block = /-----BEGIN (RSA )?PUBLIC KEY-----([\s\S]*?)-----END \1?PUBLIC KEY-----/.exec(pem);
    const der = block && base64(block[2].replace(/\s+/g, ""));
    if (!der) throw new Unusable("the key is not a PEM public key");
    let key;
    try {
      key = await crypto.subtle.importKey("spki", block[1] ? spkiFromPkcs1(der) : der, { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" }, false, ["verify"]);
    } catch {
      throw new Unusable("the PEM is not an RSA public key");
    }
    if (key.algorithm.modulusLength < 2048) throw new Unusable(`the RSA key has ${key.algorithm.modulusLength} bits; the platform's have 2048`);
    return key;
  }

  async function verifyPlatform(headers, body, pem) {
    const header = headers.get("x-webhook-signature");
    if (header === undefined) return new Refused("no signature header", "no X-Webhook-Signature header was given");
    if (headers.twice("x-webhook-signature")) return malformed("X-Webhook-Signature is given twice");
    const ts = [];
    const signatures = [];
    for (const part of header.split(",").map((p) => p.trim())) {
      const at = part.indexOf("=");
      if (at < 0) return malformed(`the entry "${part}" has no "="`);
      const [name, value] = [part.slice(0, at).trim(), part.slice(at + 1).trim()];
      if (name === "t") ts.push(value);
      if (name !== "v0") continue;
      const bytes = base64(value);
      if (!bytes) return malformed("a v0 signature is not base64");
      signatures.push(bytes);
    }
    if (ts.length !== 1 || !/^\d{1,15}$/.test(ts[0])) return malformed("it needs one t=<unix milliseconds>");
    if (!signatures.length) return malformed("it has no v0= signature");
    const key = await rsaKey(pem);
    const digest = await crypto.subtle.digest("SHA-256", utf8(`${ts[0]}.${body}`));
    for (const signature of signatures) {
      if (await crypto.subtle.verify("RSASSA-PKCS1-v1_5", key, signature, digest)) {
        return { scheme: "platform", signedMs: Number(ts[0]), windowMs: PLATFORM_WINDOW_MS };
      }
    }
    return new Refused("no signature matches", `none of ${signatures.length} v0 signature${signatures.length === 1 ? "" : "s"} verifies this body and t with this key`);
  }

  async function verifyStandard(headers, body, whpk) {
    const raw = base64(whpk.slice(5));
    if (!raw || raw.length !== 32) throw new Unusable("a whpk_ key is the base64 of 32 bytes");
    const header = headers.get("webhook-signature");
    if (header === undefined) return new Refused("no signature header", "no webhook-signature header was given");
    const names = ["webhook-id", "webhook-timestamp", "webhook-signature"];
    const given = names.find((n) => headers.twice(n));
    if (given) return malformed(`${given} is given twice`);
    const [id, timestamp] = names.map((n) => headers.get(n));
    if (!id) return malformed("webhook-id is missing or empty");
    if (!timestamp || !/^\d{1,15}$/.test(timestamp)) return malformed("webhook-timestamp is not unix seconds");
    const entries = header.split(/\s+/).filter(Boolean);
    if (!entries.length) return malformed("webhook-signature is empty");
    const signatures = [];
    for (const entry of entries) {
      const comma = entry.indexOf(",");
      if (comma < 0) return malformed(`the entry "${entry.slice(0, 12)}…" has no ","`);
      if (entry.slice(0, comma) !== "v1a") continue;
      const bytes = base64(entry.slice(comma + 1));
      if (!bytes) return malformed("a v1a signature is not base64");
      signatures.push(bytes);
    }
    let key;
    try {
      key = await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    } catch {
      throw new Unusable("this browser cannot check Ed25519 signatures");
    }
    const signed = utf8(`${id}.${timestamp}.${body}`);
    for (const signature of signatures) {
      if (await crypto.subtle.verify({ name: "Ed25519" }, key, signature, signed)) {
        return { scheme: "standard", signedMs: Number(timestamp) * 1000, windowMs: STANDARD_WINDOW_MS };
      }
    }
    return new Refused("no signature matches", signatures.length
      ? `none of ${signatures.length} v1a signature${signatures.length === 1 ? "" : "s"} verifies this body, id and timestamp with this key`
      : "webhook-signature has no v1a entry (v1 is an HMAC, which a public key cannot check)");
  }

  /** A genuine outcome (`scheme`, `signedMs`, `windowMs`), a `Refused` or an `Unusable`. */
  async function checkSignature(headersText, body, keyText) {
    if (!window.crypto || !crypto.subtle) return new Unusable("this page is not in a secure context (HTTPS or localhost), so the browser offers no WebCrypto");
    const key = keyText.trim();
    const headers = parseHeaders(headersText);
    try {
      if (key.startsWith("whpk_")) return await verifyStandard(headers, body, key);
      if (key.startsWith("-----BEGIN")) return await verifyPlatform(headers, body, key);
      return new Unusable("the key is neither a PEM public key (platform scheme) nor a whpk_ key (standard scheme)");
    } catch (error) {
      if (error instanceof Unusable) return error;
      throw error;
    }
  }

  function age(ms) {
    const s = Math.round(Math.abs(ms) / 1000);
    const text = s < 120 ? `${s} s` : s < 7200 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} days`;
    return ms < 0 ? `${text} in the future` : `${text} ago`;
  }

  function viewChecker() {
    const headers = h("textarea", { rows: 4, spellcheck: "false", class: "mono",
      placeholder: "X-Webhook-Signature: t=…,v0=…\n\nor, for the standard scheme:\nwebhook-id: …\nwebhook-timestamp: …\nwebhook-signature: v1a,…" });
    const body = h("textarea", { rows: 6, spellcheck: "false", class: "mono" });
    const key = h("textarea", { rows: 5, spellcheck: "false", class: "mono", placeholder: "-----BEGIN PUBLIC KEY-----\n…\n-----END PUBLIC KEY-----  or  whpk_…" });
    const result = h("div", { class: "result", role: "status", id: "check-result" });
    const form = h("form", { class: "panel" },
      field("Signature headers", headers, "One “Name: value” per line. A bare X-Webhook-Signature value (t=…,v0=…) works too."),
      field("Raw body", body, "Exactly as received, byte for byte."),
      field("Public key", key, "The endpoint's public_key: a PEM (platform scheme) or whpk_… (standard scheme)."),
      h("button", { type: "submit", class: "primary" }, "Check signature"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      run(form.querySelector("button"), async () => {
        result.replaceChildren();
        result.className = "result";
        const outcome = await checkSignature(headers.value, body.value, key.value);
        if (outcome instanceof Unusable) {
          result.classList.add("bad");
          result.append(h("strong", {}, `Cannot check: ${outcome.detail}`));
        } else if (outcome instanceof Refused) {
          result.classList.add("bad");
          result.append(h("strong", {}, `Not genuine: ${outcome.reason}`), h("p", {}, `${outcome.detail}.`));
        } else {
          const ageMs = Date.now() - outcome.signedMs;
          const stale = Math.abs(ageMs) > outcome.windowMs;
          result.classList.add(stale ? "warn" : "ok");
          const signed = new Date(outcome.signedMs);
          result.append(h("strong", {}, `Genuine: ${outcome.scheme} signature`),
            h("p", {}, "Signed ", Number.isNaN(signed.getTime()) ? "at no possible time" : when(signed.toISOString()), ` (${age(ageMs)}).`));
          if (stale) {
            result.append(h("p", { class: "stale" }, `Stale timestamp: more than ${outcome.windowMs / 60000} minutes from now, so a receiver refuses it as a possible replay.`));
          }
        }
        result.scrollIntoView({ block: "nearest" });
      });
    });
    show(h("h1", {}, "Signature checker"),
      h("p", {}, "Checks a delivery's signature here in your browser with WebCrypto; nothing you paste leaves the page."),
      form, result);
  }

  // ---- start ------------------------------------------------------------------------

  $("alert-close").addEventListener("click", clearError);
  $("sign-out").addEventListener("click", () => { clearError(); signOut(); });

  async function start() {
    takeSessionFromUrl();
    const saved = sessionStorage.getItem(KEY_STORAGE);
    if (saved) {
      try {
        state.me = await api("GET", "/api_keys/whoami", undefined, saved);
        state.key = saved;
      } catch (error) {
        sessionStorage.removeItem(KEY_STORAGE);
        if (error instanceof ApiError) showError(error.message);
      }
    }
    route();
  }
  start();
})();
