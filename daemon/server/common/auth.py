"""Authentication: tenant API keys on the public port, a bearer token on the admin port.

API-keys file: `KEY TENANT` per line (`#` comments); the tenant is the cache namespace ("" without one).
NOTE: the namespace comes only from authenticated metadata, never from the request body.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Any

import grpc

TENANT_PREFIX = "t:"


class AuthError(Exception):
    """Carries the status code to abort with (UNAUTHENTICATED or PERMISSION_DENIED)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def load_api_keys(path: str | Path) -> dict[str, str]:
    """Parse an API-keys file into {key: tenant}; raises ValueError naming the bad line."""
    keys: dict[str, str] = {}
    text = Path(path).read_text()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{lineno}: expected 'KEY TENANT', got {len(parts)} fields")
        key, tenant = parts
        if key in keys:
            raise ValueError(f"{path}:{lineno}: duplicate API key")
        keys[key] = tenant
    if not keys:
        raise ValueError(f"{path}: no API keys found (expected lines of 'KEY TENANT')")
    return keys


def bearer_token(metadata: Any) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry, or None."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class Authenticator:
    """Resolves tenants (public services) and checks the admin token (admin service)."""

    def __init__(self, api_keys: dict[str, str] | None, admin_token: str) -> None:
        if not admin_token:
            raise ValueError("the admin token must not be empty")
        self._keys = api_keys
        self._admin_token = admin_token.encode()

    @property
    def multi_tenant(self) -> bool:
        return self._keys is not None

    def tenant(self, metadata: Any) -> str:
        """The caller's tenant name ("" without a keys file); raises AuthError."""
        if self._keys is None:
            return ""
        token = bearer_token(metadata)
        if token is None:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                "this daemon requires an API key: send metadata 'authorization: Bearer <key>'",
            )
        for key, tenant in self._keys.items():
            if hmac.compare_digest(key.encode(), token.encode()):
                return tenant
        raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "unknown API key; check the key you were issued")

    def namespace(self, metadata: Any) -> str:
        """The cache namespace of the caller's tenant."""
        tenant = self.tenant(metadata)
        return TENANT_PREFIX + tenant if tenant else ""

    def check_admin(self, metadata: Any) -> None:
        """Raises AuthError unless the metadata carries the admin bearer token."""
        token = bearer_token(metadata)
        if token is None:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                "admin calls need metadata 'authorization: Bearer <admin token>' (radixctl --admin-token)",
            )
        if not hmac.compare_digest(token.encode(), self._admin_token):
            raise AuthError(grpc.StatusCode.PERMISSION_DENIED, "wrong admin token")


def admin_namespace(tenant: str) -> str:
    """The namespace an admin call names by tenant ("" = default tenant)."""
    return TENANT_PREFIX + tenant if tenant else ""


def tenant_of(namespace: str) -> str:
    """The tenant name of a cache namespace (inverse of `admin_namespace`)."""
    return namespace.removeprefix(TENANT_PREFIX)
