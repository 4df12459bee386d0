// The dashboard in a real Chromium (playwright-core), against a real
// `webhooks-api standalone` and an HTTPS receiver; started by tests/browser/run,
// which passes where everything is in DASHBOARD_* variables. Tests run in
// order and share one signed-in page; each sets up through the API what it
// needs and does not get from an earlier test. A screenshot of every page and
// state goes to DASHBOARD_SCREENSHOTS.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { readFile, readdir } from "node:fs/promises";
import { createServer } from "node:http";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = process.env;
const BASE = env.DASHBOARD_URL;
const INTERNAL = env.DASHBOARD_INTERNAL_URL;
const SHOTS = env.DASHBOARD_SCREENSHOTS;
const LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const LIVE = 15_000; // the page refreshes every 3 s; a delivery takes well under a second

const ctx = { problems: [] };
let browser;
let page;

// ---- helpers --------------------------------------------------------------------

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what, probe, timeout = 20_000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await probe().catch(() => undefined);
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(200);
  }
}

/** A call to the public API from the test (set-up and checks, not the UI). */
async function api(method, path, body, key = ctx.key) {
  const headers = { "Api-Key": key };
  if (method === "POST") headers["Idempotency-Key"] = crypto.randomUUID();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(`${BASE}/v0${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => null);
  return { status: response.status, data };
}

async function ingest(category, type = `${category}.created`) {
  const id = `obj_${crypto.randomUUID().slice(0, 8)}`;
  const response = await fetch(`${INTERNAL}/internal/events`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ developer_id: ctx.developerId, event_category: category, event_type: type,
      event_object_id: id, event_object: { id, note: "from the dashboard browser test" } }),
  });
  assert.equal(response.status, 201, `POST /internal/events answered ${response.status}`);
  return response.json();
}

/** Every request the receiver saved, in arrival order, with its body as text and headers by lower-case name. */
async function received() {
  const names = (await readdir(env.DASHBOARD_RECEIVER_DIR)).filter((n) => /^\d+\.json$/.test(n));
  names.sort((a, b) => parseInt(a, 10) - parseInt(b, 10));
  return Promise.all(names.map(async (name) => {
    const record = JSON.parse(await readFile(join(env.DASHBOARD_RECEIVER_DIR, name), "utf8"));
    const body = Buffer.from(record.body_base64, "base64").toString("utf8");
    return { ...record, body, headers: Object.fromEntries(record.headers.map(([n, v]) => [n.toLowerCase(), v])) };
  }));
}

async function delivered(eventId, timeout = LIVE) {
  return until(`the receiver to get event ${eventId}`, async () =>
    (await received()).find((r) => { try { return JSON.parse(r.body).event_id === eventId; } catch { return false; } }), timeout);
}

/** Saves a screenshot, and fails if the page shows a value that was never meant for it
 * (`meant`: a text the page is meant to show, such as an API message that names JSON's null). */
async function shot(name, target = page, meant = "") {
  await target.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  const stray = /\b(null|undefined|NaN)\b|\[object \w+\]|Invalid Date/.exec((await target.locator("body").innerText()).replace(meant, ""));
  assert.equal(stray, null, `${name}: the page shows "${stray && stray[0]}"`);
}

const alert = (target = page) => target.locator("#alert");

async function failOnAlert(doing, target) {
  if (await alert(target).isVisible()) {
    throw new Error(`${doing}: the dashboard shows the alert "${await target.locator("#alert-text").innerText()}"`);
  }
}

/** Fails with the API's message if the dashboard shows one. */
async function noAlert(doing, target = page) {
  await sleep(150);
  await failOnAlert(doing, target);
}

/** Waits until `locator` shows; fails at once with the API's message if the alert shows instead. */
async function shows(locator, doing, target = page, timeout = LIVE) {
  await until(doing, async () => (await alert(target).isVisible()) || (await locator.first().isVisible()), timeout);
  await failOnAlert(doing, target);
}

async function expectAlert(pattern, target = page) {
  await alert(target).waitFor({ state: "visible", timeout: 10_000 });
  const text = await alert(target).innerText();
  assert.match(text, pattern);
  return text;
}

async function signIn(key, target = page) {
  await target.goto(`${BASE}/dashboard#/signin`);
  const field = target.getByLabel("API key");
  await field.fill(key);
  await field.press("Enter"); // the keyboard is enough
}

async function signOut(target = page) {
  await target.getByRole("button", { name: "Sign out" }).click();
  await target.getByRole("heading", { name: "Sign in", level: 1 }).waitFor();
}

async function openEndpoint(id, target = page) {
  const url = `${BASE}/dashboard#/endpoints/${id}`;
  if (target.url() === url) await target.reload(); // a fresh page: no message left from before
  else await target.goto(url);
  // Going from another endpoint's view, that view shows until this one's
  // answer comes: wait for this endpoint's id, not just for a public key.
  await target.locator(".details dd", { hasText: new RegExp(`^${id}$`) }).waitFor();
}

/** Opens the `<details>` panel whose summary is `name`. */
async function openPanel(name, target = page) {
  const details = target.locator("details", { has: target.locator("summary", { hasText: name }) });
  if (!(await details.evaluate((el) => el.open))) await details.locator("summary").click();
  return details;
}

/** An endpoint made through the API (for tests that do not exercise creating one). */
async function endpointViaApi(path, fields = {}) {
  const { status, data } = await api("POST", "/webhooks", { url: `${ctx.receiver}${path}`, ...fields });
  assert.equal(status, 201, `POST /v0/webhooks answered ${status}: ${data && data.message}`);
  return data;
}

async function mainEndpoint() {
  if (!ctx.endpointId) ctx.endpointId = (await endpointViaApi("/hook/main", { event_categories: ["transfer", "customer"] })).id;
  return ctx.endpointId;
}

/** The text of the endpoint view's detail `name` (a `<dt>`). */
async function detail(name, target = page) {
  return (await target.locator("dt", { hasText: new RegExp(`^${name}$`) }).locator("xpath=following-sibling::dd[1]").innerText()).trim();
}

/** The body of the next `method` request to `/v0/webhooks…` that `action` makes the page send. */
async function sentBody(method, action) {
  const request = page.waitForRequest((r) => r.method() === method && /\/v0\/webhooks(\/|$)/.test(new URL(r.url()).pathname));
  await action();
  return (await request).postDataJSON();
}

