#!/usr/bin/python3
"""torch_ref.py - the PyTorch reference for dp's numerics (MLP classifiers).

Trains the same MLP as a dp model from the same initial weights on the same
samples in the same order, and prints one line per optimizer step:
"step loss" (%.9g; step counts from 0; the loss is the mean cross-entropy
over the global batch, computed before that step's update). dp's loss curve
must match it to float tolerance.

Run with Debian's interpreter (/usr/bin/python3: torch 1.13 CPU, numpy);
nothing is downloaded. Typical use:

  dpexec step.bin --steps 0 --save-full init.safetensors
  /usr/bin/python3 tests/torch_ref.py --init init.safetensors \\
      --layers fc1,fc2,fc3,head --data idx --seed 1234 --global-batch 128 \\
      --steps 50 --optimizer adamw --lr 1e-3 --beta1 0.9 --beta2 0.999 \\
      --eps 1e-8 --weight-decay 0.01 --clip 1.0 \\
      --schedule cosine --warmup 100 --sched-steps 4000 --out torch.txt

Layer NAME has weight NAME.w of shape [in, out] (dp's layout: y = x @ w + b)
and an optional bias NAME.b; relu between layers, none after the last.

The sampler, the counter-based generator and the synthetic data source are
ports of runtime/data_sampler.c, data_synth.c and init.c with uint64 arithmetic; the
formulas are in docs/DATA.md. --print-indices and --print-synthetic show what
the port computes, to compare with the C side.
"""
import argparse
import gzip
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
SYNTH_SEED = 0x5EED
FMNIST = "/usr/share/datasets/fashion-mnist/"


# ---- the counter-based generator (runtime/init.c) ----

