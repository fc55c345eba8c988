#!/usr/bin/env python3
"""tests/ckpt_damage.py - damaged copies of a dp checkpoint (tests/durability.sh).

  ckpt_damage.py CHECKPOINT_DIR OUT_DIR [N_RANDOM [SEED [lite]]]

Writes OUT_DIR/NNN-what/ for every damage and OUT_DIR/list.txt (one
"NNN-what<TAB>description" line each). The damages are those storage, a
careless hand or a killed copy make, each one at a time:
  - state.json: every field the resume depends on set to a wrong value of
    its type (step +-1, 1e300, -5, "12", samples_seen, epoch, lr_next, the
    files' sizes and checksums, world_size, the form, the version...), a
    field removed, the text cut or garbled;
  - the safetensors files: random bit flips (header and data), a float set
    to NaN / +inf / -inf / a flipped low mantissa bit, a byte range zeroed,
    the file cut short or grown;
  - NaN and inf written into the data with the checksums recomputed, as a
    tool that rewrites a tensor would: what the finiteness check is for
    (a version-2 checkpoint; in a version-1 one there are no checksums).
A damage that leaves the bytes as they were is skipped. The resume of each
copy must be refused, or train exactly as the undamaged one. "lite" keeps
of the state.json edits those about the form, world size and files (for a
second form whose other fields take the same path).
"""
import json
import os
import re
import random
import shutil
import struct
import sys

BLOCK = 1 << 20

