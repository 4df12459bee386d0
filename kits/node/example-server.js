'use strict';
// A minimal receiver with Node's http module (no framework):
//   WEBHOOK_PUBLIC_KEY_FILE=endpoint-key.txt PORT=8080 node example-server.js
// Put it behind your HTTPS terminator. The key file holds the endpoint's PEM public key
// or its whpk_... key; the scheme follows from it.
const http = require('http');
const fs = require('fs');
const { verify, loadPublicKey, WebhookVerificationError } = require('./verify.js');

function createServer(publicKeyText, onEvent = (event) => console.log('event', event.id)) {
  const key = loadPublicKey(publicKeyText); // parse once
  const seen = new Set(); // use your database: the event id is the idempotency key
  return http.createServer((req, res) => {
    if (req.method !== 'POST') return res.writeHead(405).end();
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', () => {
      const rawBody = Buffer.concat(chunks); // the exact bytes: verify these, not a re-serialization
      let result;
      try {
        result = verify(req.headers, rawBody, key);
      } catch (err) {
        if (!(err instanceof WebhookVerificationError)) throw err;
        return res.writeHead(400, { 'content-type': 'text/plain' }).end(`${err.reason}\n`);
      }
      try {
        if (!seen.has(result.id)) { // a retry of a delivery you already handled: just say 2xx
          onEvent({ id: result.id, scheme: result.scheme, payload: JSON.parse(rawBody) });
          seen.add(result.id);
        }
      } catch (err) {
        console.error(err);
        return res.writeHead(500).end(); // not handled: the service retries it
      }
      res.writeHead(204).end();
    });
  });
}

module.exports = { createServer };

if (require.main === module) {
  const key = fs.readFileSync(process.env.WEBHOOK_PUBLIC_KEY_FILE, 'utf8');
  const port = Number(process.env.PORT || 8080);
  createServer(key).listen(port, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${port}`));
}