def mix64(x):
    """splitmix64's finaliser on a numpy uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def mix64_int(x):
    """splitmix64's finaliser on a Python int."""
    x &= MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def hash_name(name):
    """FNV-1a 64 of the UTF-8 bytes of name."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def init_bits(seed, name, base, count):
    """u = mix64(seed ^ mix64(hash(name) + i * GOLDEN)) for i in [base, base+count)."""
    i = np.arange(base, base + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        t = np.uint64(hash_name(name)) + i * np.uint64(GOLDEN)
        return mix64(np.uint64(seed & MASK) ^ mix64(t))


def init_normal(seed, name, base, count, mean=0.0, std=1.0):
    """init_fill(DP_INIT_NORMAL, mean, std, ...) as float32 (parameters are floats in C)."""
    mean, std = float(np.float32(mean)), float(np.float32(std))
    u = init_bits(seed, name, base, count)
    u1 = ((u >> np.uint64(32)).astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
    u2 = ((u & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    return (mean + std * z).astype(np.float32)


def init_uniform(seed, name, base, count, low, high):
    """init_fill(DP_INIT_UNIFORM, low, high, ...) as float32 (parameters are floats in C)."""
    low, high = float(np.float32(low)), float(np.float32(high))
    u = init_bits(seed, name, base, count)
    u1 = ((u >> np.uint64(32)).astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
    return (low + (high - low) * u1).astype(np.float32)


# ---- the sampler (runtime/data_sampler.c) ----

def epoch_permutation(seed, epoch, n):
    """Fisher-Yates of [0, n) driven by (seed, epoch), exactly as the C code."""
    key = mix64_int((seed & MASK) ^ mix64_int(hash_name("dp.sampler") + epoch * GOLDEN))
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        r = mix64(np.uint64(key) + i * np.uint64(GOLDEN))
    j = (r % (i + np.uint64(1))).astype(np.int64)  # j[i] in [0, i]
    perm = list(range(n))
    for a in range(n - 1, 0, -1):
        b = int(j[a])
        perm[a], perm[b] = perm[b], perm[a]
    return np.array(perm, dtype=np.int64)


class Sampler:
    """Dataset indices of the global batch of each optimizer step (drop_last)."""

    def __init__(self, seed, n, global_batch):
        if n < global_batch:
            sys.exit(f"torch_ref: {n} samples, fewer than the global batch {global_batch}")
        self.seed, self.n, self.gb = seed, n, global_batch
        self.per_epoch = n // global_batch
        self.epoch, self.perm = None, None

    def batch(self, step):
        epoch = step // self.per_epoch
        if epoch != self.epoch:
            self.epoch, self.perm = epoch, epoch_permutation(self.seed, epoch, self.n)
        start = (step % self.per_epoch) * self.gb
        return self.perm[start:start + self.gb]


# ---- data sources ----

def synthetic(n, dim, classes, split="train", rows=4096):
    """The synthetic source: x ~ normal from "synthetic.x" (eval: "synthetic.eval.x"),
    labels = argmax_c (W x)_c with W from "synthetic.w"; seed 0x5eed."""
    xname = "synthetic.eval.x" if split == "eval" else "synthetic.x"
    w = init_normal(SYNTH_SEED, "synthetic.w", 0, classes * dim).reshape(classes, dim)
    wd = w.astype(np.float64).T
    x = np.empty((n, dim), dtype=np.float32)
    y = np.empty(n, dtype=np.int64)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        x[start:stop] = init_normal(SYNTH_SEED, xname, start * dim, (stop - start) * dim).reshape(-1, dim)
        y[start:stop] = np.argmax(x[start:stop].astype(np.float64) @ wd, axis=1)
    return x, y


def read_idx(path):
    """An IDX file (gzip or plain) as a uint8 array of its shape."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 8:
        sys.exit(f"torch_ref: {path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim, count=int(np.prod(dims)))
    return data.reshape(dims)


def load_data(args):
    """Features [n, D] float32 and labels [n] int64 of the train split."""
    if args.data == "synthetic":
        return synthetic(args.synth_n, args.synth_dim, args.synth_classes)
    if args.data == "idx":
        x = read_idx(args.images)
        x = x.reshape(x.shape[0], -1).astype(np.float32) / np.float32(255.0)
        y = read_idx(args.labels).astype(np.int64)
        return x, y
    x = np.load(args.images).astype(np.float32)
    return x.reshape(x.shape[0], -1), np.load(args.labels).astype(np.int64)


# ---- checkpoints ----

def read_safetensors(path):
    """{name: float32 numpy array} of an F32 safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"torch_ref: {path}: tensor {name} is {info['dtype']}, not F32")
        begin, end = info["data_offsets"]
        arr = np.frombuffer(raw[base + begin:base + end], dtype="<f4")
        out[name] = arr.reshape(info["shape"]).copy()
    return out


# ---- training ----

def lr_at(args, step):
    """The runtime's schedule (docs/DATA.md's formulas) at optimizer step
    `step`, from 0. dp applies it rounded to float32, as it logs it."""
    lr, k, w = args.lr, step, args.warmup
    if args.schedule == "constant":
        return lr
    if args.schedule == "step":
        return lr * args.gamma ** (k // args.every)
    if k < w:
        return lr * (k + 1) / w
    if args.schedule in ("cosine", "linear"):
        span = args.sched_steps - w
        q = min(1.0, (k - w) / span) if span > 0 else 1.0
        if args.schedule == "linear":
            return args.min_lr + (lr - args.min_lr) * (1.0 - q)
        return args.min_lr + 0.5 * (lr - args.min_lr) * (1.0 + math.cos(math.pi * q))
    if args.schedule == "wsd":
        if k < w + args.stable:
            return lr
        q = min(1.0, (k - w - args.stable) / args.decay) if args.decay > 0 else 1.0
        return lr - (lr - args.min_lr) * q
    assert args.schedule == "inverse_sqrt", args.schedule
    return lr * math.sqrt(max(w, 1) / (k + 1))


def group_lr(lr, scale):
    """An optimizer group's lr as dp applies it (runtime/lr_sched.h's
    dp_group_lr): the schedule's float32 lr times lr_scale, rounded to float32."""
    if scale == 1.0:
        return lr
    return float(np.float32(float(np.float32(lr)) * scale))