async function setStatus(status) {
  const button = page.getByRole("button", { name: status === "active" ? "Activate" : "Disable", exact: true });
  if (await button.isVisible()) await button.click();
  await shows(page.getByRole("button", { name: status === "active" ? "Disable" : "Activate", exact: true }), `setting the endpoint ${status}`);
}

async function checkSignature(headers, body, key) {
  await page.goto(`${BASE}/dashboard#/checker`);
  await page.getByLabel("Signature headers").fill(headers);
  await page.getByLabel("Raw body").fill(body);
  await page.getByLabel("Public key").fill(key);
  await page.getByRole("button", { name: "Check signature" }).click();
  const result = page.locator("#check-result");
  await until("a checker result", async () => (await result.innerText()).trim());
  return result.innerText();
}

/** Every form control has a label; nothing is wider than the window. */
async function assertTidy(what, target = page) {
  const unlabelled = await target.evaluate(() => [...document.querySelectorAll("input, select, textarea")]
    .filter((el) => !el.labels.length && !el.getAttribute("aria-label")).map((el) => el.outerHTML));
  assert.deepEqual(unlabelled, [], `${what}: controls without a label`);
  const [scroll, width] = await target.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  assert.ok(scroll <= width, `${what}: the page is ${scroll} px wide in a ${width} px window`);
}

// ---- set-up ---------------------------------------------------------------------------

before(async () => {
  const first = await until("webhooks-api standalone to print its first key", async () => {
    const text = await readFile(env.DASHBOARD_FIRST_KEY, "utf8");
    return text.trim() && JSON.parse(text);
  }, 60_000);
  await until("webhooks-api to be ready", async () => (await fetch(`${INTERNAL}/readyz`)).ok, 60_000);
  ctx.key = first.key;
  ctx.developerId = first.api_key.owner_id;
  ctx.receiver = JSON.parse(await readFile(env.DASHBOARD_RECEIVER, "utf8")).base_url;

  browser = await chromium.launch({ executablePath: env.CHROMIUM || "/usr/bin/chromium", headless: true, args: LAUNCH_ARGS });
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  page = await context.newPage();
  watch(page);
});

/** Records script errors and CSP refusals of `target`; the last test fails on any. */
function watch(target) {
  target.on("pageerror", (error) => ctx.problems.push(`script error: ${error.message}`));
  target.on("console", (message) => {
    if (/Content Security Policy|Refused to/i.test(message.text())) ctx.problems.push(`console: ${message.text()}`);
  });
}

after(async () => {
  await browser?.close();
});

// ---- the tests --------------------------------------------------------------------------

test("the page is served with a strict Content-Security-Policy", async () => {
  const response = await fetch(`${BASE}/dashboard`);
  assert.equal(response.status, 200);
  const policy = response.headers.get("content-security-policy") || "";
  assert.match(policy, /script-src 'self'/);
  assert.match(policy, /connect-src 'self'/);
  assert.doesNotMatch(policy, /unsafe-inline/);
});

test("sign-in: a bad key shows the API's error message", async () => {
  await page.goto(`${BASE}/dashboard`);
  await page.getByRole("heading", { name: "Sign in", level: 1 }).waitFor();
  await shot("01-sign-in");
  await page.getByLabel("API key").fill("sk-test-0000000000000000000000000000000000000000000");
  await page.getByRole("button", { name: "Sign in" }).click();
  await expectAlert(/Invalid Api-Key header/);
  await shot("02-sign-in-bad-key");
});

test("sign-in: the key signs in, and is kept in session storage only", async () => {
  await signIn(ctx.key);
  await page.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
  await noAlert("signing in");
  assert.ok(!page.url().includes(ctx.key), "the key is in the URL");
  assert.equal(await page.evaluate(() => sessionStorage.getItem("webhooks-dashboard-api-key")), ctx.key);
  assert.equal(await page.evaluate(() => localStorage.length), 0, "something is in local storage");
  assert.deepEqual(await page.context().cookies(), [], "a cookie was set");
  assert.match(await page.locator("#who").innerText(), /unrestricted/);
  await shot("03-endpoints-empty");
});

