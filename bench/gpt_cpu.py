#!/usr/bin/python3
"""bench/gpt_cpu.py - the PyTorch eager anchor of bench/gpt_cpu.sh.

models/gpt2*.dp written the way a PyTorch user writes it: learned token and
position embeddings, pre-LayerNorm blocks of causal self-attention (packed
qkv, the T x T scores masked and softmaxed, as nanoGPT's non-flash path) and
a 4x MLP with the tanh GELU, a final LayerNorm, the LM head tied to the token
embedding, cross entropy, AdamW(betas 0.9/0.95, eps 1e-8), clip_grad_norm_
1.0; grad_accum micro-batches per optimizer step. Eager mode, float32, CPU.
The data is one fixed in-memory batch of random tokens (dp reads its shard:
that costs dp, not PyTorch).

Started by mpirun with N > 1 processes it is DDP over gloo (rank and size
from Open MPI's environment; every rank takes global_batch / N samples).
Prints one line:  ms_per_step MEAN rss_mib PEAK   (mean over the timed steps
after the warm-up steps; peak resident memory of this process).
Run with Debian's interpreter (/usr/bin/python3: torch 1.13, CPU).
"""
import argparse
import math
import os
import resource
import time

import torch
import torch.nn.functional as F


class GPT(torch.nn.Module):
    def __init__(self, vocab, ctx, d, heads, layers):
        super().__init__()
        self.heads = heads
        P = lambda *s, std=0.02: torch.nn.Parameter(torch.randn(*s) * std)  # noqa: E731
        Z = lambda *s: torch.nn.Parameter(torch.zeros(*s))  # noqa: E731
        O = lambda *s: torch.nn.Parameter(torch.ones(*s))  # noqa: E731
        self.wte, self.wpe = P(vocab, d), P(ctx, d, std=0.01)
        self.blocks = torch.nn.ModuleList()
        for _ in range(layers):
            b = torch.nn.Module()
            b.ln1g, b.ln1b, b.ln2g, b.ln2b = O(d), Z(d), O(d), Z(d)
            b.wqkv, b.bqkv, b.wo, b.bo = P(d, 3 * d), Z(3 * d), P(d, d), Z(d)
            b.wfc, b.bfc, b.wproj, b.bproj = P(d, 4 * d), Z(4 * d), P(4 * d, d), Z(d)
            self.blocks.append(b)
        self.lnfg, self.lnfb = O(d), Z(d)
        self.mask = torch.ones(ctx, ctx, dtype=torch.bool).tril()  # not a buffer: DDP cannot send bool

    def attention(self, qkv):
        B, T, C3 = qkv.shape
        H, hd = self.heads, C3 // (3 * self.heads)
        q, k, v = qkv.view(B, T, H, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)  # [B,H,T,hd]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = F.softmax(att.masked_fill(~self.mask[:T, :T], float("-inf")), dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, H * hd)

    def forward(self, ids, targets):
        d = self.wte.shape[1]
        x = F.embedding(ids, self.wte) + self.wpe
        for b in self.blocks:
            h = F.layer_norm(x, (d,), b.ln1g, b.ln1b, 1e-5)
            x = x + self.attention(h @ b.wqkv + b.bqkv) @ b.wo + b.bo
            h = F.layer_norm(x, (d,), b.ln2g, b.ln2b, 1e-5)
            x = x + F.gelu(h @ b.wfc + b.bfc, approximate="tanh") @ b.wproj + b.bproj
        x = F.layer_norm(x, (d,), self.lnfg, self.lnfb, 1e-5)
        logits = x @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("vocab", 256), ("ctx", 128), ("d", 256), ("heads", 4), ("layers", 4),
                          ("global-batch", 16), ("grad-accum", 1), ("steps", 10),
                          ("warmup", 2), ("threads", 1)):
        ap.add_argument("--" + name, type=int, default=default)
    a = ap.parse_args()
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    model = GPT(a.vocab, a.ctx, a.d, a.heads, a.layers)
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.0)
    mb = a.global_batch // world // a.grad_accum
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, a.vocab, (a.grad_accum, mb, a.ctx), generator=g)
    tgt = torch.randint(0, a.vocab, (a.grad_accum, mb, a.ctx), generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        for i in range(a.grad_accum):
            if world > 1 and i + 1 < a.grad_accum:
                with model.no_sync():
                    (model(ids[i], tgt[i]) / a.grad_accum).backward()
            else:
                (model(ids[i], tgt[i]) / a.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(a.warmup):
        step()
    if world > 1:
        torch.distributed.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    ms = (time.perf_counter() - t0) * 1e3 / max(a.steps, 1)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if world > 1:
        t = torch.tensor([ms, rss], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        ms, rss = t.tolist()
    if rank == 0:
        print(f"ms_per_step {ms:.3f} rss_mib {rss:.1f}")


if __name__ == "__main__":
    main()
