"""A node's libp2p identity file and its peer id, read and written as hivemind does, without hivemind.

The file is libp2p's `PrivateKey` protobuf (`KeyType` RSA = 0 as field 1, the key's DER in
OpenSSL's traditional format as field 2); the peer id is the base58 of the sha2-256 multihash of
the `PublicKey` protobuf around the key's DER SubjectPublicKeyInfo (libp2p's peer-id spec), as
`hivemind.p2p.PeerID.from_identity` computes it. A bootstrap node that serves only the ZeroMQ
rendezvous names itself with it and so never loads hivemind (and torch, which hivemind imports):
the same file gives the same peer id to its DHT node later (a test checks both against hivemind).
"""

from __future__ import annotations

import hashlib
import os

from p2p_diloco.errors import DiscoveryError

RSA_KEY_TYPE = 0
RSA_BITS = 2048
BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
SHA2_256 = b"\x12\x20"
"""The multihash prefix of a sha2-256 digest: its code, then its length (32)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key_message(data: bytes) -> bytes:
    """libp2p's `PrivateKey` / `PublicKey` protobuf of an RSA key's `data` (proto2: the type always written)."""
    return b"\x08" + _varint(RSA_KEY_TYPE) + b"\x12" + _varint(len(data)) + data


def _key_data(blob: bytes, path: str) -> bytes:
    """The RSA key's data in a `PrivateKey` protobuf (`DiscoveryError` when it is not one)."""
    fields: dict[int, int | bytes] = {}
    i = 0
    try:
        while i < len(blob):
            tag, i = _read_varint(blob, i)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                fields[number], i = _read_varint(blob, i)
            elif wire == 2:
                size, i = _read_varint(blob, i)
                if i + size > len(blob):
                    raise ValueError("truncated")
                fields[number], i = blob[i:i + size], i + size
            else:
                raise ValueError(f"wire type {wire}")
    except (ValueError, IndexError) as e:
        raise DiscoveryError(f"identity file {path} is not a libp2p private key ({e})") from e
    data = fields.get(2)
    if fields.get(1, RSA_KEY_TYPE) != RSA_KEY_TYPE or not isinstance(data, bytes):
        raise DiscoveryError(f"identity file {path} holds no RSA private key (the kind hivemind writes)")
    return data


def _read_varint(blob: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = blob[i]
        n |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return n, i
        if shift > 63:
            raise ValueError("varint too long")


def _base58(raw: bytes) -> str:
    n, out = int.from_bytes(raw, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = BASE58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + out


def generate_identity(path: str) -> None:
    """A new RSA identity in `path`, readable by its owner only (as `hivemind.P2P.generate_identity`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "wb") as f:
        f.write(_key_message(der))


def peer_id_from_identity(path: str) -> str:
    """The libp2p peer id of the identity file `path`, created first if missing."""
    from cryptography.hazmat.primitives import serialization

    if not os.path.isfile(path):
        generate_identity(path)
    with open(path, "rb") as f:
        data = _key_data(f.read(), path)
    try:
        key = serialization.load_der_private_key(data, password=None)
    except ValueError as e:
        raise DiscoveryError(f"identity file {path} holds a damaged private key ({e})") from e
    public = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _base58(SHA2_256 + hashlib.sha256(_key_message(public)).digest())
