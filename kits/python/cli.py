#!/usr/bin/env python3
"""python cli.py --headers FILE --body FILE --key FILE [--now-ms N]

headers FILE: JSON object, header name -> value; body FILE: the raw body bytes;
key FILE: the PEM public key or the whpk_... text.
Exit 0 "genuine: <scheme> signature", 1 "refused: <reason>", 2 usage error.
"""

import argparse
import json
import re
import sys

from webhooks_verify import WebhookVerificationError, load_public_key, verify


def integer(text: str) -> int:
    if not re.fullmatch(r"-?[0-9]{1,16}", text):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(text)


def main() -> int:
    parser = argparse.ArgumentParser(prog="cli.py", allow_abbrev=False,
                                     description="Verify one webhook delivery.")
    parser.add_argument("--headers", required=True, metavar="FILE")
    parser.add_argument("--body", required=True, metavar="FILE")
    parser.add_argument("--key", required=True, metavar="FILE")
    parser.add_argument("--now-ms", type=integer, metavar="N")
    args = parser.parse_args()  # exits 2 on usage errors
    try:
        with open(args.headers, encoding="utf-8") as f:
            headers = json.load(f)
        with open(args.body, "rb") as f:
            body = f.read()  # the exact bytes
        with open(args.key, encoding="utf-8") as f:
            key = load_public_key(f.read())
    except (OSError, ValueError) as err:  # ValueError covers bad JSON and bad keys
        parser.error(str(err))
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        parser.error("the headers file must be a JSON object of header name -> string value")
    try:
        result = verify(headers, body, key, now_ms=args.now_ms)
    except WebhookVerificationError as err:
        print(f"refused: {err.reason}")
        return 1
    print(f"genuine: {result.scheme} signature")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as err:  # not a refusal: never report it as exit 1
        print(f"error: {err!r}", file=sys.stderr)
        sys.exit(2)
