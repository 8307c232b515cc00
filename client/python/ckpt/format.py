"""ckpt.format: read a checkpoint step straight from storage, without the
daemon (docs/format.md "On-disk format").

    sd = ckpt.format.load_step("file:///mnt/ckpt", "llama")          # latest
    torch.save(sd, "llama.pt")

file:// reads the directory; s3://bucket/prefix reads through boto3 (its
own credential chain), with the daemon's URL options endpoint=, region= and
path_style=1, e.g. s3://ckpt/runs?endpoint=http://127.0.0.1:9000&path_style=1;
gs://bucket/prefix reads GCS's XML API through boto3 with an HMAC key
(GCS_HMAC_ACCESS_KEY_ID and GCS_HMAC_SECRET, as the daemon takes them; the
same endpoint= option).

It needs neither the daemon nor libckpt (import ckpt.format loads no
library), and checks CRC32C with the google-crc32c or crc32c wheel when one
is installed (pip install google-crc32c), else in pure Python (slow).

It reads manifests of format version 1 (the shard object is the raw shard)
and 2 (compression on upload, docs/format.md "Pieces": the object holds the
stored bytes of pieces that tile the raw shard). A CODEC_PLANES_ZSTD piece
(the "CKPZ" v1 blob of daemon/base/planecodec.h) is checked as the daemon's
decoder checks it and decoded with numpy and the zstandard package, imported
only when a step has such a piece (pip install zstandard, or
pip install 'ckptd[zstd]'; without it, such a step raises ImportError
saying so). A piece that does not decode raises ValueError naming the piece
and the object; the CRC32Cs stay those of the raw bytes, checked as for
format 1.
"""
from __future__ import annotations

import bisect
import io
import os
import re
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["load_step", "list_steps", "read_manifest", "crc32c", "crc32c_py", "CRC32C_IMPLEMENTATION", "CODEC_NONE",
           "CODEC_PLANES_ZSTD"]

# ---- a minimal protobuf reader for proto/ckpt.proto's Manifest ----


def _varint(b, i):
    shift = r = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << shift
        if c < 0x80:
            return r, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(b):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 2:
            n, i = _varint(b, i)
            v = bytes(b[i:i + n])
            if len(v) != n:
                raise ValueError("truncated field")
            i += n
        elif wt == 1:
            v = struct.unpack_from("<Q", b, i)[0]
            i += 8
        elif wt == 5:
            v = struct.unpack_from("<I", b, i)[0]
            i += 4
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, v


def _packed(v, wt):
    if wt == 0:
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint(v, i)
        out.append(x)
    return out


def _tensor(b):
    t = {"name": "", "dtype": 0, "global_shape": [], "box_offsets": [], "box_lengths": [], "shard_offset": 0,
         "nbytes": 0, "crc32c": 0}
    for num, wt, v in _fields(b):
        if num == 1:
            t["name"] = v.decode()
        elif num == 2:
            t["dtype"] = v
        elif num in (3, 4, 5):
            t[("global_shape", "box_offsets", "box_lengths")[num - 3]] += _packed(v, wt)
        elif num == 6:
            t["shard_offset"] = v
        elif num == 7:
            t["nbytes"] = v
        elif num == 8:
            t["crc32c"] = v
    if not t["box_lengths"]:
        t["box_offsets"] = [0] * len(t["global_shape"])
        t["box_lengths"] = list(t["global_shape"])
    return t


def _piece(b):
    p = {"raw_bytes": 0, "stored_bytes": 0, "codec": 0, "elem": 0, "hash": b"", "ref": 0, "ref_offset": 0}
    for num, wt, v in _fields(b):
        if num in (1, 2) and wt == 0:
            p[("raw_bytes", "stored_bytes")[num - 1]] = v
        elif num in (3, 4) and wt == 0:
            # 32-bit fields: the varint's low 32 bits, as protobuf-c reads
            # them, so the daemon and this reader agree on any manifest.
            p[("codec", "elem")[num - 3]] = v & 0xFFFFFFFF
        elif num == 5 and wt == 2:
            p["hash"] = bytes(v)
        elif num == 6 and wt == 0:
            p["ref"] = v & 0xFFFFFFFF  # uint32: an index into the manifest's refs; _check_pieces names it
        elif num == 7 and wt == 0:
            p["ref_offset"] = v
    return p


