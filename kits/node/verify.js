'use strict';
// Verifies a webhook delivery's signature. Node's built-in crypto only.
//   scheme "platform": X-Webhook-Signature: t=<ms>,v0=<base64>  (RSA key, PEM)
//   scheme "standard": webhook-id / webhook-timestamp / webhook-signature: v1a,<base64>
//                      (Standard Webhooks, Ed25519 key shown as whpk_<base64>)
// The key you hold decides which headers are checked. Pass the RAW body bytes
// (a Buffer) exactly as received: never JSON.parse and re-serialize them.
const crypto = require('crypto');

const PLATFORM_WINDOW_MS = 10 * 60 * 1000;
const STANDARD_WINDOW_MS = 5 * 60 * 1000;
// DER prefix that turns 32 raw Ed25519 key bytes into a SubjectPublicKeyInfo.
const ED25519_SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

class WebhookVerificationError extends Error {
  constructor(reason) {
    super(reason);
    this.name = 'WebhookVerificationError';
    this.reason = reason; // 'no signature header' | 'stale timestamp' | 'no signature matches' | 'malformed header'
  }
}
const refuse = (reason) => { throw new WebhookVerificationError(reason); };
const trim = (text) => text.replace(/^[ \t]+|[ \t]+$/g, ''); // spaces and tabs only

// Strict base64 (standard alphabet, padding optional); null when invalid.
function decodeBase64(text) {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) return null;
  const bare = text.replace(/=+$/, '');
  if (bare.length === 0 || bare.length % 4 === 1) return null;
  return Buffer.from(bare, 'base64');
}

// Parses the key you hold: "whpk_..." -> standard, PEM -> platform. Throws TypeError if neither.
function loadPublicKey(text) {
  text = String(text).trim();
  if (text.startsWith('whpk_')) {
    const raw = decodeBase64(text.slice(5));
    if (!raw || raw.length !== 32) throw new TypeError('whpk_ key must be base64 of 32 bytes');
    const der = Buffer.concat([ED25519_SPKI_PREFIX, raw]);
    return { scheme: 'standard', key: crypto.createPublicKey({ key: der, format: 'der', type: 'spki' }) };
  }
  if (/^-----BEGIN (RSA )?PUBLIC KEY-----/.test(text)) { // not a private key nor a certificate
    const key = crypto.createPublicKey(text);
    if (key.asymmetricKeyType !== 'rsa' || key.asymmetricKeyDetails.modulusLength < 2048) {
      throw new TypeError('PEM key is not an RSA public key of at least 2048 bits');
    }
    return { scheme: 'platform', key };
  }
  throw new TypeError('key is neither a PEM public key nor whpk_<base64>');
}

// Case-insensitive lookup in a plain object (Node's req.headers, a JSON map), a Map,
// or a Fetch API Headers. A name given twice with different cases is malformed.
function getHeader(headers, name) {
  if (typeof headers.get === 'function' && !(headers instanceof Map)) {
    const value = headers.get(name); // Fetch Headers: already case-insensitive
    return value === null ? undefined : value;
  }
  const entries = headers instanceof Map ? [...headers] : Object.entries(headers);
  const found = entries.filter(([k, v]) => k.toLowerCase() === name && v !== undefined);
  if (found.length === 0) return undefined;
  if (found.length > 1 || typeof found[0][1] !== 'string') refuse('malformed header');
  return found[0][1];
}

function verifyPlatform(headers, body, key, nowMs) {
  const value = getHeader(headers, 'x-webhook-signature');
  if (value === undefined) refuse('no signature header');
  let t;
  const signatures = [];
  for (const part of value.split(',')) {
    const entry = trim(part);
    if (entry === '') continue;
    const eq = entry.indexOf('=');
    if (eq < 0) refuse('malformed header');
    const name = trim(entry.slice(0, eq));
    const text = trim(entry.slice(eq + 1));
    if (name === 't') {
      if (t !== undefined || !/^[0-9]{1,15}$/.test(text)) refuse('malformed header');
      t = text; // the digest covers t exactly as written
    } else if (name === 'v0') {
      const signature = decodeBase64(text);
      if (!signature) refuse('malformed header');
      signatures.push(signature);
    } // other entries: future schemes, ignored
  }
  if (t === undefined || signatures.length === 0) refuse('malformed header');
  // Two passes of hashing: SHA-256 of "<t>.<body>", then RSA PKCS#1 v1.5 SHA-256 over that digest.
  const digest = crypto.createHash('sha256').update(`${t}.`).update(body).digest();
  const ok = signatures.some((sig) => {
    try { return crypto.verify('sha256', digest, key, sig); } catch { return false; }
  });
  if (!ok) refuse('no signature matches'); // check EVERY v0: any one may be yours
  if (Math.abs(nowMs - Number(t)) > PLATFORM_WINDOW_MS) refuse('stale timestamp');
  return { scheme: 'platform', id: getHeader(headers, 'x-webhook-id'), timestampMs: Number(t) };
}

function verifyStandard(headers, body, key, nowMs) {
  const value = getHeader(headers, 'webhook-signature');
  if (value === undefined) refuse('no signature header');
  const id = getHeader(headers, 'webhook-id');
  const ts = trim(getHeader(headers, 'webhook-timestamp') || '');
  if (!id || !/^[0-9]{1,15}$/.test(ts)) refuse('malformed header');
  const entries = value.split(/[ \t]+/).filter(Boolean);
  if (entries.length === 0) refuse('malformed header');
  const signatures = [];
  for (const entry of entries) {
    const comma = entry.indexOf(',');
    if (comma < 0) refuse('malformed header');
    if (entry.slice(0, comma) !== 'v1a') continue; // v1 (HMAC) and other versions: not ours
    const signature = decodeBase64(entry.slice(comma + 1));
    if (!signature) refuse('malformed header');
    signatures.push(signature);
  }
  const content = Buffer.concat([Buffer.from(`${id}.${ts}.`), body]);
  const ok = signatures.some((sig) => {
    try { return crypto.verify(null, content, key, sig); } catch { return false; }
  });
  if (!ok) refuse('no signature matches');
  if (Math.abs(nowMs - Number(ts) * 1000) > STANDARD_WINDOW_MS) refuse('stale timestamp');
  return { scheme: 'standard', id, timestampMs: Number(ts) * 1000 };
}

// verify(headers, rawBody, publicKey, { now }) -> { scheme, id, timestampMs }
// Throws WebhookVerificationError (with .reason) when the delivery is not genuine,
// TypeError when the key or the body argument is unusable. `now`: ms or Date.
function verify(headers, rawBody, publicKey, { now = Date.now() } = {}) {
  if (!(rawBody instanceof Uint8Array)) throw new TypeError('rawBody must be the raw Buffer received');
  const nowMs = now instanceof Date ? now.getTime() : Number(now);
  const { scheme, key } = publicKey && publicKey.scheme ? publicKey : loadPublicKey(publicKey);
  const body = Buffer.from(rawBody.buffer, rawBody.byteOffset, rawBody.byteLength);
  return scheme === 'standard'
    ? verifyStandard(headers, body, key, nowMs)
    : verifyPlatform(headers, body, key, nowMs);
}

module.exports = { verify, loadPublicKey, WebhookVerificationError, PLATFORM_WINDOW_MS, STANDARD_WINDOW_MS };
