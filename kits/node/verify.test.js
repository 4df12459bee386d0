'use strict';
// node --test kits/node/   (kits/run test runs it)
const test = require('node:test');
const assert = require('node:assert');
const crypto = require('crypto');
const path = require('path');
const { verify, loadPublicKey, WebhookVerificationError } = require('./verify.js');

const vectors = path.join(__dirname, '..', 'vectors');
const { cases } = require(path.join(vectors, 'cases.json'));
const published = require(path.join(vectors, 'platform-signature.json'));

function outcome(headers, body, key, now) {
  try {
    return `genuine: ${verify(headers, body, key, { now }).scheme} signature`;
  } catch (err) {
    if (err instanceof WebhookVerificationError) return `refused: ${err.reason}`;
    throw err;
  }
}

for (const c of cases) {
  test(`vector: ${c.name}`, () => {
    assert.strictEqual(outcome(c.headers, Buffer.from(c.body_base64, 'base64'), c.key, c.now_ms), c.expect);
  });
}

test('published example: accepted with now = t, refused with a changed body', () => {
  const headers = { [published.header_name]: published.header_value };
  const body = Buffer.from(published.raw_body);
  const result = verify(headers, body, published.public_key_pem, { now: published.timestamp_ms });
  assert.deepStrictEqual(result, { scheme: 'platform', id: undefined, timestampMs: published.timestamp_ms });
  assert.strictEqual(outcome(headers, Buffer.from(published.raw_body + ' '), published.public_key_pem,
    published.timestamp_ms), 'refused: no signature matches');
});

test('published example: a single-hash check over the undigested string fails', () => {
  const key = crypto.createPublicKey(published.public_key_pem);
  const sig = Buffer.from(published.header_value.split(',v0=')[1], 'base64');
  const signed = Buffer.from(`${published.timestamp_ms}.${published.raw_body}`);
  assert.strictEqual(crypto.verify('sha256', signed, key, sig), false);
  const digest = crypto.createHash('sha256').update(signed).digest();
  assert.strictEqual(crypto.verify('sha256', digest, key, sig), true);
});

test('the now option takes a Date too, and defaults to the clock', () => {
  const headers = { [published.header_name]: published.header_value };
  const body = Buffer.from(published.raw_body);
  const at = new Date(published.timestamp_ms + 60_000);
  assert.strictEqual(outcome(headers, body, published.public_key_pem, at), 'genuine: platform signature');
  assert.throws(() => verify(headers, body, published.public_key_pem), { reason: 'stale timestamp' });
});

test('headers may be a Fetch Headers or a Map; a loaded key may be reused', () => {
  const c = cases.find((x) => x.name === 'standard: one signature');
  const body = Buffer.from(c.body_base64, 'base64');
  const key = loadPublicKey(c.key);
  assert.strictEqual(key.scheme, 'standard');
  for (const headers of [new Headers(c.headers), new Map(Object.entries(c.headers))]) {
    assert.strictEqual(verify(headers, body, key, { now: c.now_ms }).scheme, 'standard');
  }
  const r = verify(c.headers, new Uint8Array(body), c.key, { now: c.now_ms });
  assert.deepStrictEqual(r, { scheme: 'standard', id: c.headers['webhook-id'],
    timestampMs: Number(c.headers['webhook-timestamp']) * 1000 });
});

test('the same header under two spellings is malformed', () => {
  const c = cases.find((x) => x.name === 'platform: one signature');
  const headers = { ...c.headers, 'x-webhook-signature': c.headers['X-Webhook-Signature'] };
  assert.strictEqual(outcome(headers, Buffer.from(c.body_base64, 'base64'), c.key, c.now_ms),
    'refused: malformed header');
});

test('a string body is refused: only the raw bytes can be verified', () => {
  const c = cases[0];
  assert.throws(() => verify(c.headers, Buffer.from(c.body_base64, 'base64').toString(), c.key,
    { now: c.now_ms }), TypeError);
});

test('unusable keys are TypeErrors, not refusals', () => {
  const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ type: 'spki', format: 'pem' });
  const small = crypto.generateKeyPairSync('rsa', { modulusLength: 1024 }).publicKey.export({ type: 'spki', format: 'pem' });
  for (const key of ['', 'hello', 'whpk_AAAA', 'whpk_!!', ec, small]) {
    assert.throws(() => loadPublicKey(key), (err) => !(err instanceof WebhookVerificationError), key);
  }
});

test('example-server.js: verifies, handles each event id once, refuses a tampered body', async () => {
  const { createServer } = require('./example-server.js');
  const keys = require(path.join(vectors, 'test-only-keys.json'));
  const events = [];
  const server = createServer(keys['standard-new'].public, (event) => events.push(event));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${server.address().port}/`;
    const body = Buffer.from('{"type":"example","n":1}');
    const ts = String(Math.floor(Date.now() / 1000));
    const signer = crypto.createPrivateKey(keys['standard-new'].private_pkcs8_pem);
    const sig = crypto.sign(null, Buffer.concat([Buffer.from(`evt_example.${ts}.`), body]), signer);
    const headers = { 'content-type': 'application/json', 'webhook-id': 'evt_example',
      'webhook-timestamp': ts, 'webhook-signature': `v1a,${sig.toString('base64')}` };
    for (let i = 0; i < 2; i++) {
      assert.strictEqual((await fetch(url, { method: 'POST', headers, body })).status, 204);
    }
    assert.deepStrictEqual(events, [{ id: 'evt_example', scheme: 'standard', payload: { type: 'example', n: 1 } }]);
    const tampered = await fetch(url, { method: 'POST', headers, body: '{"type":"example","n":2}' });
    assert.strictEqual(tampered.status, 400);
    assert.strictEqual(await tampered.text(), 'no signature matches\n');
  } finally {
    server.close();
  }
});
