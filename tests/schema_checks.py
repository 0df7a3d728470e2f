"""One fuzzed request against the live server's documented contract (tests/test_server_fuzz.py
and the pooling routes' fuzz in tests/test_pooling.py).

schemathesis' own "invalid data is rejected" check is replaced by a sounder one: a request it
generated as invalid but the server accepted must in fact be valid under the documented schema
(jsonschema decides). Its mutations can make a body valid again (a oneOf branch's array turned
into a string that another branch allows), and then accepting it is right."""
from __future__ import annotations

from typing import Any

import jsonschema
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance


def request_schema_validator(document: dict[str, Any], path: str) -> jsonschema.Draft202012Validator:
    ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    return jsonschema.Draft202012Validator({"$ref": ref, "components": document["components"]})


def call_and_check(case: Any, document: dict[str, Any], negative: bool) -> int:
    """Send the case, run schemathesis' other checks (status codes, content types, response
    bodies as documented; "schema-valid requests are accepted" is left out: prompt + max_tokens
    past --max-seq-len and the like are 400s no schema can express), and return the status."""
    response = case.call_and_validate(timeout=60, excluded_checks=[positive_data_acceptance, negative_data_rejection])
    if negative and response.status_code < 400 and case.method.upper() == "POST":
        errors = [e.message for e in request_schema_validator(document, case.path).iter_errors(case.body)]
        assert not errors, f"{case.path} accepted a body its schema refuses: {errors[:3]}"
    return response.status_code
