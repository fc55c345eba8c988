#!/usr/bin/python3
"""torch_gpt.py - the PyTorch reference for dp's transformers (models/gpt2*.dp, models/llama.dp).

Builds the model from the safetensors file dp writes before its first step
(`dpexec step.bin --steps 0 --save-full init.safetensors`; dp's tensor names,
dp's layouts: linear weights are [in, out], y = x @ w + b), trains it on the
same token windows in the same order with the same optimizer, schedule,
clipping and loss, and prints one line per optimizer step: "step loss"
(%.9g; step from 0; the loss before that step's update), like torch_ref.py.

Run with Debian's interpreter (/usr/bin/python3: torch 1.13 CPU, numpy):

  /usr/bin/python3 tests/torch_gpt.py --model gpt2 --init init.safetensors \\
      --heads 4 --data 'build/data/fortunes.bin' --seed 1234 --global-batch 16 \\
      --steps 20 --lr 2e-3 --beta1 0.9 --beta2 0.95 --weight-decay 0 --clip 1 \\
      --schedule cosine --warmup 30 --sched-steps 600 --min-lr 2e-4

Models (docs/MODELS.md has the tensor tables):
  gpt2   embed.wte [V,d], embed.wpe [T,d]; h.<i>.{ln1g,ln1b,wqkv,bqkv,wo,bo,
         ln2g,ln2b,wfc,bfc,wproj,bproj}; lnf.{g,b}; LM head = embed.wte^T.
  llama  embed.wte [V,d]; h.<i>.{norm1,wqkv,wo,norm2,w1,w3,w2}; norm.g;
         head.w [d,V]; rope.{cos,sin} [Tc, hd/2] buffers (taken from the file
         when dp saves them, else computed as dp's init does).

Semantics (the kernels' comments in format/stepfile.h): attention is causal with
scale 1/sqrt(hd) on a packed qkv [B,T,3C] laid out head-major: qkv viewed as
[B,T,H,3,hd] ([q|k|v] per head), output [B,T,H*hd]. RoPE is rotate-half on
the q and k of each head, angle t * theta^(-j/half). gelu is the tanh form.
layernorm and rmsnorm use eps (1e-5, the DSL default).

Data: token shards in llm.c's format (--data is a glob, shards in sorted name
order); sample k of a shard is the T tokens from k*T (inputs) and k*T + 1
(targets), (ntok - 1) // T samples per shard, shards concatenated in sample
space; the global batch of each step comes from torch_ref.py's port of dp's
sampler (imported, not copied). The loss is dp's cross_entropy: the mean of
the per-token losses over every token of the global batch.
"""
import argparse
import glob
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402  (the sampler, the lr schedule, safetensors I/O)

SHARD_MAGIC = 20240520


# ---- token data (runtime/data_tokens.c) ----

def read_shard(path):
    """The uint16 tokens of one llm.c shard, widened to int64."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 1024:
        sys.exit(f"torch_gpt: {path}: shorter than the 1024-byte header")
    head = np.frombuffer(raw, dtype="<i4", count=256)
    if head[0] != SHARD_MAGIC or head[1] != 1:
        sys.exit(f"torch_gpt: {path}: not a token shard (magic {head[0]}, version {head[1]})")
    ntok = int(head[2])
    if len(raw) != 1024 + 2 * ntok:
        sys.exit(f"torch_gpt: {path}: size {len(raw)} != 1024 + 2 * {ntok}")
    return np.frombuffer(raw, dtype="<u2", offset=1024, count=ntok).astype(np.int64)


def load_windows(pattern, T):
    """Inputs and targets [n, T] of every sample, in dp's sample order."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        sys.exit(f"torch_gpt: no file matches {pattern}")
    xs, ys = [], []
    for p in paths:
        tok = read_shard(p)
        n = (len(tok) - 1) // T
        if n <= 0:
            continue
        idx = np.arange(n)[:, None] * T + np.arange(T)[None, :]
        xs.append(tok[idx])
        ys.append(tok[idx + 1])
    if not xs:
        sys.exit(f"torch_gpt: {pattern}: no window of {T + 1} tokens")
    return np.concatenate(xs), np.concatenate(ys)


# ---- the ops, as dp's kernels define them ----

def attention(qkv, heads):
    """Causal multi-head self-attention of a head-major packed qkv [B,T,3C]."""
    B, T, C3 = qkv.shape
    hd = C3 // (3 * heads)
    q, k, v = qkv.view(B, T, heads, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)  # [B,H,T,hd]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).reshape(B, T, heads * hd)