_REF = re.compile(r"^(?:step-(\d{12,20})|shards/([0-9a-f]{2})/step-(\d{12,20}))/"
                  r"rank-(\d{5})-of-(\d{5})\.[A-Za-z0-9._-]+\.[0-9a-f]{16}\.shard$")


def _ref_ok(m, ref):
    """Whether ref may be a piece's reference in m (manifest_ref_check): the
    shard of an older step of m's rank and world size, in that step's
    directory or its spread one."""
    g = _REF.match(ref)
    if g is None or ".." in ref:
        return False
    step = int(g.group(1) or g.group(3))
    if g.group(2) is not None and g.group(2) != f"{m['rank'] % 256:02x}":
        return False
    return step < m["step"] and int(g.group(4)) == m["rank"] and int(g.group(5)) == m["world_size"]


# Manifest format versions: 1, the shard stored raw; 2, in pieces
# (docs/format.md "Pieces"), which pieces_check (daemon/catalog/pieces.c)
# checks as _check_pieces does.
FORMAT_RAW, FORMAT_PIECES = 1, 2
CODEC_NONE, CODEC_PLANES_ZSTD = 0, 1
_PIECE_MAX_BYTES = 64 << 20


def _check_pieces(m, refs=()):
    """The manifest's pieces as the daemon's pieces_check takes them: a
    format 2 manifest has pieces, a format 1 none; they tile the shard;
    each has a known codec and a stored length it can have; references
    name older shards of the same rank (refs, the manifest's list: each
    piece's "ref" becomes the shard's name, "" for its own)."""
    pieces = m["pieces"]
    if bool(pieces) != (m["format_version"] == FORMAT_PIECES):
        raise ValueError(f"manifest format version {m['format_version']} with {len(pieces)} pieces")
    pb = m.get("piece_bytes", 0)
    if pb and (pb < 4096 or pb > _PIECE_MAX_BYTES or pb % 4096):
        raise ValueError(f"manifest piece_bytes {pb} is not a multiple of 4096 up to {_PIECE_MAX_BYTES}")
    if len(refs) > 64 or (refs and not pieces):
        raise ValueError(f"manifest refers to {len(refs)} older shards")
    for k, ref in enumerate(refs):
        if not _ref_ok(m, ref):
            raise ValueError(f"manifest reference {k + 1}, '{ref[:200]}', is not a shard of an older step of rank "
                             f"{m['rank']} of {m['world_size']}")
    for p in pieces:
        if isinstance(p["ref"], int):
            p["ref"] = "" if p["ref"] == 0 else refs[p["ref"] - 1] if p["ref"] <= len(refs) else None
    raw = 0
    for i, p in enumerate(pieces):
        ok = 0 < p["raw_bytes"] <= _PIECE_MAX_BYTES and p["raw_bytes"] <= m["shard_bytes"] - raw
        if ok and p["codec"] == CODEC_NONE:
            ok = p["stored_bytes"] == p["raw_bytes"]
        elif ok and p["codec"] == CODEC_PLANES_ZSTD:
            # planecodec_bound: a plane is never stored larger than it is.
            ok = p["elem"] in (1, 2, 4, 8) and \
                16 + 16 * p["elem"] <= p["stored_bytes"] <= p["raw_bytes"] + 16 + 16 * 8
        else:
            ok = False
        ok = ok and len(p["hash"]) in (0, 16) and p["ref"] is not None and (p["ref"] != "" or p["ref_offset"] == 0)
        if not ok:
            raise ValueError(f"manifest piece {i}: {p['raw_bytes']} raw bytes stored in {p['stored_bytes']} by "
                             f"codec {p['codec']} elem {p['elem']} cannot be")
        raw += p["raw_bytes"]
    if pieces and raw != m["shard_bytes"]:
        raise ValueError(f"manifest pieces hold {raw} of the shard's {m['shard_bytes']} bytes")


