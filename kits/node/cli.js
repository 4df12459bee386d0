#!/usr/bin/env node
'use strict';
// node cli.js --headers FILE --body FILE --key FILE [--now-ms N]
// headers FILE: JSON object, header name -> value; body FILE: the raw body bytes;
// key FILE: the PEM public key or the whpk_... text.
// Exit 0 "genuine: <scheme> signature", 1 "refused: <reason>", 2 usage error.
const fs = require('fs');
const { verify, loadPublicKey, WebhookVerificationError } = require('./verify.js');

const USAGE = 'usage: node cli.js --headers FILE --body FILE --key FILE [--now-ms N]';

function usage(message) {
  process.stderr.write(`${message ? `error: ${message}\n` : ''}${USAGE}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const options = {};
  const known = ['--headers', '--body', '--key', '--now-ms'];
  for (let i = 0; i < argv.length; i++) {
    let [name, value] = argv[i].split(/=(.*)/s);
    if (name === '--help' || name === '-h') {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    }
    if (!known.includes(name)) usage(`unknown argument ${argv[i]}`);
    if (value === undefined) {
      if (i + 1 >= argv.length) usage(`${name} needs a value`);
      value = argv[++i];
    }
    if (name in options) usage(`${name} given twice`);
    options[name] = value;
  }
  for (const name of known.slice(0, 3)) if (!(name in options)) usage(`${name} is required`);
  return options;
}

function main() {
  const options = parseArgs(process.argv.slice(2));
  let headers, body, key, now;
  try {
    headers = JSON.parse(fs.readFileSync(options['--headers'], 'utf8'));
    body = fs.readFileSync(options['--body']); // a Buffer: the exact bytes
    key = loadPublicKey(fs.readFileSync(options['--key'], 'utf8'));
  } catch (err) {
    usage(err.message);
  }
  if (headers === null || typeof headers !== 'object' || Array.isArray(headers) ||
      !Object.values(headers).every((v) => typeof v === 'string')) {
    usage('the headers file must be a JSON object of header name -> string value');
  }
  if ('--now-ms' in options) {
    if (!/^-?[0-9]{1,16}$/.test(options['--now-ms'])) usage('--now-ms must be an integer');
    now = Number(options['--now-ms']);
  } else {
    now = Date.now();
  }
  try {
    const result = verify(headers, body, key, { now });
    process.stdout.write(`genuine: ${result.scheme} signature\n`);
    process.exitCode = 0;
  } catch (err) {
    if (!(err instanceof WebhookVerificationError)) throw err;
    process.stdout.write(`refused: ${err.reason}\n`);
    process.exitCode = 1;
  }
}

try {
  main();
} catch (err) {
  // Not a refusal (those print "refused: ..."): report it apart, never as exit 1.
  process.stderr.write(`error: ${err && err.stack ? err.stack : err}\n`);
  process.exit(2);
}
