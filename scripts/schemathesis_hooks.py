"""Schemathesis hooks for den (loaded by scripts/schemathesis.sh).

- application/x-tar request bodies (PUT /v1/sandboxes/{id}/archive,
  POST /v1/snapshots/load, images build and import) are raw bytes: the
  document says `type: string, format: binary`, and schemathesis has a
  serializer for that only under application/octet-stream, so x-tar reuses it.
- application/x-ndjson answers (images pull, build and import with
  Accept: application/x-ndjson) are one JSON document per line. The document
  gives the schema of one line; every line but the last is validated here
  against it, and the last is handed back for schemathesis's own
  response_schema_conformance check.
"""

import json

import jsonschema_rs  # schemathesis's own JSON Schema validator
import schemathesis

schemathesis.serializer.alias("application/x-tar", "application/octet-stream")


def _line_schema(ctx, status):
    responses = ctx.operation.definition.raw.get("responses", {})
    resp = responses.get(str(status)) or {}
    return (resp.get("content", {}).get("application/x-ndjson") or {}).get("schema")


@schemathesis.deserializer("application/x-ndjson")
def ndjson(ctx, response):
    lines = [l for l in response.content.decode("utf-8").split("\n") if l.strip()]
    if not lines:
        raise ValueError("an empty application/x-ndjson answer: want at least its last line")
    docs = []
    for i, line in enumerate(lines):
        try:
            docs.append(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"line {i + 1} of the x-ndjson answer is not JSON: {exc}: {line[:200]!r}")
    schema = _line_schema(ctx, response.status_code)
    if schema is not None:
        # Resolve the line schema's $ref against the whole document.
        root = dict(ctx.operation.schema.raw_schema)
        root["$ref"] = schema.get("$ref", "#")
        if "$ref" not in schema:
            root = {**schema, "components": root.get("components", {})}
        v = jsonschema_rs.Draft202012Validator(root)
        for i, doc in enumerate(docs[:-1]):
            for err in v.iter_errors(doc):
                raise ValueError(f"line {i + 1} of the x-ndjson answer does not match its schema: {err.message}")
    return docs[-1]
