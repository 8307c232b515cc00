"""Compression on upload from Python (docs/format.md "Pieces"): the
compress= option of Checkpointer and Client saves, and ckpt.format's
reading of compressed shards (manifest format 2, "CKPZ" v1 pieces decoded
with numpy and zstandard), bit-exact, loud on damage, and clear without
zstandard."""
import glob
import os
import struct
import sys

import pytest
import torch

import ckpt
import ckpt.format
import ckpt.torch

zstandard = pytest.importorskip("zstandard", reason="ckpt.format reads compressed pieces with zstandard")


def state():
    """Weights as training leaves them (a normal law, small: their
    exponent bytes compress), and bytes that do not compress."""
    g = torch.Generator().manual_seed(7)
    return {
        "w_bf16": (torch.randn(1024, 1024, generator=g) * 0.02).to(torch.bfloat16),  # 2 MiB
        "w_f32": torch.randn(512, 1024, generator=g) * 0.02,  # 2 MiB
        "noise": torch.randint(0, 256, (1 << 20,), dtype=torch.uint8, generator=g),  # 1 MiB, random
        "b": torch.randn(300, generator=g),  # a small tensor: shares a piece
        "note": "planes",
    }


def manifest(daemon, job, step):
    """(manifest dict, its shard object's path) of rank 0 of step."""
    d = os.path.join(daemon.store, job, f"step-{step:012d}")
    (path,) = glob.glob(os.path.join(d, "rank-00000-of-00001.*.manifest"))
    with open(path, "rb") as f:
        m = ckpt.format.read_manifest(f.read())
    return m, os.path.join(daemon.store, ckpt.format.shard_key(job, m))


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


def coded(m):
    return [p for p in m["pieces"] if p["codec"] == ckpt.format.CODEC_PLANES_ZSTD]


def test_compressed_save_restores_bit_exact(daemon):
    sd = state()
    with ckpt.torch.Checkpointer("cz", socket=daemon.sock, compress=True) as cp:
        cp.save(sd, 1).durable.result(60)
    m, obj = manifest(daemon, "cz", 1)
    assert m["format_version"] == 2
    assert sum(p["raw_bytes"] for p in m["pieces"]) == m["shard_bytes"]
    assert sum(p["stored_bytes"] for p in m["pieces"]) == os.path.getsize(obj)
    assert len(coded(m)) >= 2, m["pieces"]  # the weights
    assert any(p["codec"] == ckpt.format.CODEC_NONE for p in m["pieces"]), m["pieces"]  # the noise
    assert os.path.getsize(obj) * 10 < m["shard_bytes"] * 9
    # Without the daemon, from the file:// store.
    daemon.stop()
    assert_same(sd, ckpt.format.load_step(daemon.url, "cz"))
    # Through a new daemon (nothing in memory): from storage.
    daemon.start()
    got = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in sd.items()}
    with ckpt.torch.Checkpointer("cz", socket=daemon.sock) as cp:
        step, _ = cp.load(got)
        assert step == 1 and cp.last_load["source"] == "storage", cp.last_load
    assert_same(sd, got)


def test_save_option_overrides_the_job(daemon_factory):
    """[pool] compress = true: a save with compress=False is stored raw
    (format 1), one with the default compressed; Client.save's option too."""
    d = daemon_factory("[pool]\ncompress = true\n")
    sd = state()
    with ckpt.torch.Checkpointer("co", socket=d.sock, compress=False) as cp:
        cp.save(sd, 1).durable.result(60)
    m, obj = manifest(d, "co", 1)
    assert m["format_version"] == 1 and m["pieces"] == []
    assert os.path.getsize(obj) == m["shard_bytes"]
    with ckpt.torch.Checkpointer("co", socket=d.sock, exist_ok=True) as cp:
        cp.save(sd, 2).durable.result(60)
    m, _ = manifest(d, "co", 2)
    assert m["format_version"] == 2 and coded(m)
    with ckpt.Client(d.sock, job="raw") as c:
        b = c.alloc(1 << 20)
        b.view[:] = (torch.randn(1 << 19) * 0.02).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        spec = ckpt.TensorSpec("w", "bf16", (1 << 19,), b, 0, 1 << 20)
        c.save(1, [spec], compress=False).durable.result(60)
        c.save(2, [spec]).durable.result(60)
        with pytest.raises(ValueError, match="compress"):
            c.save(3, [spec], compress="yes")
    assert manifest(d, "raw", 1)[0]["format_version"] == 1
    assert manifest(d, "raw", 2)[0]["format_version"] == 2
    assert ckpt.format.list_steps(d.url, "raw") == [(1, True), (2, True)]
    with pytest.raises(ValueError, match="compress"):
        ckpt.torch.Checkpointer("co", socket=d.sock, compress=1)