def read_manifest(data: bytes) -> Dict[str, Any]:
    """Decode one rank's manifest (proto/ckpt.proto's Manifest, format
    version 1 or 2) from data, its bytes. Returns a dict: format_version,
    job, step, rank, world_size, attempt_id, created_unix_ns (only when the
    manifest has it), shard_name, shard_dir ("" but with layout spread),
    shard_bytes, chunk_bytes, chunk_crc32c (ints), extra_state (bytes),
    tensors, a list of dicts: name, dtype (ckptd's dtype code), global_shape,
    box_offsets, box_lengths (the whole tensor when no box is saved),
    shard_offset, nbytes, crc32c; and pieces (empty in format 1; in format
    2, docs/format.md "Pieces"), a list of dicts: raw_bytes, stored_bytes,
    codec (CODEC_NONE or CODEC_PLANES_ZSTD), elem. Raises ValueError when
    data is malformed, its pieces do not tile the shard, or it is of
    another format version."""
    try:
        return _read_manifest(data)
    except (IndexError, struct.error, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed manifest: {e}") from e


def shard_key(job: str, m: Dict[str, Any]) -> str:
    """The storage key (under the store's root) of the shard of m, a
    manifest of job as read_manifest returns it: job/step-<12 digits>/NAME,
    or with layout spread job/shards/<rank % 256, 2 hex digits>/step-<12
    digits>/NAME. Raises ValueError when its shard_name is not one of its
    own rank's (rank-<5 digits>-of-....shard, no '/') or its shard_dir is
    not its rank's spread directory."""
    if "/" in m["shard_name"] or not m["shard_name"].startswith(f"rank-{m['rank']:05d}-of-") \
            or not m["shard_name"].endswith(".shard"):
        raise ValueError(f"rank {m['rank']}: manifest names no shard of its own")
    step_dir = f"step-{m['step']:012d}"
    if not m["shard_dir"]:
        return f"{job}/{step_dir}/{m['shard_name']}"
    if m["shard_dir"] != f"shards/{m['rank'] % 256:02x}/{step_dir}":
        raise ValueError(f"rank {m['rank']}: manifest's shard_dir {m['shard_dir']!r} is not its spread directory")
    return f"{job}/{m['shard_dir']}/{m['shard_name']}"


def _read_manifest(data):
    m = {"format_version": 0, "job": "", "step": 0, "rank": 0, "world_size": 0, "attempt_id": "",
         "shard_name": "", "shard_dir": "", "shard_bytes": 0, "chunk_bytes": 0, "chunk_crc32c": [], "tensors": [],
         "extra_state": b"", "pieces": [], "piece_bytes": 0}
    refs: List[str] = []
    names = {1: "format_version", 3: "step", 4: "rank", 5: "world_size", 7: "created_unix_ns", 9: "shard_bytes",
             10: "chunk_bytes"}
    for num, wt, v in _fields(data):
        if num in names:
            m[names[num]] = v
        elif num == 2:
            m["job"] = v.decode()
        elif num == 6:
            m["attempt_id"] = v.decode()
        elif num == 8:
            m["shard_name"] = v.decode()
        elif num == 11:
            m["chunk_crc32c"] += _packed(v, wt)
        elif num == 12:
            m["tensors"].append(_tensor(v))
        elif num == 13:
            m["extra_state"] = v
        elif num == 14:
            m["shard_dir"] = v.decode()
        elif num == 15 and wt == 2:
            m["pieces"].append(_piece(v))
        elif num == 16 and wt == 2:
            refs.append(bytes(v).decode())
        elif num == 17 and wt == 0:
            m["piece_bytes"] = v
    if m["format_version"] not in (FORMAT_RAW, FORMAT_PIECES):
        newer = "; a newer ckptd wrote it (upgrade the ckptd package)" if m["format_version"] > FORMAT_PIECES else ""
        raise ValueError(f"manifest format version {m['format_version']}: this reader (ckpt.format) reads versions "
                         f"{FORMAT_RAW} and {FORMAT_PIECES}{newer}")
    _check_pieces(m, refs)
    return m


# ---- crc32c (Castagnoli): a wheel's when installed, else table-driven ----

_TABLE = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c_py(data: Union[bytes, bytearray, memoryview], crc: int = 0) -> int:
    """CRC32C (Castagnoli) of data, bytes-like, in pure Python (about 8
    MiB/s): what crc32c falls back to without a wheel. crc: the CRC of the
    bytes before data, to go on from (0: none). Returns the CRC, an int."""
    crc ^= 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _fast_crc32c():
    """(function, its name) of an installed CRC32C wheel, or None."""
    try:
        import google_crc32c
        if google_crc32c.implementation == "c":
            def crc32c(data, crc=0):
                """CRC32C (Castagnoli) of data, bytes-like, by the
                google-crc32c wheel. crc: the CRC of the bytes before data,
                to go on from (0: none). Returns the CRC, an int."""
                return google_crc32c.extend(crc, bytes(data) if isinstance(data, memoryview) else data)
            return crc32c, "google-crc32c"
    except (ImportError, AttributeError):
        pass
    try:
        import crc32c as _c32

        def crc32c(data, crc=0):
            """CRC32C (Castagnoli) of data, bytes-like, by the crc32c wheel.
            crc: the CRC of the bytes before data, to go on from (0: none).
            Returns the CRC, an int."""
            return _c32.crc32c(data, crc)
        return crc32c, "crc32c"
    except (ImportError, AttributeError, TypeError):
        pass
    return None


_fast = _fast_crc32c()
# crc32c(data, crc=0): a wheel's when one is installed, else crc32c_py;
# CRC32C_IMPLEMENTATION names which ("google-crc32c", "crc32c", "python").
crc32c = _fast[0] if _fast else crc32c_py
CRC32C_IMPLEMENTATION = _fast[1] if _fast else "python"


# ---- a shard's pieces (format 2): CKPZ v1, daemon/base/planecodec.h ----


class _Damaged(ValueError):
    """A CKPZ blob that planecodec_decode would refuse (why: its text)."""


def _zstandard(key: str) -> Any:
    """The zstandard module, imported now: only a step with a coded piece
    needs it. ImportError saying how to install it when it is missing."""
    try:
        import zstandard
    except ImportError as e:
        raise ImportError(f"{key} has compressed pieces (CODEC_PLANES_ZSTD, docs/format.md \"Pieces\"): reading "
                          "them needs the zstandard package: pip install zstandard (or pip install 'ckptd[zstd]')"
                          ) from e
    return zstandard


def _le64(b: bytes, at: int) -> int:
    return int.from_bytes(b[at:at + 8], "little")


def _planes_decode(blob: Union[bytes, memoryview], n: int, zstd: Any) -> bytes:
    """The n raw bytes of a CODEC_PLANES_ZSTD piece from blob, its stored
    bytes: "CKPZ" version 1 (daemon/base/planecodec.h), checked as
    planecodec_decode checks it (magic, version, elem 1, 2, 4 or 8, zero
    bytes, the raw length n, each plane raw (its n // elem bytes) or one
    zstd frame, strictly smaller, that records and holds n // elem bytes,
    and the stored lengths and the tail adding up to len(blob) exactly).
    zstd: the zstandard module. Raises ValueError (why) when blob is not a
    blob the daemon could have stored for n bytes."""
    import numpy as np
    b = bytes(blob)
    if len(b) < 16 or b[:4] != b"CKPZ" or b[4] != 1 or b[5] not in (1, 2, 4, 8) or b[6] or b[7] or \
            _le64(b, 8) != n:
        raise _Damaged("its header is not CKPZ version 1 of this piece's length")
    elem = b[5]
    m, tail = divmod(n, elem)
    off = 16 + 16 * elem
    if len(b) < off:
        raise _Damaged("its plane table is cut short")
    spans = []
    for k in range(elem):
        e = b[16 + 16 * k:32 + 16 * k]
        ln = _le64(e, 8)
        if any(e[1:8]) or (ln != m if e[0] == 0 else e[0] != 1 or ln == 0 or ln >= m) or ln > len(b) - off:
            raise _Damaged(f"plane {k}'s entry (method {e[0]}, {ln} bytes) cannot be")
        spans.append((e[0], off, ln))
        off += ln
    if len(b) - off != tail:
        raise _Damaged(f"its planes and tail hold {off + tail} bytes, the piece {len(b)}")
    planes = []
    for k, (method, at, ln) in enumerate(spans):
        if method == 0:
            planes.append(b[at:at + ln])
            continue
        frame = b[at:at + ln]
        try:
            size = zstd.frame_content_size(frame)
            d = zstd.ZstdDecompressor().decompressobj()
            out = d.decompress(frame) if size == m else b""
            whole = d.eof and not d.unused_data
        except zstd.ZstdError as e:
            raise _Damaged(f"plane {k}'s zstd frame does not decode: {e}") from e
        if size != m or not whole or len(out) != m:
            raise _Damaged(f"plane {k} is not one zstd frame of its {m} bytes")
        planes.append(out)
    if elem == 1:
        body = planes[0]
    else:
        merged = np.empty((m, elem), dtype=np.uint8)
        for k, p in enumerate(planes):
            merged[:, k] = np.frombuffer(p, dtype=np.uint8)
        body = merged.tobytes()
    return body + b[off:]


class _Shard:
    """A rank's shard read from its object (key: its name, for messages):
    raw bytes, whether the object holds them as they are (no pieces) or in
    pieces. A piece is decoded once for reads in ascending order (as
    load_step reads a manifest's tensors): those before a read's first
    piece are dropped, so that at most a read's worth stays decoded."""

    def __init__(self, key: str, obj: bytes, pieces: Sequence[Dict[str, Any]], job: str = "",
                 read: Optional[Any] = None) -> None:
        """pieces that an incremental step keeps in an older step's shard
        (a ref) are read from there, through read(key) (a whole object,
        read once), relative to job."""
        self.key, self.obj, self.pieces = key, obj, pieces
        self.job, self._read = job, read
        self._objs: Dict[str, bytes] = {}
        self.raw = [0]
        self.at = []  # where each piece's stored bytes begin in its object
        own = 0
        for p in pieces:
            self.raw.append(self.raw[-1] + p["raw_bytes"])
            self.at.append(p["ref_offset"] if p["ref"] else own)
            if not p["ref"]:
                own += p["stored_bytes"]
        self._decoded: Dict[int, bytes] = {}
        self._zstd: Optional[Any] = None
        if pieces and len(obj) != own:
            raise ValueError(f"{key}: the object holds {len(obj)} bytes, its pieces {own}")

    def _object(self, i: int) -> Tuple[str, bytes]:
        ref = self.pieces[i]["ref"]
        if not ref:
            return self.key, self.obj
        key = f"{self.job}/{ref}"
        if key not in self._objs:
            if self._read is None:
                raise ValueError(f"{self.key}: piece {i} is in {key}, and no store to read it from")
            self._objs[key] = self._read(key)
        return key, self._objs[key]

    def _piece(self, i: int) -> bytes:
        got = self._decoded.get(i)
        if got is not None:
            return got
        p = self.pieces[i]
        key, obj = self._object(i)
        if self.at[i] + p["stored_bytes"] > len(obj):
            raise ValueError(f"{key}: piece {i} (object bytes {self.at[i]}+{p['stored_bytes']}) is past the "
                             f"object's {len(obj)} bytes")
        stored = memoryview(obj)[self.at[i]:self.at[i] + p["stored_bytes"]]
        if p["codec"] == CODEC_NONE:
            got = bytes(stored)
        else:
            if self._zstd is None:
                self._zstd = _zstandard(self.key)
            try:
                got = _planes_decode(stored, p["raw_bytes"], self._zstd)
            except _Damaged as e:
                raise ValueError(f"{key}: piece {i} (shard bytes {self.raw[i]}+{p['raw_bytes']}, object bytes "
                                 f"{self.at[i]}+{p['stored_bytes']}) does not decode ({e}): the object is "
                                 "damaged") from e
        self._decoded[i] = got
        return got

    def read(self, off: int, n: int) -> bytes:
        """Raw bytes [off, off + n) of the shard; fewer where it ends
        before."""
        if not self.pieces:
            return self.obj[off:off + n]
        end = min(off + n, self.raw[-1])
        if off >= end:
            return b""
        first = bisect.bisect_right(self.raw, off) - 1
        last = bisect.bisect_right(self.raw, end - 1) - 1
        for i in [i for i in self._decoded if i < first]:
            del self._decoded[i]
        parts = [self._piece(i)[max(off, self.raw[i]) - self.raw[i]:min(end, self.raw[i + 1]) - self.raw[i]]
                 for i in range(first, last + 1)]
        return parts[0] if len(parts) == 1 else b"".join(parts)


# ---- steps ----


class _FileStore:
    def __init__(self, root):
        self.root = root

    def names(self, prefix):
        """{name: mtime (ns)} directly under prefix (a directory)."""
        d = os.path.join(self.root, prefix)
        out = {}
        for n in os.listdir(d):
            try:
                out[n] = os.stat(os.path.join(d, n)).st_mtime_ns
            except FileNotFoundError:
                pass
        return out

    def read(self, key):
        """The bytes of the file key (relative to the root); OSError if
        it cannot be read."""
        with open(os.path.join(self.root, key), "rb") as f:
            return f.read()


class _S3Store:
    def __init__(self, url):
        import urllib.parse
        import boto3
        from botocore.config import Config
        u = urllib.parse.urlsplit(url)
        q = dict(urllib.parse.parse_qsl(u.query))
        self.bucket = u.netloc
        self.prefix = u.path.strip("/")
        cfg = Config(s3={"addressing_style": "path" if q.get("path_style") in ("1", "true") else "auto"})
        # A session of its own: boto3's default one keeps the first
        # credentials it found for the life of the process.
        self.s3 = boto3.session.Session().client("s3", endpoint_url=q.get("endpoint"), region_name=q.get("region"),
                                                 config=cfg)

    def _key(self, k):
        return f"{self.prefix}/{k}" if self.prefix else k

    def names(self, prefix):
        """{name: mtime (ns)} directly under prefix: its objects, and its
        sub-prefixes (mtime 0). FileNotFoundError when there is nothing."""
        p = self._key(prefix).rstrip("/") + "/"
        out = {}
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=p, Delimiter="/"):
            for c in page.get("CommonPrefixes", []):
                out.setdefault(c["Prefix"][len(p):].rstrip("/"), 0)
            for o in page.get("Contents", []):
                out[o["Key"][len(p):]] = int(o["LastModified"].timestamp() * 1e9)
        if not out:
            raise FileNotFoundError(f"nothing under s3://{self.bucket}/{p}")
        return out

    def read(self, key):
        """The bytes of object key (under the URL's prefix); botocore's
        errors raise."""
        return self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()