def param_groups(args, named):
    """dp's optimizer groups (ir/ir.c's ir_param_group) over (name, tensor)
    pairs, as torch.optim param groups: weight decay the block's own
    (--block-weight-decay BLOCK=X) else --weight-decay, 0 for a 1-D tensor
    under --no-decay vectors; lr scaled by the block's --lr-scale BLOCK=X.
    The block is the name without its last part (h.0.ln1g: h.0)."""
    wd_of = dict(kv.split("=", 1) for kv in args.block_weight_decay)
    scale_of = dict(kv.split("=", 1) for kv in args.lr_scale)
    groups = {}
    for name, t in named:
        block = name.rsplit(".", 1)[0]
        wd = float(wd_of.get(block, args.weight_decay))
        if args.no_decay == "vectors" and t.dim() < 2:
            wd = 0.0
        scale = float(scale_of.get(block, 1.0))
        groups.setdefault((wd, scale), []).append(t)
    return [{"params": ps, "weight_decay": wd, "lr_scale": scale}
            for (wd, scale), ps in groups.items()]


def step_and_log(args, step, opt, params, loss, out):
    """One optimizer step from `loss` as dp takes it: gradients, the norm
    (clipped by it when --clip), the scheduled lr, the update; then the
    "step loss [grad_norm]" line (tests/torch_gpt.py shares this)."""
    opt.zero_grad(set_to_none=False)
    loss.backward()
    if args.clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
    else:
        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
    for group in opt.param_groups:
        group["lr"] = group_lr(lr_at(args, step), group.get("lr_scale", 1.0))
    opt.step()
    line = f"{step} {loss.item():.9g}"
    if args.grad_norm:
        line += f" {norm.item():.9g}"
    print(line, file=out, flush=True)


def train(args):
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    weights = read_safetensors(args.init)
    layers = []
    for name in args.layers.split(","):
        if name + ".w" not in weights:
            sys.exit(f"torch_ref: {args.init} has no tensor {name}.w (has: {', '.join(sorted(weights))})")
        w = torch.tensor(weights[name + ".w"], dtype=dtype, requires_grad=True)
        b = weights.get(name + ".b")
        b = torch.tensor(b, dtype=dtype, requires_grad=True) if b is not None else None
        layers.append((w, b))
    params = [p for wb in layers for p in wb if p is not None]
    named = [(f"{name}.{k}", p) for name, wb in zip(args.layers.split(","), layers)
             for k, p in zip("wb", wb) if p is not None]

    x_all, y_all = load_data(args)
    if x_all.shape[1] != layers[0][0].shape[0]:
        sys.exit(f"torch_ref: samples have {x_all.shape[1]} features, {args.layers.split(',')[0]}.w expects "
                 f"{layers[0][0].shape[0]}")
    x_all = torch.tensor(x_all, dtype=dtype)
    y_all = torch.tensor(y_all, dtype=torch.int64)
    sampler = Sampler(args.seed, x_all.shape[0], args.global_batch)

    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(param_groups(args, named), lr=args.lr, betas=(args.beta1, args.beta2),
                                eps=args.eps, weight_decay=args.weight_decay)
    else:
        opt = torch.optim.SGD(param_groups(args, named), lr=args.lr, momentum=args.momentum,
                              weight_decay=args.weight_decay, nesterov=args.nesterov)

    out = open(args.out, "w") if args.out else sys.stdout
    for step in range(args.steps):
        idx = torch.from_numpy(sampler.batch(step))
        h = x_all[idx]
        for k, (w, b) in enumerate(layers):
            h = h @ w if b is None else torch.addmm(b, h, w)
            if k + 1 < len(layers):
                h = F.relu(h)
        loss = F.cross_entropy(h, y_all[idx])
        step_and_log(args, step, opt, params, loss, out)
    if args.save:
        save_safetensors(args.save, {n + s: t for n, wb in zip(args.layers.split(","), layers)
                                     for s, t in zip((".w", ".b"), wb) if t is not None})