_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    t = _T
    for b in data:
        c = (c >> 8) ^ t[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def block_sums(data, old=b"", old_sums=""):
    """The per-block checksums of data; a block whose bytes equal old's at
    the same place takes old's checksum from old_sums (the undamaged file's,
    which its own resume verified): the pure-Python CRC runs only over the
    blocks a damage changed."""
    out = []
    for i, k in enumerate(range(0, len(data), BLOCK)):
        block = data[k : k + BLOCK]
        if len(old_sums) >= 8 * (i + 1) and old[k : k + BLOCK] == block:
            out.append(old_sums[8 * i : 8 * i + 8])
        else:
            out.append("%08x" % crc32c(block))
    return "".join(out)


def tensors(data):
    """(name, dtype, absolute begin, absolute end) of a safetensors file."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = []
    for name, info in header.items():
        if name != "__metadata__":
            b, e = info["data_offsets"]
            out.append((name, info["dtype"], 8 + n + b, 8 + n + e))
    return out


class Ckpt:
    def __init__(self, src):
        self.src = src
        self.state_text = open(os.path.join(src, "state.json")).read()
        self.state = json.loads(self.state_text)
        self.files = {f["name"]: open(os.path.join(src, f["name"]), "rb").read()
                      for f in self.state["files"]}


def write(out, ck, state=None, files=None, state_text=None, fix=False):
    """A copy of ck with some files replaced; fix: recompute sizes and checksums."""
    os.makedirs(out)
    files = dict(ck.files, **(files or {}))
    st = json.loads(json.dumps(ck.state if state is None else state))
    if fix and state_text is None:
        for f in st.get("files", []):
            if f.get("name") in files:
                f["bytes"] = len(files[f["name"]])
                if "crc32c" in f:
                    f["crc32c"] = block_sums(files[f["name"]], ck.files.get(f["name"], b""), f["crc32c"])
    for name, data in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    with open(os.path.join(out, "state.json"), "w") as f:
        f.write(state_text if state_text is not None else json.dumps(st, indent="\t"))


def main():
    src, out = sys.argv[1], sys.argv[2]
    nrand = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 22)
    lite = len(sys.argv) > 5 and sys.argv[5] == "lite"
    ck = Ckpt(src)
    st = ck.state
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    made = []

    def emit(what, desc, **kw):
        name = "%03d-%s" % (len(made), what)
        write(os.path.join(out, name), ck, **kw)
        made.append((name, desc))

    # ---- state.json, field by field ----
    def edit(path, value, what=None):
        if lite and path[0] not in ("files", "form", "written_by"):
            return
        s = json.loads(ck.state_text)
        o = s
        for k in path[:-1]:
            o = o[k]
        if value is KeyError:
            del o[path[-1]]
        else:
            o[path[-1]] = value
        shown = "removed" if value is KeyError else re.sub(r"[^A-Za-z0-9.+-]", "_", json.dumps(value))
        emit(what or "state-" + "-".join(str(p) for p in path) + "=" + shown[:24],
             "state.json %s := %s" % (".".join(str(p) for p in path),
                                      "(removed)" if value is KeyError else json.dumps(value)),
             state=s)

    step = st["step"]
    for v in (step + 1, step - 1, 0, 1e300, -5, str(step), 2.5, None, 1 << 60):
        edit(["step"], v)
    edit(["step"], KeyError)
    for key in ("samples_seen", "epoch_sample", "epoch", "train_samples", "global_batch", "seed"):
        edit([key], st[key] + 1)
    edit(["samples_seen"], KeyError)
    edit(["loss"], "NaN")
    edit(["lr_next"], st["lr_next"] * 2)
    edit(["version"], 3)
    edit(["version"], 0)
    edit(["form"], "sharded" if st["form"] == "full" else "full")
    edit(["format"], "dp-checkpoinT")
    edit(["written_by", "world_size"], st["written_by"]["world_size"] + 1)
    edit(["written_by", "mesh"], [1, 1, 1, 2])
    edit(["optimizer", "kind"], "sgd")
    edit(["optimizer", "state"], ["exp_avg"])
    edit(["schedule", "warmup"], st["schedule"]["warmup"] + 3)
    edit(["model", "hash"], "%08x" % (int(st["model"]["hash"], 16) ^ 1))
    t0 = st["model"]["tensors"][0]
    edit(["model", "tensors", 0, "name"], t0["name"] + "x")
    edit(["model", "tensors", 0, "shape"], t0["shape"][::-1] if len(t0["shape"]) > 1 else [t0["shape"][0] + 1])
    for i, f in enumerate(st["files"]):
        edit(["files", i, "bytes"], f["bytes"] - 1)
        edit(["files", i, "name"], f["name"].replace(".safetensors", ".st"))
        if "crc32c" in f:
            c = f["crc32c"]
            edit(["files", i, "crc32c"], c[:-1] + ("0" if c[-1] != "0" else "1"))
            edit(["files", i, "crc32c"], c[:-8])
            edit(["files", i, "crc32c"], c.upper() if c.upper() != c else c + "zz")
    edit(["files"], st["files"][:-1] if len(st["files"]) > 1 else [])
    if "checksum" in st:
        edit(["checksum"], KeyError)
    text = ck.state_text
    if not lite:
        emit("state-cut", "state.json cut in half", state_text=text[: len(text) // 2])
        emit("state-empty", "state.json empty", state_text="")
        emit("state-garbled", "state.json: a brace replaced", state_text=text.replace("{", "[", 2))

    # ---- the data files ----
    names = sorted(ck.files)

    def data_edit(what, desc, name, data, fix=False):
        if data == ck.files[name]:
            return
        emit(what, desc, files={name: data}, fix=fix)

    def float_at(name, kind):
        """A random float position inside an F32 tensor of the file (not a
        zero-size one), preferring kind ("exp_avg", "param"...) in its name."""
        ts = [t for t in tensors(ck.files[name]) if t[1] == "F32" and t[3] > t[2]]
        pref = [t for t in ts if kind in t[0]] or ts
        t = rng.choice(pref)
        return t[0], t[2] + 4 * rng.randrange((t[3] - t[2]) // 4)

    for name in names:
        data = ck.files[name]
        (hn,) = struct.unpack("<Q", data[:8])
        for special, bits, kind, fix in (("nan", 0x7FC00000, "exp_avg_sq", False),
                                         ("nan", 0x7FC00000, "exp_avg", True),
                                         ("inf", 0x7F800000, "", True),
                                         ("-inf", 0xFF800000, "exp_avg_sq", False)):
            tname, at = float_at(name, kind)
            d = bytearray(data)
            d[at : at + 4] = struct.pack("<I", bits)
            data_edit("%s%s-%s" % (special, "-fixed" if fix else "", name),
                      "%s: %s in %s%s" % (name, special, tname, ", checksums recomputed" if fix else ""),
                      name, bytes(d), fix=fix)
        for _ in range(2):
            tname, at = float_at(name, "")
            d = bytearray(data)
            d[at] ^= 1  # the lowest mantissa bit
            data_edit("lowbit-" + name, "%s: lowest mantissa bit of a float in %s" % (name, tname),
                      name, bytes(d))
        if any("exp_avg_sq" in t[0] for t in tensors(data)):
            tname, at = float_at(name, "exp_avg_sq")
            d = bytearray(data)
            d[at + 3] |= 0x80  # a negative second moment (a -0.0 stays harmless)
            data_edit("negative-" + name, "%s: a value of %s made negative, checksums recomputed"
                      % (name, tname), name, bytes(d), fix=True)
        d = bytearray(data)
        k = rng.randrange(8 + hn, len(data) - 4096)
        d[k : k + 4096] = bytes(4096)
        data_edit("zeros-" + name, "%s: 4096 bytes zeroed" % name, name, bytes(d))
        data_edit("cut-" + name, "%s: cut to half" % name, name, data[: len(data) // 2])
        data_edit("grown-" + name, "%s: 8 bytes appended" % name, name, data + bytes(8))
        data_edit("cut-fixed-" + name, "%s: cut by 4 bytes, sizes recomputed" % name, name,
                  data[:-4], fix=True)
        d = bytearray(data)
        d[rng.randrange(8, 8 + hn)] ^= 1 << rng.randrange(8)
        data_edit("header-" + name, "%s: a bit of the header flipped" % name, name, bytes(d))
    for i in range(nrand):
        name = rng.choice(names)
        d = bytearray(ck.files[name])
        k = rng.randrange(len(d))
        d[k] ^= 1 << rng.randrange(8)
        data_edit("flip-%d" % i, "%s: bit flip at byte %d" % (name, k), name, bytes(d))

    with open(os.path.join(out, "list.txt"), "w") as f:
        for name, desc in made:
            f.write("%s\t%s\n" % (name, desc))
    print(len(made))


if __name__ == "__main__":
    main()