test("endpoint: create, activate, an event arrives and its log row appears live", async () => {
  await page.goto(`${BASE}/dashboard#/endpoints`);
  await openPanel("New endpoint");
  await page.getByLabel("URL").fill(`${ctx.receiver}/hook/main`);
  await page.getByRole("checkbox", { name: "transfer", exact: true }).check();
  await page.getByRole("checkbox", { name: "customer", exact: true }).check();
  await shot("04-endpoint-create-form");
  await page.getByRole("button", { name: "Create endpoint" }).click();
  await shows(page.locator("#public-key"), "creating the endpoint");
  assert.match(page.url(), /#\/endpoints\/wep_[0-9a-f]{32}$/);
  ctx.endpointId = page.url().split("/").pop();
  assert.match(await page.locator("#public-key").innerText(), /BEGIN PUBLIC KEY/);
  await shot("05-endpoint-created");

  await setStatus("active");
  await page.evaluate(() => { window.notReloaded = true; });
  const event = await ingest("transfer");
  ctx.delivery = await delivered(event.event_id);
  const row = page.locator(`#logs tr[data-event-id="${event.event_id}"]`);
  await row.waitFor({ timeout: LIVE });
  assert.ok(await page.evaluate(() => window.notReloaded), "the page was reloaded");
  assert.match(await row.innerText(), /200/);
  await row.locator("summary", { hasText: "characters" }).click();
  await row.getByText('{"received":true}').waitFor();
  // The header's health follows the log, without a reload.
  const lastSuccess = page.locator("dt", { hasText: /^Last success$/ }).locator("xpath=following-sibling::dd[1]");
  await until("Last success shows the delivery", async () => /^\d{4}-\d\d-\d\d /.test(await lastSuccess.innerText()), LIVE);
  ctx.publicKey = await page.locator("#public-key").innerText();
  await shot("06-endpoint-active-log");
});

test("upcoming: an event for a disabled endpoint waits, and Send delivers it", async () => {
  await openEndpoint(await mainEndpoint());
  await setStatus("disabled");
  const event = await ingest("customer");
  const row = page.locator(`#upcoming tr[data-event-id="${event.event_id}"]`);
  await row.waitFor({ timeout: LIVE });
  await shot("07-upcoming");
  await row.getByRole("button", { name: /Send/ }).click();
  await noAlert("sending the event");
  await delivered(event.event_id);
  await page.locator(`#logs tr[data-event-id="${event.event_id}"]`).waitFor({ timeout: LIVE });
  await shot("08-sent-from-upcoming");
});

test("live refresh pauses while the tab is hidden and resumes when it shows", async () => {
  await openEndpoint(await mainEndpoint());
  const calls = [];
  const count = (request) => { if (/\/logs\?/.test(request.url())) calls.push(Date.now()); };
  page.on("request", count);
  try {
    await until("a live refresh", async () => calls.length > 0, 8_000);
    await page.evaluate(() => {
      Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
      document.dispatchEvent(new Event("visibilitychange"));
    });
    const hiddenAt = Date.now();
    await sleep(7_000);
    assert.deepEqual(calls.filter((at) => at > hiddenAt + 500), [], "the log was fetched while the tab was hidden");
    // Taken before the tab shows: the refresh it starts may be reported
    // before `evaluate` returns.
    const shownAt = Date.now();
    await page.evaluate(() => {
      delete document.hidden;
      document.dispatchEvent(new Event("visibilitychange"));
    });
    await until("a refresh once the tab shows", async () => calls.some((at) => at >= shownAt), 2_000);
  } finally {
    page.off("request", count);
  }
});

test("live refresh: a slow answer is waited for, never stacked on; a 503's Retry-After is kept", async () => {
  await openEndpoint(await mainEndpoint());
  const logs = (url) => /\/v0\/webhooks\/[^/]+\/logs$/.test(url.pathname);
  // The API's own answers, held back four seconds: longer than the refresh
  // interval, and the tab "shows again" twice while they wait.
  let inFlight = 0;
  let most = 0;
  let slow = 0;
  await page.route(logs, async (route) => {
    inFlight += 1;
    most = Math.max(most, inFlight);
    slow += 1;
    try {
      const response = await route.fetch();
      await sleep(4_000);
      await route.fulfill({ response });
    } finally {
      inFlight -= 1;
    }
  });
  try {
    await until("a held-back refresh", async () => inFlight > 0, 8_000);
    for (let i = 0; i < 2; i += 1) {
      await page.evaluate(() => document.dispatchEvent(new Event("visibilitychange")));
      await sleep(1_000);
    }
    await until("a second refresh after the slow one", async () => slow >= 2, 12_000);
    assert.equal(most, 1, `${most} log requests were in flight at once`);
    await until("the held-back answer", async () => inFlight === 0, 8_000);
  } finally {
    await page.unroute(logs);
  }
  // Busy: the API answers 503 with Retry-After: 12 (as a bounded read that
  // ran out of time does); the page waits that long before it asks again.
  const asked = [];
  await page.route(logs, async (route) => {
    asked.push(Date.now());
    await route.fulfill({
      status: 503,
      headers: { "Retry-After": "12", "Content-Type": "application/json" },
      json: { error: "unavailable", message: "The database is busy; try again in a few seconds." },
    });
  });
  try {
    await until("a refresh answered 503", async () => asked.length > 0, 8_000);
    await page.getByRole("alert").filter({ hasText: "The database is busy" }).waitFor({ timeout: LIVE });
    await page.evaluate(() => document.dispatchEvent(new Event("visibilitychange")));
    await sleep(9_000);
    assert.equal(asked.length, 1, "the page asked again before the Retry-After it was given");
    await until("the refresh after the Retry-After", async () => asked.length > 1, 8_000);
    assert.ok(asked[1] - asked[0] >= 11_500, `asked again after ${asked[1] - asked[0]} ms, not 12 s`);
  } finally {
    await page.unroute(logs);
  }
});

test("signature checker: a real delivery is genuine, a changed body is not", async () => {
  if (!ctx.delivery) {
    await openEndpoint(await mainEndpoint());
    await setStatus("active");
    ctx.delivery = await delivered((await ingest("transfer")).event_id);
    ctx.publicKey = await page.locator("#public-key").innerText();
  }
  const { headers, body } = ctx.delivery;
  const header = `X-Webhook-Signature: ${headers["x-webhook-signature"]}`;
  assert.match(await checkSignature(header, body, ctx.publicKey), /^Genuine/);
  await shot("09-checker-genuine");
  const changed = body.replace("from the dashboard browser test", "from someone else");
  assert.notEqual(changed, body);
  assert.match(await checkSignature(header, changed, ctx.publicKey), /^Not genuine: /);
  await shot("10-checker-not-genuine");

  if (env.DASHBOARD_SIGNATURE_VECTOR) {
    const vector = JSON.parse(await readFile(env.DASHBOARD_SIGNATURE_VECTOR, "utf8"));
    const text = await checkSignature(vector.header_value, vector.raw_body, vector.public_key_pem);
    assert.match(text, /^Genuine/, "the published example");
    assert.match(text, /Stale/, "the published example is old");
    await shot("11-checker-published-example-stale");
  }
});

test("signature checker: every vector of the receiver kits (kits/vectors/cases.json) as the kits judge it", async (t) => {
  if (!env.DASHBOARD_KIT_VECTORS) return t.skip("kits/vectors/cases.json is not there");
  const { cases } = JSON.parse(await readFile(env.DASHBOARD_KIT_VECTORS, "utf8"));
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const checker = await context.newPage();
  watch(checker);
  const wrong = [];
  let skipped = 0;
  try {
    await checker.goto(`${BASE}/dashboard#/checker`);
    for (const vector of cases) {
      const bytes = Buffer.from(vector.body_base64, "base64");
      let body;
      try { body = new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch { body = null; }
      if (body === null || body.includes("\r")) { skipped += 1; continue; } // a textarea cannot hold these bytes
      await checker.clock.setFixedTime(vector.now_ms); // the receiver's clock of the vector
      await checker.getByLabel("Signature headers").fill(Object.entries(vector.headers).map(([n, v]) => `${n}: ${v}`).join("\n"));
      await checker.getByLabel("Raw body").fill(body);
      await checker.getByLabel("Public key").fill(vector.key);
      await checker.getByRole("button", { name: "Check signature" }).click();
      const result = checker.locator("#check-result");
      const text = await until("a checker result", async () => (await result.innerText()).trim());
      const [verdict, reason] = vector.expect.split(/: (.*)/);
      const right = verdict === "genuine" ? text.startsWith(`Genuine: ${reason}`) && !/Stale/.test(text)
        : reason === "stale timestamp" ? /^Genuine: /.test(text) && /Stale timestamp/.test(text)
          : text.startsWith(`Not genuine: ${reason}`);
      if (!right) wrong.push(`${vector.name}: expected "${vector.expect}", the page says "${text.replace(/\s+/g, " ")}"`);
    }
  } finally {
    await context.close();
  }
  t.diagnostic(`${cases.length - skipped} vectors checked, ${skipped} skipped (bodies a textarea cannot hold)`);
  assert.deepEqual(wrong, []);
});

test("rotate key: the new key is shown with the previous one", async () => {
  await openEndpoint(await mainEndpoint());
  const old = await page.locator("#public-key").innerText();
  await page.getByRole("button", { name: "Rotate key" }).click();
  await shows(page.locator("#previous-public-key"), "rotating the key (POST /v0/webhooks/{id}/rotate_key, API.md §8.2)");
  assert.equal(await page.locator("#previous-public-key").innerText(), old);
  assert.notEqual(await page.locator("#public-key").innerText(), old);
  await shot("12-key-rotated");

  // During the overlap a delivery carries a signature per key: the old key still checks it.
  await setStatus("active");
  const delivery = await delivered((await ingest("transfer")).event_id);
  const header = delivery.headers["x-webhook-signature"];
  assert.equal(header.split(",").filter((part) => part.startsWith("v0=")).length, 2, `one v0 per key: ${header}`);
  assert.match(await checkSignature(`X-Webhook-Signature: ${header}`, delivery.body, old), /^Genuine/);
  await shot("12b-checker-previous-key");
});

test("recover: a time window queues what is upcoming and shows N queued", async () => {
  await openEndpoint(await mainEndpoint());
  await setStatus("disabled");
  const event = await ingest("transfer");
  await page.locator(`#upcoming tr[data-event-id="${event.event_id}"]`).waitFor({ timeout: LIVE });
  // Activated, the endpoint gets new events only: the held one stays upcoming until recovered.
  await setStatus("active");
  const panel = await openPanel("Recover a time window");
  const since = await page.evaluate(() => {
    const d = new Date(Date.now() - 10 * 60 * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  });
  await panel.getByLabel("From").fill(since);
  await panel.getByRole("button", { name: "Recover" }).click();
  await shows(page.locator("#recover-result:not(:empty)"), "recovering a window (POST /v0/webhooks/{id}/recover, API.md §8.6)");
  const result = (await page.locator("#recover-result").innerText()).trim();
  const queued = /^(\d+) queued$/.exec(result);
  assert.ok(queued, `the result reads "${result}"`);
  assert.ok(Number(queued[1]) >= 1, `${queued[1]} queued, expected at least the held event`);
  await delivered(event.event_id);
  await shot("13-recovered");
});

test("upcoming entries show their delivery state (`delivery` on GET /v0/webhooks/{id}/events)", async () => {
  await openEndpoint(await mainEndpoint());
  await setStatus("disabled");
  const event = await ingest("customer");
  const row = page.locator(`#upcoming tr[data-event-id="${event.event_id}"]`);
  await row.waitFor({ timeout: LIVE });
  await until("the delivery state on the upcoming row", async () => /held/.test(await row.innerText()), 8_000)
    .catch(() => { throw new Error("no delivery state on the upcoming row: the API's entries carry no `delivery`"); });
});

test("health: after a delivery the endpoint shows its last success (API.md §8.3)", async () => {
  await openEndpoint(await mainEndpoint());
  const { data } = await api("GET", `/webhooks/${ctx.endpointId}`);
  assert.ok(data.health, "GET /v0/webhooks/{id} has no `health`");
  assert.ok(data.health.last_success_at, "health.last_success_at is null after successful deliveries");
  const shown = await page.locator("dt", { hasText: /^Last success$/ }).locator("xpath=following-sibling::dd[1]").innerText();
  assert.ok(shown.startsWith(data.health.last_success_at.slice(0, 10)), `the page shows "${shown}"`);
});

test("logs: the Older button pages back through the delivery log", async () => {
  const endpoint = await endpointViaApi("/hook/paged", { event_categories: ["card_account"] });
  assert.equal((await api("PUT", `/webhooks/${endpoint.id}`, { status: "active" })).status, 200);
  const events = [];
  for (let i = 0; i < 23; i += 1) events.push(await ingest("card_account"));
  await until("23 logs", async () => (await api("GET", `/webhooks/${endpoint.id}/logs?limit=100`)).data.count >= 23);
  await openEndpoint(endpoint.id);
  await until("the first page of the log", async () => (await page.locator("#logs tbody tr").count()) === 20);
  const older = page.getByRole("button", { name: "Older" });
  await older.click();
  await until("the older entries", async () => (await page.locator("#logs tbody tr").count()) === 23);
  assert.ok(await older.isHidden(), "Older is still offered at the end of the log");
  const shown = await page.locator("#logs tbody tr").evaluateAll((rows) => rows.map((r) => r.dataset.eventId));
  assert.deepEqual(new Set(shown), new Set(events.map((e) => e.event_id)));
  await shot("15b-log-paged");
  await api("DELETE", `/webhooks/${endpoint.id}`);
});

test("logs: filtered by status and event type; a failed attempt says why; the payload sent shows (API.md §8.12)", async () => {
  const endpoint = await endpointViaApi("/fail/filters", { event_categories: ["virtual_account"] });
  assert.equal((await api("PUT", `/webhooks/${endpoint.id}`, { status: "active" })).status, 200);
  // Two types of one category, both in the default catalog (ingest refuses a type it lacks).
  const created = await ingest("virtual_account", "virtual_account.created");
  const updated = await ingest("virtual_account", "virtual_account.updated");
  await until("both events attempted", async () => {
    const types = new Set((await api("GET", `/webhooks/${endpoint.id}/logs?limit=100`)).data.data.map((l) => l.event_type));
    return types.has("virtual_account.created") && types.has("virtual_account.updated");
  });
  await openEndpoint(endpoint.id);
  const rows = page.locator("#logs tbody tr");
  const filters = page.getByRole("search", { name: "Filter the delivery log" });
  await rows.first().waitFor();
  const first = rows.first();
  assert.match(await first.innerText(), /503/);
  await first.locator(".why", { hasText: "HTTP 503 Service Unavailable" }).waitFor();

  // Status: nothing succeeded.
  await filters.getByLabel("Status").selectOption("succeeded");
  await page.getByText("No attempt matches these filters.").waitFor();
  assert.equal(await rows.count(), 0);
  await shot("15c-log-filter-none");
  await filters.getByLabel("Status").selectOption("failed");
  await rows.first().waitFor();

  // Event type: only that event's attempts.
  await filters.getByLabel("Event type").fill("virtual_account.updated");
  await filters.getByRole("button", { name: "Filter", exact: true }).click();
  await until("only the updated event's attempts", async () => {
    const ids = await rows.evaluateAll((all) => all.map((r) => r.dataset.eventId));
    return ids.length > 0 && ids.every((id) => id === updated.event_id);
  });
  await noAlert("filtering the log");
  assert.match(await rows.first().innerText(), /virtual_account\.updated/);
  await shot("15d-log-filtered");

  // The payload sent, as the receiver got it.
  const row = rows.first();
  await row.locator("summary", { hasText: "Payload sent" }).click();
  const pre = row.locator("pre.payload");
  await until("the payload", async () => (await pre.innerText()).includes(updated.event_id));
  const shown = JSON.parse(await pre.innerText());
  assert.equal(shown.event_type, "virtual_account.updated");
  assert.equal(shown.deliveries, undefined);
  assert.deepEqual(shown.event_object, updated.event_object);
  await shot("15e-log-payload");

  await filters.getByLabel("Event type").fill("");
  await filters.getByLabel("Status").selectOption("");
  await until("every attempt again", async () => {
    const ids = new Set(await rows.evaluateAll((all) => all.map((r) => r.dataset.eventId)));
    return ids.has(created.event_id) && ids.has(updated.event_id);
  });
  await api("DELETE", `/webhooks/${endpoint.id}`);
});

test("edit: the API's 409 refuses a URL change while active; disabled, the URL and categories change", async () => {
  await openEndpoint(await mainEndpoint());
  await setStatus("active");
  const form = await openPanel("Edit endpoint");
  const url = await page.locator("h1").innerText();
  await form.getByLabel("URL").fill(`${ctx.receiver}/hook/moved`);
  await form.getByRole("button", { name: "Save changes" }).click();
  await expectAlert(/disable the endpoint first|active/i);
  assert.equal(await page.locator("h1").innerText(), url);
  await shot("14-edit-refused-while-active");

  await setStatus("disabled");
  const again = await openPanel("Edit endpoint");
  await again.getByLabel("URL").fill(`${ctx.receiver}/hook/moved`);
  await again.getByRole("checkbox", { name: "kyc_link", exact: true }).check();
  await again.getByRole("button", { name: "Save changes" }).click();
  await noAlert("saving the disabled endpoint");
  await until("the new URL on the page", async () => (await page.locator("h1").innerText()) === `${ctx.receiver}/hook/moved`);
  const { data } = await api("GET", `/webhooks/${ctx.endpointId}`);
  assert.equal(data.url, `${ctx.receiver}/hook/moved`);
  assert.deepEqual([...data.event_categories].sort(), ["customer", "kyc_link", "transfer"]);
  await shot("15-edited");
});

test("pace and order: set in the new-endpoint form, shown on the endpoint, held by the API (API.md §8.5)", async () => {
  await page.goto(`${BASE}/dashboard#/endpoints`);
  const form = await openPanel("New endpoint");
  await form.getByLabel("URL").fill(`${ctx.receiver}/hook/paced`);
  await form.getByRole("checkbox", { name: "virtual_account", exact: true }).check();
  await form.getByLabel("Pace").fill("20");
  await form.getByLabel("Order").selectOption("ordered");
  await shot("15c-endpoint-create-paced-ordered");
  await form.getByRole("button", { name: "Create endpoint" }).click();
  await shows(page.locator("#public-key"), "creating a paced, ordered endpoint");
  ctx.pacedId = page.url().split("/").pop();
  const { data } = await api("GET", `/webhooks/${ctx.pacedId}`);
  assert.equal(data.rate_limit_per_second, 20);
  assert.equal(data.ordering, "ordered");
  assert.equal(await detail("Pace"), "20 deliveries/s");
  assert.equal(await detail("Order"), "in sequence");
  await shot("15d-endpoint-paced-ordered");

  // Without them, the endpoint has neither (and the page says so).
  await openEndpoint(await mainEndpoint());
  assert.equal(await detail("Pace"), "no limit");
  assert.equal(await detail("Order"), "any order");
});

test("pace and order: the edit form is filled from the endpoint, sends what changed, and an emptied pace removes the limit", async () => {
  const id = ctx.pacedId || (await endpointViaApi("/hook/paced", { rate_limit_per_second: 20, ordering: "ordered" })).id;
  await openEndpoint(id);
  let form = await openPanel("Edit endpoint");
  assert.equal(await form.getByLabel("Pace").inputValue(), "20");
  assert.equal(await form.getByLabel("Order").inputValue(), "ordered");
  await form.getByLabel("Pace").fill("35");
  let sent = await sentBody("PUT", () => form.getByRole("button", { name: "Save changes" }).click());
  assert.deepEqual(sent, { rate_limit_per_second: 35 });
  await until("the new pace on the page", async () => (await alert().isVisible()) || (await detail("Pace")) === "35 deliveries/s");
  await failOnAlert("saving a new pace");
  let { data } = await api("GET", `/webhooks/${id}`);
  assert.equal(data.rate_limit_per_second, 35);
  assert.equal(data.ordering, "ordered");

  form = await openPanel("Edit endpoint");
  assert.equal(await form.getByLabel("Pace").inputValue(), "35");
  await form.getByLabel("Pace").fill("");
  await form.getByLabel("Order").selectOption("none");
  await shot("15e-edit-pace-cleared");
  sent = await sentBody("PUT", () => form.getByRole("button", { name: "Save changes" }).click());
  assert.deepEqual(sent, { rate_limit_per_second: null, ordering: "none" });
  await until("no limit on the page", async () => (await alert().isVisible()) || (await detail("Pace")) === "no limit");
  await failOnAlert("removing the pace");
  assert.equal(await detail("Order"), "any order");
  ({ data } = await api("GET", `/webhooks/${id}`));
  assert.equal(data.rate_limit_per_second, null);
  assert.equal(data.ordering, "none");
  await shot("15f-edited-no-limit-any-order");
});

test("pace: out of range, the API's 400 message is shown and nothing changes", async () => {
  const RANGE = /rate_limit_per_second must be between 1 and 10000/;
  const id = (await endpointViaApi("/hook/range", { rate_limit_per_second: 5 })).id;
  await openEndpoint(id);
  const form = await openPanel("Edit endpoint");
  await form.getByLabel("Pace").fill("0");
  await form.getByRole("button", { name: "Save changes" }).click();
  const message = await expectAlert(RANGE);
  assert.equal(await detail("Pace"), "5 deliveries/s");
  assert.equal((await api("GET", `/webhooks/${id}`)).data.rate_limit_per_second, 5);
  await shot("15g-pace-refused", page, message);

  const before = (await api("GET", "/webhooks")).data.count;
  await page.goto(`${BASE}/dashboard#/endpoints`);
  const create = await openPanel("New endpoint");
  await create.getByLabel("URL").fill(`${ctx.receiver}/hook/too-fast`);
  await create.getByLabel("Pace").fill("20000");
  await create.getByRole("button", { name: "Create endpoint" }).click();
  await expectAlert(RANGE);
  assert.match(page.url(), /#\/endpoints$/, "the page left the form");
  assert.equal((await api("GET", "/webhooks")).data.count, before, "an endpoint was created");
  await api("DELETE", `/webhooks/${id}`);
});

test("upcoming: a delivery waiting for its turn (an ordered endpoint's `waiting` state) says so", async () => {
  // Standalone mode never records `waiting` (a later delivery of an ordered
  // endpoint is simply not claimed), so the API's answer is given that state
  // on its way to the page: what is tested is how the page shows it.
  const endpoint = await endpointViaApi("/hook/ordered", { ordering: "ordered", event_categories: ["static_memo.activity"] });
  const event = await ingest("static_memo.activity");
  const upcoming = (url) => url.pathname === `/v0/webhooks/${endpoint.id}/events`;
  await page.route(upcoming, async (route) => {
    const response = await route.fetch();
    const list = await response.json();
    for (const entry of list.data) entry.delivery = { state: "waiting", attempts: 0, next_attempt_at: null };
    await route.fulfill({ response, json: list });
  });
  try {
    await openEndpoint(endpoint.id);
    const row = page.locator(`#upcoming tr[data-event-id="${event.event_id}"]`);
    await row.waitFor({ timeout: LIVE });
    const delivery = (await row.locator('td[data-label="Delivery"]').innerText()).trim();
    assert.match(delivery, /^waiting for its turn\b/, `the row reads "${delivery}"`);
    await shot("15h-upcoming-waiting");
  } finally {
    await page.unroute(upcoming);
  }
  await api("DELETE", `/webhooks/${endpoint.id}`);
});

test("pace and order: a key without webhooks:write sees them but gets no control to change them", async () => {
  const id = ctx.pacedId || (await endpointViaApi("/hook/paced")).id;
  assert.equal((await api("PUT", `/webhooks/${id}`, { rate_limit_per_second: 7, ordering: "ordered" })).status, 200);
  const { data: key } = await api("POST", "/api_keys", { name: "read-only-controls", scopes: ["webhooks:read"] });
  await openEndpoint(id);
  assert.equal(await page.getByLabel("Pace").count(), 1, "a key with webhooks:write has no pace control");
  await signOut();
  await signIn(key.key);
  await page.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
  await openEndpoint(id);
  await noAlert("opening the endpoint with a read-only key");
  assert.equal(await detail("Pace"), "7 deliveries/s");
  assert.equal(await detail("Order"), "in sequence");
  assert.equal(await page.getByLabel("Pace").count(), 0, "a read-only key is offered a pace control");
  assert.equal(await page.getByLabel("Order").count(), 0, "a read-only key is offered an order control");
  // The log's filters only read; nothing else may take input.
  const controls = page.locator("main input, main select").and(page.locator(":not(form.filters *)"));
  assert.equal(await controls.count(), 0, "a read-only key is offered a control");
  await shot("15i-read-only-pace-order");
  await signOut();
  await signIn(ctx.key);
  await page.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
  await api("DELETE", `/api_keys/${key.id}`);
});

test("API keys: a scoped key is shown once; signed in with it, no write action is offered", async () => {
  await page.goto(`${BASE}/dashboard`);
  await page.getByRole("link", { name: "API keys", exact: true }).click();
  await page.getByRole("heading", { name: "API keys", level: 1 }).waitFor();
  const form = await openPanel("New API key");
  await form.getByLabel("Name (optional)").fill("read-only");
  await form.getByRole("checkbox", { name: "webhooks:read", exact: true }).check();
  await form.getByRole("button", { name: "Create key" }).click();
  const shown = page.getByRole("textbox", { name: "The new API key" });
  await shows(shown, "creating a key");
  const key = await shown.inputValue();
  assert.match(key, /^sk-test-[A-Za-z0-9]+$/);
  assert.match(await page.locator(".secret").innerText(), /will not be shown again/);
  await shot("16-key-created-shown-once");
  await page.getByRole("button", { name: "Done" }).click();
  await page.getByRole("link", { name: "Endpoints", exact: true }).click();
  await page.getByRole("link", { name: "API keys", exact: true }).click();
  const row = page.locator("#keys tr", { hasText: "read-only" });
  await row.waitFor();
  assert.match(await row.innerText(), /webhooks:read/);
  assert.ok(!(await page.locator("body").innerText()).includes(key), "the plaintext key is shown again");
  await shot("17-keys-list");

  await signOut();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0, "sign-out left the key in session storage");
  await signIn(key);
  await page.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
  await noAlert("signing in with the read-only key");
  assert.equal(await page.locator("summary", { hasText: "New endpoint" }).count(), 0, "New endpoint is offered");
  assert.ok(!(await page.getByRole("link", { name: "API keys", exact: true }).isVisible()), "the keys page is offered");
  await shot("18-read-only-endpoints");
  await openEndpoint(await mainEndpoint());
  const held = await ingest("transfer"); // the endpoint is disabled: an upcoming event, without a Send button
  await page.locator(`#upcoming tr[data-event-id="${held.event_id}"]`).waitFor({ timeout: LIVE });
  for (const name of ["Activate", "Disable", "Rotate key", "Delete", "Save changes", "Recover"]) {
    assert.equal(await page.getByRole("button", { name, exact: true }).count(), 0, `"${name}" is offered to a read-only key`);
  }
  assert.equal(await page.locator("#upcoming button").count(), 0, "Send is offered to a read-only key");
  await shot("19-read-only-endpoint");
  await signOut();
  await signIn(ctx.key);
  await page.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
});

test("API keys: a key made in the dashboard has type Public (API.md §8.8)", async () => {
  const { data } = await api("GET", "/api_keys");
  const made = data.data.find((k) => k.name === "read-only");
  assert.ok(made, "the key made in the previous test is listed");
  assert.equal(made.type, "Public", "the type of a key created with the header Webhooks-Client: dashboard");
});

test("delete: an endpoint and a key, each after a confirmation", async () => {
  const doomed = await endpointViaApi("/hook/doomed");
  await openEndpoint(doomed.id);
  await page.getByRole("button", { name: "Delete", exact: true }).click();
  await page.getByText("Delete this endpoint for good?").waitFor();
  await shot("20-delete-confirm");
  await page.getByRole("button", { name: "Yes, delete" }).click();
  await page.waitForURL(/#\/endpoints$/);
  await noAlert("deleting the endpoint");
  await page.locator("#endpoint-list").waitFor();
  assert.equal(await page.locator(`a[href$="${doomed.id}"]`).count(), 0, "the deleted endpoint is listed");
  assert.equal((await api("GET", `/webhooks/${doomed.id}`)).status, 404);

  const { data: key } = await api("POST", "/api_keys", { name: "doomed-key" });
  await page.getByRole("link", { name: "API keys", exact: true }).click();
  const row = page.locator(`#keys tr[data-key-id="${key.id}"]`);
  await row.getByRole("button", { name: "Delete" }).click();
  await row.getByRole("button", { name: "Yes, delete" }).click();
  await row.waitFor({ state: "detached" });
  await noAlert("deleting the key");
  assert.equal((await api("GET", "/api_keys/whoami", undefined, key.key)).status, 401);
});

test("standard scheme: an Ed25519 delivery checks as genuine in the browser (API.md §8.4)", async () => {
  await page.goto(`${BASE}/dashboard#/endpoints`);
  await openPanel("New endpoint");
  await page.getByLabel("URL").fill(`${ctx.receiver}/hook/standard`);
  await page.getByLabel("Signature scheme").selectOption("standard");
  await page.getByRole("button", { name: "Create endpoint" }).click();
  await shows(page.locator("#public-key"), "creating a standard-scheme endpoint (signature_scheme, API.md §8.4)");
  const publicKey = await page.locator("#public-key").innerText();
  assert.match(publicKey, /^whpk_/);
  await setStatus("active");
  const delivery = await delivered((await ingest("transfer")).event_id);
  const headers = ["webhook-id", "webhook-timestamp", "webhook-signature"].map((n) => `${n}: ${delivery.headers[n]}`).join("\n");
  assert.match(await checkSignature(headers, delivery.body, publicKey), /^Genuine/);
  await shot("21-checker-standard-genuine");
  assert.match(await checkSignature(headers, `${delivery.body} `, publicKey), /^Not genuine: /);
});

test("catalog: the Event types page lists every type with its category, example and schema (API.md §8.9)", async () => {
  await page.goto(`${BASE}/dashboard#/endpoints`);
  await page.getByRole("link", { name: "Event types" }).click();
  await shows(page.getByRole("heading", { name: "Event types", level: 1 }), "opening the catalog");
  const types = (await api("GET", "/event_types")).data.data;
  assert.equal(await page.locator("#event-types li").count(), types.length);
  const card = page.locator('#event-types li[data-event-type="transfer.created"]');
  await card.getByText("Example event_object").click();
  const example = types.find((t) => t.name === "transfer.created").example;
  assert.deepEqual(JSON.parse(await card.locator("pre").first().innerText()), example);
  await card.getByText("JSON Schema of event_object").click();
  assert.equal(JSON.parse(await card.locator("pre").nth(1).innerText()).type, "object");
  await shot("27-catalog");
  await page.getByLabel("Category").selectOption("customer");
  const shown = await page.locator("#event-types li").evaluateAll((items) => items.map((i) => i.dataset.eventType));
  assert.ok(shown.length > 0 && shown.every((name) => name.startsWith("customer.")), `${shown}`);
});

test("test event: Send test POSTs the chosen type's example with test: true, signed, to a disabled endpoint", async () => {
  await openEndpoint(await mainEndpoint());
  await setStatus("disabled");
  const publicKey = await page.locator("#public-key").innerText();
  await openPanel("Send a test event");
  // Not the log filter's "Event type" box: the test event's own select.
  await page.locator("#test-event").getByRole("combobox", { name: "Test event type", exact: true }).selectOption("customer.created");
  const before = (await received()).length;
  await page.getByRole("button", { name: "Send test" }).click();
  await shows(page.locator("#test-result .badge"), "sending a test event");
  assert.match(await page.locator("#test-result").innerText(), /delivered\s+HTTP 200/);
  const eventId = await page.locator("#test-result .mono").innerText();
  const delivery = await delivered(eventId);
  assert.equal((await received()).length, before + 1, "one attempt");
  const body = JSON.parse(delivery.body);
  assert.equal(body.test, true);
  assert.equal(body.event_type, "customer.created");
  const example = (await api("GET", "/event_types/customer.created")).data.example;
  assert.deepEqual(body.event_object, example);
  const headers = `x-webhook-signature: ${delivery.headers["x-webhook-signature"]}`;
  await shot("28-test-event-sent");
  assert.match(await checkSignature(headers, delivery.body, publicKey), /^Genuine/);
  await openEndpoint(await mainEndpoint());
  await setStatus("active");
});

test("narrow screen (390 px): every page fits and every control is labelled", async () => {
  const context = await browser.newContext({ viewport: { width: 390, height: 844 } });
  const narrow = await context.newPage();
  watch(narrow);
  try {
    await narrow.goto(`${BASE}/dashboard`);
    await narrow.getByRole("heading", { name: "Sign in", level: 1 }).waitFor();
    await assertTidy("sign-in", narrow);
    await shot("22-narrow-sign-in", narrow);
    await signIn(ctx.key, narrow);
    await narrow.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor();
    await openPanel("New endpoint", narrow);
    await assertTidy("endpoints", narrow);
    await shot("23-narrow-endpoints", narrow);
    await openEndpoint(await mainEndpoint(), narrow);
    await narrow.locator("#logs tbody tr").first().waitFor({ timeout: LIVE });
    await openPanel("Edit endpoint", narrow);
    await assertTidy("endpoint", narrow);
    await shot("24-narrow-endpoint", narrow);
    await narrow.goto(`${BASE}/dashboard#/keys`);
    await narrow.locator("#keys").waitFor();
    await openPanel("New API key", narrow);
    await assertTidy("keys", narrow);
    await shot("25-narrow-keys", narrow);
    await narrow.goto(`${BASE}/dashboard#/checker`);
    await narrow.getByRole("heading", { name: "Signature checker", level: 1 }).waitFor();
    await assertTidy("checker", narrow);
    await shot("26-narrow-checker", narrow);
    await narrow.getByRole("link", { name: "Event types" }).click();
    await narrow.getByRole("heading", { name: "Event types", level: 1 }).waitFor();
    await narrow.locator('#event-types li[data-event-type="transfer.created"]').getByText("Example event_object").click();
    await assertTidy("catalog", narrow);
    await shot("28-narrow-catalog", narrow);
  } finally {
    await context.close();
  }
});

/** A portal session of the test's developer, made on the internal listener (API.md §8.10). */
async function portalSession(body = {}) {
  const response = await fetch(`${INTERNAL}/internal/portal_sessions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ developer_id: ctx.developerId, ...body }),
  });
  assert.equal(response.status, 201, `POST /internal/portal_sessions answered ${response.status}`);
  return response.json();
}

test("portal: a portal link opens the dashboard signed in, and the token leaves the address bar", async () => {
  await mainEndpoint();
  const session = await portalSession();
  assert.match(session.url, /^\/dashboard#session=ps_[A-Za-z0-9]+$/);
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const portal = await context.newPage();
    watch(portal);
    const sent = [];
    portal.on("request", (request) => { if (new URL(request.url()).pathname.startsWith("/v0/")) sent.push(request); });
    await portal.goto(`${BASE}${session.url}`);
    await shows(portal.getByRole("heading", { name: "Endpoints", level: 1 }), "opening the portal link", portal);
    // The list links each endpoint by its URL; the link goes to its id.
    await portal.locator(`#endpoint-list a[href="#/endpoints/${ctx.endpointId}"]`).waitFor();
    assert.ok(!portal.url().includes(session.token), `the token is still in the address bar: ${portal.url()}`);
    assert.ok(!portal.url().includes("session="), portal.url());
    assert.equal(new URL(portal.url()).hash, "#/endpoints");
    assert.equal(await portal.evaluate(() => sessionStorage.getItem("webhooks-dashboard-api-key")), session.token);
    assert.equal(await portal.evaluate(() => localStorage.length), 0, "something is in local storage");
    assert.match(await portal.locator("#who").innerText(), /Portal session · webhooks:read, webhooks:write/);
    assert.ok(await portal.locator("#nav-keys").isHidden(), "API keys are offered without api_keys:read");
    assert.ok(sent.length > 0, "the page called the API");
    for (const request of sent) {
      assert.ok(!request.url().includes(session.token), `the token is in a request URL: ${request.url()}`);
      assert.equal(request.headers().authorization, `Bearer ${session.token}`);
      assert.equal(request.headers()["api-key"], undefined);
    }
    // Back does not bring the token back: the link's entry was replaced.
    assert.ok(!(await portal.evaluate(() => location.href)).includes(session.token));
    await shot("27-portal-signed-in", portal);

    // Revoked, the next call signs the tab out with the API's message.
    const revoked = await fetch(`${INTERNAL}/internal/portal_sessions/${session.id}`, { method: "DELETE" });
    assert.equal(revoked.status, 204);
    await portal.reload();
    await expectAlert(/Invalid, expired or revoked portal session/, portal);
    await portal.getByRole("heading", { name: "Sign in", level: 1 }).waitFor();
    assert.equal(await portal.evaluate(() => sessionStorage.getItem("webhooks-dashboard-api-key")), null);
    await shot("28-portal-revoked", portal, "Invalid, expired or revoked portal session");
  } finally {
    await context.close();
  }
});

test("portal: an embedding page of a PORTAL_FRAME_ANCESTORS origin shows the dashboard; another origin cannot", async () => {
  const port = Number(env.DASHBOARD_FRAME_PORT);
  assert.ok(port > 0, "DASHBOARD_FRAME_PORT is not set");
  const session = await portalSession({ scopes: ["webhooks:read"] });
  const host = createServer((request, response) => {
    response.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    response.end(`<!doctype html><title>Console</title><h1>Console</h1>
      <iframe id="portal" title="Webhooks" width="1000" height="700" src="${BASE}${session.url}"></iframe>`);
  });
  await new Promise((resolve) => host.listen(port, "127.0.0.1", resolve));
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  try {
    const embedding = await context.newPage();
    await embedding.goto(`http://127.0.0.1:${port}/`);
    const frame = embedding.frameLocator("#portal");
    await frame.getByRole("heading", { name: "Endpoints", level: 1 }).waitFor({ timeout: LIVE });
    assert.match(await frame.locator("#who").innerText(), /Portal session · webhooks:read/);
    await shot("29-portal-in-a-frame", embedding);

    // The same page from another origin (localhost is not 127.0.0.1): the
    // browser refuses to show the dashboard in its frame.
    // A refused frame shows Chromium's own error page (which has an h1 of
    // its own), so look for the refusal and for the dashboard itself.
    const other = await context.newPage();
    const refusal = other.waitForEvent("console", { timeout: LIVE,
      predicate: (message) => /Framing .* violates .*frame-ancestors/.test(message.text()) });
    await other.goto(`http://localhost:${port}/`);
    await refusal;
    const dashboard = other.frames().find((f) => f !== other.mainFrame());
    assert.ok(dashboard, "the page of the other origin has no frame");
    assert.ok(!dashboard.url().startsWith(`${BASE}/dashboard`), `the frame shows ${dashboard.url()}`);
    assert.equal(await dashboard.locator("#view, #who").count(), 0,
      "the dashboard shows in a frame of an origin PORTAL_FRAME_ANCESTORS does not list");
    await shot("29b-portal-frame-refused", other);
  } finally {
    await context.close();
    await new Promise((resolve) => host.close(resolve));
  }
});

test("no script error and no Content-Security-Policy refusal on any page", () => {
  assert.deepEqual(ctx.problems, []);
});