class _GcsStore(_S3Store):
    """gs://bucket/prefix: GCS's XML API, which speaks S3's, signed with an
    HMAC key (GCS_HMAC_ACCESS_KEY_ID, GCS_HMAC_SECRET)."""

    def __init__(self, url):
        import urllib.parse
        import boto3
        from botocore.config import Config
        u = urllib.parse.urlsplit(url)
        q = dict(urllib.parse.parse_qsl(u.query))
        ak, sk = os.environ.get("GCS_HMAC_ACCESS_KEY_ID"), os.environ.get("GCS_HMAC_SECRET")
        if not ak or not sk:
            raise ValueError(f"{url}: reading gs:// without the daemon needs an HMAC key in "
                             "GCS_HMAC_ACCESS_KEY_ID and GCS_HMAC_SECRET")
        self.bucket = u.netloc
        self.prefix = u.path.strip("/")
        cfg = Config(s3={"addressing_style": "path"}, signature_version="s3v4")
        self.s3 = boto3.session.Session().client(
            "s3", endpoint_url=q.get("endpoint", "https://storage.googleapis.com"),
            region_name=q.get("region", "auto"), aws_access_key_id=ak, aws_secret_access_key=sk, config=cfg)


def _store(url):
    if url.startswith("file://"):
        return _FileStore(url[len("file://"):])
    if url.startswith("s3://"):
        return _S3Store(url)
    if url.startswith("gs://"):
        return _GcsStore(url)
    raise ValueError(f"{url}: readable without the daemon are file://, s3:// and gs://")


