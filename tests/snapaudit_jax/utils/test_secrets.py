"""``snapaudit_jax.utils.secrets``: URLs shown without credentials, registered secrets redacted wherever text leaves."""

from __future__ import annotations

import json
import urllib.parse

import pytest

from snapaudit_jax.utils import secrets
from snapaudit_jax.utils.errors import InputError, ServerError
from snapaudit_jax.utils.io import dumps, write_json, write_text
from snapaudit_jax.utils.progress import RunLog

SECRET = "zq9-redact-me-7f3"


@pytest.mark.parametrize("url, kept", [
    (f"https://user:{SECRET}@h.example:8443/v1", ["https://***@h.example:8443/v1"]),
    (f"https://{SECRET}@h.example/v1", ["https://***@h.example/v1"]),
    (f"http://h.example/v1?api_key={SECRET}&model=m", ["http://h.example/v1?api_key=***&model=***"]),
    (f"http://h.example/?{SECRET}", ["http://h.example/?***"]),
    (f"http://h.example/v1#{SECRET}", ["http://h.example/v1#***"]),
    (f"http://h.example/v1?token={urllib.parse.quote(SECRET + '/+')}", ["token=***"]),
])
def test_a_url_is_shown_without_its_credentials(url, kept):
    shown = secrets.redact_url(url)
    assert SECRET not in shown and urllib.parse.quote(SECRET) not in shown
    for part in kept:
        assert part in shown
    # power: the URL's own repr would carry it
    assert SECRET in repr(url) or urllib.parse.quote(SECRET) in repr(url)


def test_a_plain_url_is_shown_as_is():
    assert secrets.redact_url("https://h.example:8443/v1") == repr("https://h.example:8443/v1")
    assert secrets.redact_url(3) == "3"


def test_a_registered_secret_is_redacted_from_errors_logs_and_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(secrets, "_SECRETS", set())
    text = f"server said: bad key {SECRET}/ (encoded {urllib.parse.quote(SECRET + '/', safe='')})"
    assert str(ServerError(text)) == text  # nothing registered: nothing changes
    secrets.register(SECRET + "/")
    secrets.register("short")  # too short to be a secret: ordinary text keeps it
    assert secrets.redact("a short note") == "a short note"
    for err in (ServerError(text), InputError(text)):
        assert SECRET not in str(err) and "***" in str(err)
    RunLog(True)(text)
    assert SECRET not in capsys.readouterr().err
    assert SECRET not in dumps({"message": text}) and json.loads(dumps({"message": text}))
    write_json(tmp_path / "r.json", {"message": text})
    write_text(tmp_path / "r.md", text)
    for name in ("r.json", "r.md"):
        assert SECRET not in (tmp_path / name).read_text() and "***" in (tmp_path / name).read_text()
