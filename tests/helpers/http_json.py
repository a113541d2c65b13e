"""GET a JSON endpoint (e.g. an engine's /healthz) and keep the body of an error status too."""

import json
import urllib.error
import urllib.request


def get_json(url: str, timeout_s: float = 10) -> tuple[int, dict]:
    """(HTTP status, decoded body), whether the status says success or not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
