"""bench/gpu_gpt.py - the PyTorch anchor of GPT-2 training throughput on one
GPU: the model of models/gpt2.dp (learned token and position embeddings,
pre-LayerNorm blocks of causal self-attention and a 4x tanh-GELU MLP, a
final LayerNorm, the LM head tied to the token embedding), AdamW with
clip_grad_norm 1.0, timed in PyTorch eager and under torch.compile.

bench/gpu_gpt.sh and the GPU kit's run.sh (tools/gpu-kit) run it beside dp
on the same model, batch, optimizer and dtype:

  python3 bench/gpu_gpt.py --steps 30 --vocab 50257 --ctx 1024 --d 768 \\
      --heads 12 --layers 12 --batch 16 --accum 1 --dtype bf16 [--modes eager,compile]

dtype fp32: float32 throughout; tf32: float32 with TF32 matmuls; bf16:
float32 master weights and optimizer state, the forward and backward under
torch.autocast(bfloat16), as dp's `precision bf16` (bf16 compute copies,
f32 master weights, f32 gradient reduction). Data: random byte-level token
ids, which is all a throughput figure needs.

Prints one line per mode, "MODE tokens/s host_us ms": host_us is the
process CPU time per step of the timed loop (what the host spends launching,
and spinning while it waits), ms the wall time per step after 3 warm-up
steps (torch.compile compiles during the warm-up). A mode that fails prints
"MODE - - -" and its error on stderr, and the others still run.

Mode sdpa is the attention anchor (issue 23): F.scaled_dot_product_attention
alone, causal, at the model's shape [batch, heads, ctx, d/heads] in the
dtype (bf16: bfloat16 q, k, v), forward and backward as one training step
runs them, once per layer. It prints "sdpa fwd_ms fwdbwd_ms step_ms": one
forward call, one forward and backward, and the latter times the layers
(the attention time of a step, to set beside dp's attention kernels' time
per step from ncu or nsys).
"""
import argparse
import math
import sys
import time

import torch
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    for name, default in (("steps", 30), ("vocab", 50257), ("ctx", 1024), ("d", 768),
                          ("heads", 12), ("layers", 12), ("batch", 16), ("accum", 1)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--dtype", choices=("fp32", "tf32", "bf16"), default="bf16")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--lr", type=float, default=6e-4)
    return p.parse_args()


def model(V, T, D, H, L):
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)
            self.fc, self.proj = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, H, 3, D // H).permute(3, 0, 2, 1, 4)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
                mask = torch.ones(t, t, device=x.device, dtype=torch.bool).triu(1)
                y = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.o(y.transpose(1, 2).reshape(b, t, D))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(T, D)
            self.h = torch.nn.ModuleList(Block() for _ in range(L))
            self.lnf = torch.nn.LayerNorm(D)

        def forward(self, ids, targets, accum):
            x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
            for blk in self.h:
                x = blk(x)
            logits = self.lnf(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, V).float(), targets.view(-1)) / accum

    return GPT()


def bench(a, compiled):
    dev = "cuda"
    tf32 = a.dtype == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    m = model(a.vocab, a.ctx, a.d, a.heads, a.layers).to(dev)
    f = torch.compile(m) if compiled else m
    opt = torch.optim.AdamW(m.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    ids = torch.randint(0, min(a.vocab, 256), (a.accum, a.batch, a.ctx), device=dev)
    tg = torch.randint(0, min(a.vocab, 256), (a.accum, a.batch, a.ctx), device=dev)
    bf16 = a.dtype == "bf16"

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(a.accum):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = f(ids[i], tg[i], a.accum)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    n = max(1, a.steps - 3)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        step()
    c1 = time.process_time()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - w0) / n
    return a.accum * a.batch * a.ctx / wall, (c1 - c0) / n * 1e6, wall * 1e3


def sdpa(a):
    dev = "cuda"
    dt = {"bf16": torch.bfloat16}.get(a.dtype, torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    torch.manual_seed(0)
    shape = (a.batch, a.heads, a.ctx, a.d // a.heads)
    q, k, v = (torch.randn(shape, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    dy = torch.randn(shape, device=dev, dtype=dt)

    def timed(fn, n):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwdbwd():
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(y, (q, k, v), dy)

    n = max(10, a.steps)
    f, fb = timed(fwd, n), timed(fwdbwd, n)
    return f, fb, fb * a.layers


def main():
    a = parse()
    for mode in a.modes.split(","):
        try:
            if mode == "compile" and not hasattr(torch, "compile"):
                raise RuntimeError("torch %s has no torch.compile" % torch.__version__)
            if mode == "sdpa":
                print(mode, "%.4f %.4f %.3f" % sdpa(a), flush=True)
            else:
                print(mode, "%.0f %.1f %.3f" % bench(a, mode == "compile"), flush=True)
        except Exception as ex:  # report and go on: one anchor failing is not the whole run
            print(mode, "- - -", flush=True)
            print("%s: %s" % (mode, ex), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