def test_damaged_coded_piece_names_it(daemon):
    with ckpt.torch.Checkpointer("cd", socket=daemon.sock, compress=True) as cp:
        cp.save(state(), 1).durable.result(60)
    daemon.stop()
    m, obj = manifest(daemon, "cd", 1)
    i = next(i for i, p in enumerate(m["pieces"]) if p["codec"] == ckpt.format.CODEC_PLANES_ZSTD)
    at = sum(p["stored_bytes"] for p in m["pieces"][:i])
    key = ckpt.format.shard_key("cd", m)

    def flip(off):
        with open(obj, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x01]))

    # Plane 0's stored length: the lengths no longer add up.
    flip(at + 16 + 8)
    with pytest.raises(ValueError, match=rf"{key}: piece {i} \(shard bytes \d+\+\d+, object bytes {at}\+\d+\) "
                                         r"does not decode"):
        ckpt.format.load_step(daemon.url, "cd")
    flip(at + 16 + 8)
    # In a plane's data: it does not decode, or a CRC32C catches it.
    flip(at + m["pieces"][i]["stored_bytes"] // 2)
    with pytest.raises(ValueError, match="does not decode|crc32c mismatch"):
        ckpt.format.load_step(daemon.url, "cd")
    flip(at + m["pieces"][i]["stored_bytes"] // 2)
    assert ckpt.format.load_step(daemon.url, "cd")["note"] == "planes"
    daemon.start()


def test_without_zstandard_a_coded_step_says_what_to_install(daemon, monkeypatch):
    with ckpt.torch.Checkpointer("cn", socket=daemon.sock, compress=True) as cp:
        cp.save(state(), 1).durable.result(60)
        cp.save({"w": torch.arange(10)}, 2).durable.result(60)
    with ckpt.torch.Checkpointer("cn", socket=daemon.sock, exist_ok=True, compress=False) as cp:
        cp.save(state(), 3).durable.result(60)
    assert coded(manifest(daemon, "cn", 1)[0]) and not coded(manifest(daemon, "cn", 2)[0])
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match="pip install zstandard"):
        ckpt.format.load_step(daemon.url, "cn", step=1)
    # Steps without coded pieces need no zstandard.
    assert torch.equal(ckpt.format.load_step(daemon.url, "cn", step=2)["w"], torch.arange(10))
    assert ckpt.format.load_step(daemon.url, "cn", step=3)["note"] == "planes"


def test_other_format_versions_are_refused_clearly():
    for v in (0, 3):
        with pytest.raises(ValueError, match=rf"format version {v}: this reader \(ckpt.format\) reads versions 1 "
                                             "and 2"):
            ckpt.format.read_manifest(bytes([0x08, v]))
    # Version and pieces must agree (pieces_check): 2 without, 1 with.
    piece = bytes([0x08, 4, 0x10, 4])  # raw 4, stored 4, CODEC_NONE
    with pytest.raises(ValueError, match="format version 2 with 0 pieces"):
        ckpt.format.read_manifest(bytes([0x08, 2, 0x48, 4]))
    with pytest.raises(ValueError, match="format version 1 with 1 pieces"):
        ckpt.format.read_manifest(bytes([0x08, 1, 0x48, 4, 0x7A, len(piece)]) + piece)
    m = ckpt.format.read_manifest(bytes([0x08, 2, 0x48, 4, 0x7A, len(piece)]) + piece)
    assert m["pieces"] == [{"raw_bytes": 4, "stored_bytes": 4, "codec": 0, "elem": 0, "hash": b"", "ref": "",
                           "ref_offset": 0}]
    with pytest.raises(ValueError, match="pieces hold 4 of the shard's 5 bytes"):
        ckpt.format.read_manifest(bytes([0x08, 2, 0x48, 5, 0x7A, len(piece)]) + piece)


# ---- the CKPZ v1 decoder's checks, those of planecodec_decode ----


def encode(raw, elem, zstd_planes=None, level=3):
    """A CKPZ v1 blob of raw as planecodec_encode lays it out, zstd for the
    planes in zstd_planes (default: every plane zstd makes smaller)."""
    m, tail = divmod(len(raw), elem)
    planes = [bytes(raw[k:m * elem:elem]) for k in range(elem)]
    hdr = b"CKPZ" + bytes([1, elem, 0, 0]) + struct.pack("<Q", len(raw))
    body = b""
    for k, p in enumerate(planes):
        z = zstandard.ZstdCompressor(level=level).compress(p)
        use = len(z) < m if zstd_planes is None else k in zstd_planes
        hdr += bytes([1 if use else 0]) + bytes(7) + struct.pack("<Q", len(z) if use else m)
        body += z if use else p
    return bytearray(hdr + body + bytes(raw[m * elem:]))


def decode(blob, n):
    return ckpt.format._planes_decode(bytes(blob), n, zstandard)


@pytest.mark.parametrize("elem", [1, 2, 4, 8])
def test_planes_roundtrip(elem):
    raw = ((torch.randn(4099) * 0.02).numpy().tobytes() * 3)[:8 * 4099 + elem - 1]  # a tail but for elem 1
    blob = encode(raw, elem)
    assert any(blob[16 + 16 * k] == 1 for k in range(elem))  # a zstd plane, at least
    assert decode(blob, len(raw)) == raw
    assert decode(encode(raw, elem, zstd_planes=()), len(raw)) == raw  # every plane raw


def test_planes_refuses_what_the_daemon_refuses():
    raw = (torch.randn(4096) * 0.02).numpy().tobytes()  # 16 KiB, elem 4: planes of 4096
    good = encode(raw, 4, zstd_planes=(3,))
    assert decode(good, len(raw)) == raw
    zlen = struct.unpack_from("<Q", good, 16 + 48 + 8)[0]

    def bad(mutate, n=len(raw)):
        b = bytearray(good)
        b = mutate(b) or b
        with pytest.raises(ValueError):
            decode(b, n)

    def at(off, v):
        return lambda b: b.__setitem__(off, v)

    bad(at(0, ord("X")))  # magic
    bad(at(4, 2))  # version
    bad(at(5, 3))  # elem
    bad(at(6, 1))  # zero bytes
    bad(at(7, 1))
    bad(lambda b: None, n=len(raw) - 4)  # n is not the piece's raw length
    bad(lambda b: b[:20])  # the plane table cut short
    bad(at(16, 2))  # method
    bad(at(16 + 3, 1))  # an entry's zero bytes
    bad(at(16 + 8, 1))  # a raw plane's length is not n / elem
    bad(lambda b: b + b"\0")  # a byte after the tail
    bad(lambda b: b[:-1])  # one short
    # A zstd plane must be strictly smaller than the plane, one frame of
    # exactly its bytes, that says it holds the plane and does.
    p3 = bytes(raw[3::4])
    hdr = 16 + 16 * 4
    head, frames_at = bytes(good[:16 + 48]), hdr + 3 * 4096

    def with_plane3(frame, length=None):
        b = bytearray(head) + struct.pack("<BxxxxxxxQ", 1, len(frame) if length is None else length)
        return b + good[hdr:frames_at] + frame

    assert decode(with_plane3(bytes(good[frames_at:frames_at + zlen])), len(raw)) == raw
    two = zstandard.ZstdCompressor().compress(p3[:2048]) + zstandard.ZstdCompressor().compress(p3[2048:])
    with pytest.raises(ValueError):
        decode(with_plane3(two), len(raw))
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(p3)
    with pytest.raises(ValueError):
        decode(with_plane3(unsized), len(raw))
    with pytest.raises(ValueError):  # says it holds the plane, but it is another length of bytes
        decode(with_plane3(zstandard.ZstdCompressor().compress(p3 + p3[:1])), len(raw))
    with pytest.raises(ValueError):  # a zero-length zstd plane
        decode(with_plane3(b"", 0), len(raw))
    with pytest.raises(ValueError):  # a frame cut short
        decode(with_plane3(bytes(good[frames_at:frames_at + zlen - 1])), len(raw))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_writer_compresses(daemon):
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
        pytest.skip(f"ckpt.dcp needs torch>=2.4 (this is torch {torch.__version__})")
    import ckpt.dcp
    sd = {k: v for k, v in state().items() if isinstance(v, torch.Tensor)}
    try:
        dcp.save(sd, storage_writer=ckpt.dcp.Writer("dz", step=1, socket=daemon.sock, rank=0, world_size=1,
                                                   compress=True), no_dist=True)
    finally:
        ckpt.dcp.close_all()
    m, _ = manifest(daemon, "dz", 1)
    assert m["format_version"] == 2 and coded(m)
    got = ckpt.format.load_step(daemon.url, "dz")
    assert all(torch.equal(got[k], v) for k, v in sd.items())


def test_incremental_steps_restore_through_references(daemon):
    """incremental=True: a frozen tensor is stored once and referred to by
    later steps; ckpt.format follows the references into the older
    shards, and so does the daemon; both are bit-exact."""
    g = torch.Generator().manual_seed(3)
    frozen = torch.randn(2048, 1024, generator=g)  # 8 MiB: two pieces, never changed
    steps = []
    with ckpt.torch.Checkpointer("inc", socket=daemon.sock, incremental=True, compress=True) as cp:
        for s in (1, 2, 3):
            sd = {"frozen": frozen, "adapter": torch.randn(64, 256, generator=g), "step": s}
            cp.save(sd, s).durable.result(60)
            steps.append(sd)
    m1, _ = manifest(daemon, "inc", 1)
    assert not any(p["ref"] for p in m1["pieces"])
    assert all(len(p["hash"]) == 16 for p in m1["pieces"])
    m3, obj3 = manifest(daemon, "inc", 3)
    refs = [p for p in m3["pieces"] if p["ref"]]
    assert sum(p["raw_bytes"] for p in refs) >= 8 << 20, m3["pieces"]
    # Each reference names the shard that holds the bytes: step 1's.
    assert all(p["ref"].startswith("step-000000000001/rank-00000-of-00001.") for p in refs), refs
    assert os.path.getsize(obj3) < 1 << 20
    daemon.stop()
    assert_same(steps[2], ckpt.format.load_step(daemon.url, "inc", 3))
    daemon.start()
    got = {"frozen": torch.zeros_like(frozen), "adapter": torch.zeros(64, 256), "step": None}
    with ckpt.torch.Checkpointer("inc", socket=daemon.sock) as cp:
        step, _ = cp.load(got, 3)
        assert step == 3 and cp.last_load["source"] == "storage", cp.last_load
    assert_same(steps[2], got)
    with pytest.raises(ValueError, match="incremental"):
        ckpt.torch.Checkpointer("inc", socket=daemon.sock, incremental="yes")


def test_piece_fields_of_32_bits_read_as_the_daemon_reads_them():
    """ManifestPiece's uint32 fields (codec, elem, ref) keep a varint's low
    32 bits, as protobuf-c does: a crafted ref of 2**32 + 1 is ref 1 to
    both readers, never an index only one of them takes."""
    def varint(v):
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)
    raw = (bytes([0x08]) + varint(4096) + bytes([0x10]) + varint(4096) + bytes([0x20]) + varint((1 << 32) + 4)
           + bytes([0x30]) + varint((1 << 32) + 1) + bytes([0x38]) + varint(1 << 40))
    p = ckpt.format._piece(raw)
    assert (p["raw_bytes"], p["stored_bytes"], p["elem"], p["ref"], p["ref_offset"]) == (4096, 4096, 4, 1, 1 << 40)
