"""Store URLs: normalising drivers, and keeping passwords out of everything written."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

STORE_ENV = "AUTOMLPERF_STORE_URL"
PASSWORD_ENV = "AUTOMLPERF_STORE_PASSWORD"
PASSWORD_FILE_ENV = "AUTOMLPERF_STORE_PASSWORD_FILE"
_CREDENTIALS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^:/@\s]*)(:(?P<pw>[^@/\s]*))?@",
                          re.IGNORECASE)
_QUERY_SECRET = re.compile(r"([?&](?:password|passwd|pwd)=)[^&\s]*", re.IGNORECASE)


def normalise_url(url: str) -> str:
    """``postgresql://`` means psycopg 3 here; a bare path means SQLite."""
    if "://" not in url:
        return f"sqlite:///{Path(url).resolve()}"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def redact(text: str) -> str:
    """Replace passwords in any URL inside ``text`` with ***."""
    text = _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}{':***' if m['pw'] is not None else ''}@",
                            text)
    return _QUERY_SECRET.sub(r"\1***", text)


def resolve_store_url(url: str | None, password_file: Path | None = None) -> str | None:
    """The store URL from the option, else the environment; a password missing from the URL
    is taken from AUTOMLPERF_STORE_PASSWORD or the file named by
    AUTOMLPERF_STORE_PASSWORD_FILE (or by ``password_file``), so it need not appear on a
    command line."""
    url = url or os.environ.get(STORE_ENV)
    if not url or url.startswith("sqlite") or "://" not in url:
        return url
    password = os.environ.get(PASSWORD_ENV)
    if password is None and os.environ.get(PASSWORD_FILE_ENV):
        password_file = Path(os.environ[PASSWORD_FILE_ENV])
    if password is None and password_file is not None and password_file.exists():
        password = password_file.read_text().strip()
    match = _CREDENTIALS.match(url)
    if password is not None and match and match["pw"] is None:
        from urllib.parse import quote

        url = (f"{match['scheme']}{match['user']}:{quote(password, safe='')}@"
               f"{url[match.end():]}")
    return url


def replica_env(env: Mapping[str, str], url: str | None) -> dict[str, str]:
    """The environment of a run's replica: ``env`` with the store's ``url``, and without the
    database's password where the replicas reach the store through the run's store service
    (a PostgreSQL store: they open no connection to the database, so they are not given what
    would open one)."""
    out = dict(env)
    if url and url.startswith(("postgresql", "postgres:")):
        out[STORE_ENV] = strip_password(url)
        out.pop(PASSWORD_ENV, None)
        out.pop(PASSWORD_FILE_ENV, None)
    elif url:
        out[STORE_ENV] = url
    return out


def strip_password(url: str) -> str:
    """The URL without its password (to write down; the password is supplied separately)."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}@", url, count=1)


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None)."""
    match = _CREDENTIALS.match(url)
    if match is None or match["pw"] is None:
        return url, None
    from urllib.parse import unquote

    return strip_password(url), unquote(match["pw"])