_V2 = re.compile(r"^rank-(\d{5})-of-(\d{5})\.([A-Za-z0-9_-][A-Za-z0-9._-]*)\.manifest$")
_V1 = re.compile(r"^rank-(\d{5})-of-(\d{5})\.manifest$")
_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")


def _commit(st, job, step, d):
    """(attempt, world_size) of a step's commit object, checked as the
    daemon checks it (catalog_read_commit): version 1, this job and step."""
    f = {1: 0, 2: "", 3: -1, 4: "", 5: 0}
    for num, wt, v in _fields(st.read(f"{d}/commit")):
        if num in (2, 4) and wt == 2:
            f[num] = v.decode()
        elif num in (1, 3, 5) and wt == 0:
            f[num] = v
    if f[1] != 1 or f[2] != job or f[3] != step or not _NAME.match(f[4]) or not f[5]:
        raise ValueError(f"{d}/commit: not a valid commit object for this step")
    return f[4], f[5]


def _groups(st, job, step):
    """The step's attempts from one listing, as the daemon decides them
    (catalog.h): {(attempt, world_size): {rank: manifest key, or the
    manifest itself when it had to be read (format 1)}}, the
    complete one chosen (the commit object's, else the one that completed
    first), or None. Format 1 manifests are read to learn their attempt.
    Errors are raised, never taken for "incomplete"."""
    d = f"{job}/step-{step:012d}"
    names = st.names(d)
    groups, newest = {}, {}
    for n, t in names.items():
        m2, m1 = _V2.match(n), _V1.match(n)
        if m2:
            key = (m2.group(3), int(m2.group(2)))
            rank = int(m2.group(1))
        elif m1:
            m = read_manifest(st.read(f"{d}/{n}"))
            key, rank, t = (m["attempt_id"], m["world_size"]), m["rank"], m["created_unix_ns"]
        else:
            continue
        if rank >= key[1]:
            continue
        groups.setdefault(key, {})[rank] = m if m1 else f"{d}/{n}"
        newest[key] = max(newest.get(key, 0), t)
    complete = [k for k, g in groups.items() if len(g) == k[1]]
    if "commit" in names:
        pin = _commit(st, job, step, d)
        return d, groups, (pin if pin in complete else None)
    complete.sort(key=lambda k: (newest[k], k[0]))
    return d, groups, (complete[0] if complete else None)


