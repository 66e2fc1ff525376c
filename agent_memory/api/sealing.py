"""What the server hands a client to hand back later, sealed: a Responses reasoning item's
`encrypted_content` and an Anthropic thinking block's `signature`. AES-256-GCM under the
server's secret key (`--seal-key-file`; by default `<cache-dir>/seal.key`, made at first start),
with this format's version, the blob's kind and the tenant as associated data: a client can
neither read one nor forge or alter one, nor use one given to another tenant (API key), and a
blob that does not open is a 400 naming it, never silently dropped. The key persists, so blobs
still open after a restart; servers behind one router open each other's by sharing one file."""

from __future__ import annotations

import base64
import binascii
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fastapi import Request

from agent_memory.api.errors import APIError

VERSION = "am2"  # "am2." + base64url(nonce | ciphertext | tag)
LEGACY = "am1."  # earlier versions' format: the text in the clear with its checksum, forgeable
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
REASONING = "reasoning"  # a Responses reasoning item's encrypted_content
THINKING = "thinking"  # an Anthropic thinking block's signature

log = logging.getLogger(__name__)


class SealKeyError(ValueError):
    """The key file cannot be read or made, or holds no key."""


class Unsealable(ValueError):
    """A blob this server did not seal for this tenant and kind, or one altered since; says why."""


def load_key(path: Path, create: bool) -> bytes:
    """The key a file holds (64 hex digits); made first, mode 0600, when `create` and missing."""
    path = path.expanduser()
    if create and not path.exists():
        _create(path)
    try:
        text = path.read_text().strip()
        mode = path.stat().st_mode & 0o777
    except (OSError, UnicodeError) as e:
        raise SealKeyError(f"cannot read the seal key file {path}: {e}") from e
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise SealKeyError(f"{path}: expected {2 * KEY_BYTES} hex digits, as `openssl rand -hex 32` writes")
    if mode & 0o077:
        log.warning("the seal key file %s can be read by others (mode %o): chmod 600 it", path, mode)
    return key


def _create(path: Path) -> None:
    """A new random key in a file only its owner reads, whole or not at all: written to a
    temporary file, then linked in place, so that two servers starting at once on one folder
    end with one key (the second's link fails, and it reads the first's)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.unlink(missing_ok=True)
        with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(temp, path)
    except FileExistsError:
        pass  # another server made it first: its key is the one
    except OSError as e:
        raise SealKeyError(f"cannot make the seal key file {path}: {e}") from e
    finally:
        temp.unlink(missing_ok=True)


def _bound(tenant: str, kind: str) -> bytes:
    """The associated data: a blob opens only for the format, kind and tenant it was sealed for."""
    return f"{VERSION}\0{kind}\0{tenant}".encode()


class Sealer:
    """Seals text under the server's key, and opens only what it sealed."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    @classmethod
    def from_file(cls, path: Path, create: bool) -> Sealer:
        """The key of `path`. The default file (`create`) that cannot be made (a full or
        read-only disk) does not stop the server: it seals with a key of its own for this run."""
        try:
            return cls(load_key(path, create))
        except SealKeyError as e:
            if not create or path.exists():
                raise
            log.warning("%s; sealing with a key for this run only: reasoning handed out now will not "
                        "open after a restart", e)
            return cls(secrets.token_bytes(KEY_BYTES))

    def seal(self, text: str, tenant: str, kind: str) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode(), _bound(tenant, kind))
        return f"{VERSION}." + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, blob: object, tenant: str, kind: str) -> str:
        """The text `blob` holds; Unsealable unless this server sealed it for `tenant` and `kind`."""
        if not isinstance(blob, str):
            raise Unsealable("must be a string")
        if blob.startswith(LEGACY):
            raise Unsealable(
                "is in the readable, forgeable format (am1.) of earlier versions, no longer accepted: "
                "send the reasoning's text instead, or start the conversation again"
            )
        if not blob.startswith(VERSION + "."):
            raise Unsealable("was not sealed by this server")
        try:
            raw = base64.b64decode(blob[len(VERSION) + 1 :], altchars=b"-_", validate=True)
        except (binascii.Error, ValueError) as e:
            raise Unsealable("is not valid base64") from e
        if len(raw) < NONCE_BYTES + TAG_BYTES:
            raise Unsealable("is too short to be sealed")
        try:
            return self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _bound(tenant, kind)).decode()
        except InvalidTag as e:
            raise Unsealable(
                "does not open with this server's key for this API key: it was altered, or sealed by a "
                "server with another seal key, or for another tenant"
            ) from e

    def for_tenant(self, tenant: str, kind: str) -> TenantSeal:
        return TenantSeal(self, tenant, kind)


@dataclass(frozen=True)
class TenantSeal:
    """The sealer as one request uses it: blobs of one kind, for the request's tenant."""

    sealer: Sealer
    tenant: str
    kind: str

    def seal(self, text: str) -> str:
        return self.sealer.seal(text, self.tenant, self.kind)

    def open(self, blob: object, param: str) -> str:
        """The text `blob` holds, or a 400 naming `param` (OpenAI's `invalid_encrypted_content`)."""
        try:
            return self.sealer.open(blob, self.tenant, self.kind)
        except Unsealable as e:
            raise APIError(400, f"{param} is not valid: it {e}", param=param, code="invalid_encrypted_content") from e


def request_sealer(request: Request) -> Sealer:
    """The sealer create_app keeps."""
    return request.app.state.sealer