def rope(qkv, cos, sin, heads):
    """Rotate-half RoPE of the q and k of each head of a packed qkv [B,T,3C]."""
    B, T, C3 = qkv.shape
    hd = C3 // (3 * heads)
    half = hd // 2
    x = qkv.view(B, T, heads, 3, hd)
    qk, v = x[:, :, :, :2], x[:, :, :, 2:]
    c = cos[:T].view(1, T, 1, 1, half)
    s = sin[:T].view(1, T, 1, 1, half)
    x1, x2 = qk[..., :half], qk[..., half:]
    qk = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((qk, v), dim=3).reshape(B, T, C3)


def rmsnorm(x, g, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def rope_tables(T, half, theta, dtype):
    """dp's DP_INIT_ROPE_COS/SIN: cos/sin(t * theta^(-j/half)) in double, then float32."""
    t = np.arange(T, dtype=np.float64)[:, None]
    j = np.arange(half, dtype=np.float64)[None, :]
    ang = t * np.power(float(np.float32(theta)), -j / half)
    return (torch.tensor(np.cos(ang).astype(np.float32), dtype=dtype),
            torch.tensor(np.sin(ang).astype(np.float32), dtype=dtype))


# ---- 16-bit storage, dp's way (precision bf16, precision fp16) ----

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
half_dtype = torch.bfloat16  # the run's (Model sets it from --precision)


def to_bf16(x):
    """Round to the nearest bf16 (fp16 with --precision fp16), ties to even
    (what torch's .bfloat16() and .half() do and dp's kernels do on every
    store; fp16 overflows to inf above 65504), kept in x's dtype."""
    return x.to(half_dtype).to(x.dtype)


class Store(torch.autograd.Function):
    """A value a dp kernel stores in 16 bits: rounded going forward; its
    gradient, which dp stores in 16 bits too, rounded coming back."""

    @staticmethod
    def forward(ctx, x):
        return to_bf16(x)

    @staticmethod
    def backward(ctx, g):
        return to_bf16(g)


class Copy(torch.autograd.Function):
    """The bf16 compute copy of an f32 master weight: rounded going forward;
    the gradient reaches the master unrounded (reduce_dtype f32: dp's
    accumulating kernels write f32 gradients from bf16 operands)."""

    @staticmethod
    def forward(ctx, w):
        return to_bf16(w)

    @staticmethod
    def backward(ctx, g):
        return g


# ---- the models ----

class Model:
    """Parameters (dp's names) and the forward pass of one of the models."""

    def __init__(self, args, weights, dtype):
        self.kind, self.heads, self.eps = args.model, args.heads, args.norm_eps
        # precision bf16 (docs/PRECISION.md): f32 arithmetic everywhere, every
        # value dp stores rounded to bf16 where dp's kernels store it (each
        # op's output and its gradient), the weights read as rounded copies of
        # the f32 masters the optimizer updates
        global half_dtype
        prec = getattr(args, "precision", "f32")
        bf16 = prec in HALF
        half_dtype = HALF.get(prec, torch.bfloat16)
        self.st = Store.apply if bf16 else (lambda x: x)
        self.cp = Copy.apply if bf16 else (lambda x: x)
        self.buffers = {"rope.cos", "rope.sin"}
        self.p = {}
        for name, arr in weights.items():
            self.p[name] = torch.tensor(arr, dtype=dtype, requires_grad=name not in self.buffers)
        self.layers = 0
        while f"h.{self.layers}.wqkv" in self.p:
            self.layers += 1
        need = ["embed.wte"] + (["embed.wpe", "lnf.g", "lnf.b"] if self.kind == "gpt2" else ["norm.g", "head.w"])
        missing = [n for n in need if n not in self.p]
        if missing or self.layers == 0:
            sys.exit(f"torch_gpt: {args.init} is not a {self.kind} checkpoint: no "
                     f"{', '.join(missing) or 'h.0.wqkv'} (has: {', '.join(sorted(self.p))})")
        d = self.p["embed.wte"].shape[1]
        if d % self.heads or (d // self.heads) % 2:
            sys.exit(f"torch_gpt: d = {d} does not split into {self.heads} heads of even size")
        if self.kind == "llama":
            hd = d // self.heads
            if "rope.cos" not in self.p:  # dp did not save its buffers: compute them
                self.p["rope.cos"], self.p["rope.sin"] = rope_tables(args.seq, hd // 2, args.theta, dtype)
            if self.p["rope.cos"].shape[1] != hd // 2 or self.p["rope.cos"].shape[0] < args.seq:
                sys.exit(f"torch_gpt: rope.cos is {tuple(self.p['rope.cos'].shape)}, "
                         f"needs [>= {args.seq}, {hd // 2}]")
            if bf16:  # buffer_dtype bf16: dp rounds the tables' initial values
                for n in self.buffers:
                    self.p[n] = to_bf16(self.p[n])

    def named_params(self):
        """The trained tensors (buffers excluded) and their names, in a fixed order."""
        return [(n, t) for n, t in sorted(self.p.items()) if n not in self.buffers]

    def params(self):
        return [t for n, t in self.named_params()]

    def forward(self, ids):
        """The logits, storing (st) what dp's kernels store: one op of dp's
        IR per st, so with bf16 the roundings fall where dp's do."""
        H, eps, st = self.heads, self.eps, self.st
        p = {n: (t if n in self.buffers else self.cp(t)) for n, t in self.p.items()}
        d = p["embed.wte"].shape[1]
        x = F.embedding(ids, p["embed.wte"])
        if self.kind == "gpt2":
            x = st(x + p["embed.wpe"])  # [T, d] over every sample (T = the model's ctx)
            for i in range(self.layers):
                w = lambda n: p[f"h.{i}.{n}"]  # noqa: E731
                h = st(F.layer_norm(x, (d,), w("ln1g"), w("ln1b"), eps))
                a = st(attention(st(h @ w("wqkv") + w("bqkv")), H))
                x = st(x + st(a @ w("wo") + w("bo")))
                h = st(F.layer_norm(x, (d,), w("ln2g"), w("ln2b"), eps))
                g = st(F.gelu(st(h @ w("wfc") + w("bfc")), approximate="tanh"))
                x = st(x + st(g @ w("wproj") + w("bproj")))
            x = st(F.layer_norm(x, (d,), p["lnf.g"], p["lnf.b"], eps))
            return st(x @ p["embed.wte"].t())
        for i in range(self.layers):
            w = lambda n: p[f"h.{i}.{n}"]  # noqa: E731
            qkv = st(rope(st(st(rmsnorm(x, w("norm1"), eps)) @ w("wqkv")), p["rope.cos"],
                          p["rope.sin"], H))
            x = st(x + st(st(attention(qkv, H)) @ w("wo")))
            h = st(rmsnorm(x, w("norm2"), eps))
            m = st(st(F.silu(st(h @ w("w1")))) * st(h @ w("w3")))
            x = st(x + st(m @ w("w2")))
        return st(st(rmsnorm(x, p["norm.g"], eps)) @ p["head.w"])


# ---- training ----

class Scaler:
    """fp16's loss scaling, PyTorch 1.13's GradScaler written out (its
    torch.cuda.amp.GradScaler runs on CUDA tensors only): the loss times the
    scale (an f32 tensor) before the backward; unscale_ multiplies every
    gradient by the f32 reciprocal of the scale computed in double and finds
    any inf or NaN; step skips the optimizer step when it found one;
    update is torch._amp_update_scale_ (aten/src/ATen/native/cuda/
    AmpKernels.cu): backoff and restart the clean-step count on an
    overflow, grow after `interval` clean steps in a row when the grown
    scale is finite. dp (runtime/exec.c) does the same; a static scale
    never changes, and an overflowing step is skipped there too."""

    def __init__(self, args):
        self.kind = args.loss_scale
        self.scale = torch.tensor(args.init_scale, dtype=torch.float32)
        self.growth = torch.tensor(args.growth, dtype=torch.float32)
        self.backoff = torch.tensor(args.backoff, dtype=torch.float32)
        self.interval, self.tracker, self.skipped = args.interval, 0, 0

    def step(self, args, step, opt, params, loss):
        """One optimizer step from the unscaled loss; the gradient norm
        (inf or NaN on a skipped step) and whether the step was skipped."""
        opt.zero_grad(set_to_none=False)
        (loss * self.scale).backward()
        inv = (1.0 / self.scale.double()).float()
        for p in params:
            p.grad.mul_(inv)
        found_inf = not all(bool(torch.isfinite(p.grad).all()) for p in params)
        if args.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
        else:
            norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
        for group in opt.param_groups:
            group["lr"] = torch_ref.group_lr(torch_ref.lr_at(args, step), group.get("lr_scale", 1.0))
        if not found_inf:
            opt.step()
        self.skipped += found_inf
        if self.kind == "dynamic":
            if found_inf:
                self.scale = self.scale * self.backoff
                self.tracker = 0
            elif self.tracker + 1 == self.interval:
                grown = self.scale * self.growth
                if bool(torch.isfinite(grown)):
                    self.scale = grown
                self.tracker = 0
            else:
                self.tracker += 1
        return norm, found_inf


def train(args):
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    weights = torch_ref.read_safetensors(args.init)
    if args.seq is None:
        if "embed.wpe" in weights:
            args.seq = weights["embed.wpe"].shape[0]
        elif "rope.cos" in weights:
            args.seq = weights["rope.cos"].shape[0]
        else:
            sys.exit("torch_gpt: --seq is needed (no embed.wpe or rope.cos to take T from)")
    model = Model(args, weights, dtype)
    params = model.params()
    x_all, y_all = load_windows(args.data, args.seq)
    vocab = weights["embed.wte"].shape[0]
    if max(x_all.max(), y_all.max()) >= vocab:
        sys.exit(f"torch_gpt: token {max(x_all.max(), y_all.max())} >= vocab {vocab}")
    x_all, y_all = torch.from_numpy(x_all), torch.from_numpy(y_all)
    sampler = torch_ref.Sampler(args.seed, x_all.shape[0], args.global_batch)
    div = args.global_batch * args.seq
    opt = torch.optim.AdamW(torch_ref.param_groups(args, model.named_params()), lr=args.lr,
                            betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.weight_decay)

    out = open(args.out, "w") if args.out else sys.stdout
    scaler = Scaler(args) if args.loss_scale != "none" else None
    scales = open(args.scales, "w") if args.scales else None
    for step in range(args.steps):
        idx = torch.from_numpy(sampler.batch(step))
        logits = model.forward(x_all[idx])
        loss = F.cross_entropy(logits.reshape(-1, vocab), y_all[idx].reshape(-1), reduction="sum") / div
        if not scaler:
            torch_ref.step_and_log(args, step, opt, params, loss, out)
            continue
        scale = scaler.scale.item()
        norm, skipped = scaler.step(args, step, opt, params, loss)
        line = f"{step} {loss.item():.9g}" + (f" {norm.item():.9g}" if args.grad_norm else "")
        print(line, file=out, flush=True)
        if scales:  # the scale step ran with, and the skipped steps up to it
            print(f"{step + 1} {scale:.9g} {scaler.skipped}", file=scales, flush=True)
    if args.save:
        torch_ref.save_safetensors(args.save, {n: t for n, t in model.p.items() if n not in model.buffers})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("gpt2", "llama"), required=True)
    ap.add_argument("--init", required=True, help="safetensors file of the initial weights")
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--data", required=True, help="token shard glob (the train source)")
    ap.add_argument("--seq", type=int, help="tokens per sample (default: embed.wpe's or rope.cos's rows)")
    ap.add_argument("--theta", type=float, default=10000.0, help="RoPE base (tables not in the file)")
    ap.add_argument("--norm-eps", type=float, default=1e-5, help="layernorm/rmsnorm eps")
    ap.add_argument("--seed", type=int, default=1234, help="the step file's seed (data order)")
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--precision", choices=("f32", "bf16", "fp16"), default="f32",
                    help="dp's precision setting: bf16 (fp16) stores every value dp stores in "
                         "bf16 (fp16)")
    ap.add_argument("--loss-scale", choices=("none", "dynamic", "static"),
                    help="fp16's loss scaling (Scaler; default: dynamic with --precision fp16, "
                         "as dp's, else none)")
    ap.add_argument("--init-scale", type=float, default=65536.0,
                    help="the first (dynamic) or every (static) step's scale")
    ap.add_argument("--growth", type=float, default=2.0)
    ap.add_argument("--backoff", type=float, default=0.5)
    ap.add_argument("--interval", type=int, default=2000)
    ap.add_argument("--scales", help="write `step scale skipped` per step (from 1) here")
    torch_ref.add_train_args(ap, weight_decay=0.01)
    args = ap.parse_args()
    if args.loss_scale is None:
        args.loss_scale = "dynamic" if args.precision == "fp16" else "none"
    torch.set_num_threads(args.threads)
    if args.schedule in ("cosine", "linear") and args.sched_steps <= 0:
        args.sched_steps = args.steps
    train(args)


if __name__ == "__main__":
    main()