def save_safetensors(path, tensors):
    """Write float32 tensors (for comparing final weights with dp's --save-full)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def add_train_args(ap, weight_decay):
    """The optimizer, schedule and output options every reference shares
    (tests/torch_gpt.py imports this); dp's train settings, by name."""
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=weight_decay)
    ap.add_argument("--no-decay", choices=("none", "vectors"), default="none",
                    help="train's no_decay: vectors exempts 1-D tensors from weight decay")
    ap.add_argument("--block-weight-decay", action="append", default=[], metavar="BLOCK=X",
                    help="a block's own weight_decay (repeatable)")
    ap.add_argument("--lr-scale", action="append", default=[], metavar="BLOCK=X",
                    help="a block's lr_scale (repeatable)")
    ap.add_argument("--clip", type=float, default=0.0, help="clip_grad_norm max norm; 0: none")
    ap.add_argument("--schedule", default="constant",
                    choices=("constant", "cosine", "linear", "wsd", "step", "inverse_sqrt"))
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--sched-steps", type=int, default=0,
                    help="cosine or linear length, warmup included (0: --steps)")
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--stable", type=int, default=0, help="wsd: steps at lr after the warmup")
    ap.add_argument("--decay", type=int, default=0, help="wsd: steps of linear decay")
    ap.add_argument("--every", type=int, default=1, help="step: steps between two gamma factors")
    ap.add_argument("--gamma", type=float, default=0.1, help="step: the factor")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--grad-norm", action="store_true", help="append the pre-clip gradient norm")
    ap.add_argument("--out", help="write the loss lines here instead of stdout")
    ap.add_argument("--save", help="write the final weights (safetensors)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: reproducible)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", help="safetensors file of the initial weights")
    ap.add_argument("--layers", default="fc1,fc2,fc3,head", help="layer names, input first")
    ap.add_argument("--data", choices=("idx", "npy", "synthetic"), default="idx")
    ap.add_argument("--images", default=FMNIST + "train-images-idx3-ubyte.gz",
                    help="features file (idx or npy)")
    ap.add_argument("--labels", default=FMNIST + "train-labels-idx1-ubyte.gz",
                    help="labels file (idx or npy)")
    ap.add_argument("--synth-n", type=int, default=4096)
    ap.add_argument("--synth-dim", type=int, default=784)
    ap.add_argument("--synth-classes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1234, help="the step file's seed (data order)")
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    add_train_args(ap, weight_decay=0.0)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true", help="SGD: Nesterov momentum")
    ap.add_argument("--print-indices", type=int, metavar="STEP",
                    help="print the global batch's dataset indices of STEP (n from --data) and exit")
    ap.add_argument("--print-synthetic", type=int, metavar="COUNT",
                    help="print the first COUNT synthetic samples (label, first 4 features) and exit")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if args.print_synthetic is not None:
        x, y = synthetic(args.synth_n, args.synth_dim, args.synth_classes)
        for i in range(min(args.print_synthetic, args.synth_n)):
            print(i, y[i], " ".join(f"{v:.9g}" for v in x[i, :4]))
        return
    if args.print_indices is not None:
        n = args.synth_n if args.data == "synthetic" else len(load_data(args)[1])
        print(" ".join(str(v) for v in Sampler(args.seed, n, args.global_batch).batch(args.print_indices)))
        return
    if not args.init:
        ap.error("--init is required")
    if args.schedule in ("cosine", "linear") and args.sched_steps <= 0:
        args.sched_steps = args.steps
    train(args)


if __name__ == "__main__":
    main()
