"""Writes the small data files of tests/errors/data_*.dp (committed; rerun
with /usr/bin/python3 tests/errors/data/make.py from the repository root
to make them again). Each good file holds 8 samples; each bad one has one
thing wrong that dpc must see from its header."""
import gzip, os
import numpy as np

d = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(0)

def npy(name, a, **kw):
    np.save(os.path.join(d, name), a, **kw)

def idx(name, a, gz=True, magic=None):
    hdr = bytes([0, 0, 8, a.ndim]) if magic is None else magic
    hdr += b"".join(int(n).to_bytes(4, "big") for n in a.shape)
    raw = hdr + a.astype(np.uint8).tobytes()
    with (gzip.open if gz else open)(os.path.join(d, name), "wb") as f:
        f.write(raw)

def shard(name, ntok, magic=20240520, version=1, cut=0):
    h = np.zeros(256, np.int32)
    h[0], h[1], h[2] = magic, version, ntok
    b = h.tobytes() + rng.integers(0, 11, ntok).astype(np.uint16).tobytes()
    with open(os.path.join(d, name), "wb") as f:
        f.write(b[: len(b) - cut] if cut else b)

npy("x6.npy", rng.standard_normal((8, 6)).astype(np.float32))
npy("y8.npy", rng.integers(0, 5, 8).astype(np.int64))
npy("y6.npy", rng.integers(0, 5, 6).astype(np.int32))          # 6 samples, not 8
npy("x_f64.npy", rng.standard_normal((8, 6)))                   # '<f8'
npy("x7.npy", rng.standard_normal((8, 7)).astype(np.float32))   # 7 per sample
npy("y_f32.npy", rng.standard_normal(8).astype(np.float32))     # floats as labels
np.save(os.path.join(d, "x_fortran.npy"), np.asfortranarray(rng.standard_normal((8, 6)).astype(np.float32)))
with open(os.path.join(d, "junk.npy"), "wb") as f:
    f.write(b"this is not an npy file" * 4)
idx("images.idx.gz", rng.integers(0, 256, (8, 2, 3)))           # 6 per sample
idx("labels.idx.gz", rng.integers(0, 5, 8))
idx("bad_magic.idx", rng.integers(0, 256, (8, 6)), gz=False, magic=bytes([1, 2, 8, 2]))
shard("shard_a.shard", 40)
shard("shard_b.shard", 30)
shard("shard_badmagic.shard", 40, magic=1234)
shard("shard_cut.shard", 40, cut=3)
shard("shard_tiny.shard", 5)                                      # < one window of 8 + 1
