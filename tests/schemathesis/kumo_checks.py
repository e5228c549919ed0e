"""Kumo's own schemathesis check, loaded with SCHEMATHESIS_HOOKS=kumo_checks.

no_foreign_data: no answer may contain any of the strings in
KUMO_FOREIGN_MARKERS (comma-separated): names and ids of a tenant the
caller does not belong to.
"""
import os

import schemathesis

MARKERS = [m for m in os.environ.get("KUMO_FOREIGN_MARKERS", "").split(",") if m]


@schemathesis.check
def no_foreign_data(ctx, response, case):
    text = response.text
    for marker in MARKERS:
        if marker in text:
            raise AssertionError(f"foreign data {marker!r} in the answer")