def list_steps(url: str, job: str) -> List[Tuple[int, bool]]:
    """The steps of job in the storage at url (file://, s3:// or gs://, as
    the module's text says). Returns [(step, complete)] by ascending step;
    complete: one attempt has every rank's manifest (the commit object's
    attempt, when the step has one). Raises FileNotFoundError when the job
    has nothing there, ValueError for another kind of URL or an invalid
    commit object or manifest, and the store's own errors (OSError,
    botocore's)."""
    st = _store(url)
    out = []
    for n in sorted(st.names(job)):
        if n.startswith("step-") and n[5:].isdigit():
            s = int(n[5:])
            out.append((s, _groups(st, job, s)[2] is not None))
    return out


def load_step(url: str, job: str, step: Union[int, str] = "latest", verify: bool = True) -> Any:
    """The state dict of step of job in the storage at url (as list_steps),
    read from every rank's shard, each tensor assembled on the CPU to its
    global shape. step: a step number, or "latest" (or -1) for the newest
    complete step. verify: check every tensor's crc32c
    (CRC32C_IMPLEMENTATION says with what). Checkpointer saves come back
    with their nesting and non-tensor values; DCP saves as a flat
    {fqn: value}, each non-tensor value torch.load'ed from its bytes.
    A compressed step (manifest format 2) is decoded piece by piece; its
    coded pieces need the zstandard package (the module's text).
    Raises FileNotFoundError when there is no complete step (or step is
    not complete), ValueError for a manifest that is malformed or not the
    one its name says, a short shard, a piece that does not decode (naming
    the piece and the object) or a crc32c mismatch, ImportError for a step
    with coded pieces where zstandard is not installed, and the store's
    own errors. The step's extra state is unpickled: read only checkpoints
    you trust."""
    import torch

    from ._dtypes import DTYPE_NAMES
    from ._tree import TORCH_DTYPES, _materialize, load_meta
    st = _store(url)
    if step in ("latest", -1):
        done = [s for s, c in list_steps(url, job) if c]
        if not done:
            raise FileNotFoundError(f"job '{job}' has no complete step under {url}")
        step = done[-1]
    d, groups, best = _groups(st, job, int(step))
    if best is None:
        raise FileNotFoundError(f"step {step} of job '{job}' is not complete")
    group = [m if isinstance(m, dict) else read_manifest(st.read(m))
             for m in (groups[best][r] for r in range(best[1]))]
    for r, m in enumerate(group):
        # The manifest must be the one its name says (catalog.c checks the same).
        if (m["job"], m["step"], m["rank"], m["world_size"], m["attempt_id"]) != (job, int(step), r, best[1], best[0]):
            raise ValueError(f"step {step} of job '{job}': the manifest listed for rank {r} of attempt '{best[0]}' "
                             f"describes rank {m['rank']} of {m['world_size']}, step {m['step']} of "
                             f"'{m['job']}', attempt '{m['attempt_id']}'")
    full: Dict[str, Any] = {}
    for m in group:
        key = shard_key(job, m)
        shard = _Shard(key, st.read(key), m["pieces"], job, st.read)
        for t in m["tensors"]:
            raw = shard.read(t["shard_offset"], t["nbytes"])
            if len(raw) != t["nbytes"]:
                raise ValueError(f"tensor '{t['name']}' of rank {m['rank']}: shard too short")
            if verify and crc32c(raw) != t["crc32c"]:
                raise ValueError(f"tensor '{t['name']}' of rank {m['rank']}: crc32c mismatch")
            dtype = TORCH_DTYPES[DTYPE_NAMES[t["dtype"]]]
            g = full.get(t["name"])
            if g is None:
                g = full[t["name"]] = torch.empty(t["global_shape"], dtype=dtype)
            part = torch.frombuffer(bytearray(raw), dtype=dtype).view(t["box_lengths"]) if raw else \
                torch.empty(t["box_lengths"], dtype=dtype)
            view = g
            for dim, (o, n) in enumerate(zip(t["box_offsets"], t["box_lengths"])):
                view = view.narrow(dim, o, n)
            view.copy_(part)
    tree, _ = load_meta(group[0]["extra_state"])
    if tree is not None:
        return _materialize(tree, full)
    out = {}
    for name, t in full.items():
        if name.startswith("__bytes__/"):
            out[name[len("__bytes__/"):]] = torch.load(io.BytesIO(t.numpy().tobytes()), weights_only=False)
        else:
            out[name] = t
    return out
