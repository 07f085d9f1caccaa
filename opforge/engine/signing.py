"""Signatures on remote cache entries, Nix-style: ed25519 (``cryptography``), over the entry's
manifest, which pins its binary's sha256.

* ``keygen(name, directory)`` writes ``NAME.secret`` (mode 0600) and ``NAME.public``.
  ``OPFORGE_SIGNING_KEY`` names a secret file; ``OPFORGE_TRUSTED_KEYS`` lists public-key files.
* A key file is one line: ``opforge-ed25519-secret:<name>:<base64>`` or
  ``opforge-ed25519-public:<name>:<base64>`` (the raw 32-byte key).
* ``check_secret(secret_file)`` checks a secret key before a push (one message, not one per entry).
* ``sign(data, secret_file)`` gives a signature document; ``verify(data, doc, trusted)`` a Decision
  naming the key that signed it, or why not.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from ..decision import Accepted, Decision, Rejected
from ..errors import OpforgeError
from ..files import atomic_write

SECRET, PUBLIC = "opforge-ed25519-secret", "opforge-ed25519-public"


@dataclass(frozen=True)
class PublicKey:
    name: str
    raw: bytes


def _crypto():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise OpforgeError("signing remote cache entries needs `cryptography`: pip install 'opforge[remote]'") from None
    return ed25519


def _read(path: str, kind: str) -> tuple[str, bytes]:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OpforgeError(f"cannot read the key file {path}: {exc}") from None
    parts = text.split(":")
    try:
        raw = base64.b64decode(parts[2], validate=True) if len(parts) == 3 else b""
    except binascii.Error:
        raw = b""
    if parts[0] != kind or len(raw) != 32:
        raise OpforgeError(f"{path} is not an opforge {kind.rsplit('-', 1)[1]} key (`opforge cache keygen NAME` "
                           "makes a pair)")
    return parts[1], raw


def keygen(name: str, directory: str = ".") -> tuple[str, str]:
    """Write ``NAME.secret`` (0600) and ``NAME.public`` in ``directory``; returns their paths.
    An existing secret is never overwritten."""
    from cryptography.hazmat.primitives import serialization

    ed25519 = _crypto()
    if not name or ":" in name or os.sep in name:
        raise ValueError(f"key name {name!r}: use letters, digits, '-' and '.'")
    secret_path = os.path.join(directory, f"{name}.secret")
    public_path = os.path.join(directory, f"{name}.public")
    if os.path.exists(secret_path):
        raise OpforgeError(f"{secret_path} exists: keygen does not overwrite a key; remove it first or pick another name")
    key = ed25519.Ed25519PrivateKey.generate()
    raw_secret = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                   serialization.NoEncryption())
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(f"{SECRET}:{name}:{base64.b64encode(raw_secret).decode()}\n")
    atomic_write(public_path, f"{PUBLIC}:{name}:{base64.b64encode(raw_public).decode()}\n")
    return secret_path, public_path


def check_secret(secret_file: str) -> str:
    """The name of the secret key in ``secret_file``; OpforgeError (saying why) when it can't sign."""
    ed25519 = _crypto()
    name, raw = _read(secret_file, SECRET)
    ed25519.Ed25519PrivateKey.from_private_bytes(raw)
    return name


def sign(data: bytes, secret_file: str) -> dict:
    ed25519 = _crypto()
    name, raw = _read(secret_file, SECRET)
    key = ed25519.Ed25519PrivateKey.from_private_bytes(raw)
    return {"key": name, "signature": base64.b64encode(key.sign(data)).decode()}


def trusted(paths) -> list[PublicKey]:
    return [PublicKey(*_read(p, PUBLIC)) for p in paths]


def verify(data: bytes, doc: dict | None, keys: list[PublicKey]) -> Decision:
    """Accepted (naming the key) when ``doc`` is a valid signature of ``data`` by one of ``keys``."""
    if not doc:
        return Rejected("it is unsigned")
    ed25519 = _crypto()
    from cryptography.exceptions import InvalidSignature

    try:
        sig = base64.b64decode(str(doc.get("signature", "")), validate=True)
    except binascii.Error:
        return Rejected("its signature is not valid base64")
    for key in keys:
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(key.raw).verify(sig, data)
        except InvalidSignature:
            continue
        return Accepted(f"signed by {key.name}")
    said = doc.get("key", "?")
    if not keys:
        return Rejected(f"it is signed by {said!r}, but no key is trusted (set OPFORGE_TRUSTED_KEYS)")
    return Rejected(f"its signature (by {said!r}) does not verify with any trusted key "
                    f"({', '.join(k.name for k in keys)})")
