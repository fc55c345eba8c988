#!/usr/bin/python3
"""torch_powersgd.py - PyTorch's own PowerSGD on a 2-rank gloo DDP run of an MLP:
the reference for dp's `compress powersgd(...)` (tests/compress.sh).

Two processes (torch.multiprocessing, gloo, CPU) train tests/torch_ref.py's
MLP (dp's layout: weight NAME.w [in, out], y = x @ w + b) from dp's initial
weights on the same samples: rank r reads positions r, r + W, ... of the
global batch, as dp's sampler (runtime/data_sampler.c). DDP's gradients go
through torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook with
PowerSGDState(matrix_approximation_rank=--rank, start_powerSGD_iter=--start,
min_compression_rate=--min-rate, use_error_feedback=True, warm_start=True
(--no-warm-start: False),
orthogonalization_epsilon=0). Rank 0 prints "step loss" (%.9g, steps from 0,
the mean over the global batch before the step's update).

Q: the hook draws its first Q from its own generator; here its warm-start
memory is filled instead, at the first compressed step, with dp's initial
Q: per matrix NAME.w the values dp's INIT program writes into
NAME.w.powersgd_q [m, r] (normal(0, 1) of the counter-based generator keyed
by (seed, "NAME.w.powersgd_q", element): torch_ref.init_normal, the port of
runtime/init.c), in the order the hook lays its Qs out (the bucket's
gradients that it compresses, in the bucket's order). The hook then
orthogonalises them as it does any warm-started Q.

--no-warm-start: PowerSGDState(warm_start=False): the hook draws a new Q at
every compressed step (torch.manual_seed from its own generator, then
torch.randn per Q, then orthogonalises it). Here each of those torch.randn
calls returns dp's draw for that step instead (runtime/powersgd.h): for
optimizer step k, normal(0, 1) of the counter-based generator keyed by
(mix64(seed ^ mix64(k + 1)), "NAME.powersgd_q", element), the initial Q's
scheme with the step's seed (torch_ref.init_normal); the hook's state.iter
is k while it runs step k's buckets.

--uncompressed NAME,...: the weights NAME.w are all_reduced whole, as dp's
`compress none` in block NAME leaves them (the hook's _should_compress says
no to their shape, which must be no other weight's).

The workers are forked, not spawned, after the data is read: a spawned
worker imported torch again (1.7 CPU-s each) and read Fashion-MNIST again;
forked, they share the parent's import and arrays (nothing has started a
torch thread or a CUDA context before the fork).
"""
import argparse
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ref  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self, names, weights):
        super().__init__()
        self.names = names
        self.params = torch.nn.ParameterList()
        for n in names:
            self.params.append(torch.nn.Parameter(torch.tensor(weights[n + ".w"])))
            self.params.append(torch.nn.Parameter(torch.tensor(weights[n + ".b"])))

    def forward(self, h):
        for k in range(len(self.names)):
            h = torch.addmm(self.params[2 * k + 1], h, self.params[2 * k])
            if k + 1 < len(self.names):
                h = F.relu(h)
        return h


def hook_with_dp_q(args, weights_names, shapes):
    """powerSGD_hook, with dp's initial Q put in its warm-start memory the
    first time it compresses a bucket."""
    name_of = {}
    for n, shp in zip(weights_names, shapes):
        name_of.setdefault(tuple(shp), []).append(n)

    def compressed_names(state, bucket):
        """(name, m, r) of the bucket's gradients the hook compresses, in
        its order (one weight per shape: its Qs by shape keep the bucket's)."""
        out = []
        for g in bucket.gradients():
            n, m = g.shape[0], g.numel() // g.shape[0]
            r = min(n, m, state.matrix_approximation_rank)
            if g.dim() < 2 or not psgd._should_compress(n, m, r, state.min_compression_rate)[0]:
                continue
            names = name_of[tuple(g.shape)]
            if len(names) != 1:
                sys.exit(f"torch_powersgd: {len(names)} weights of shape {list(g.shape)}")
            out.append((names[0], m, r))
        return out

    def cold_hook(state, bucket):
        """warm_start=False: the hook's torch.randn per Q returns dp's draw
        of this step (runtime/powersgd.h)."""
        if state.iter < state.start_powerSGD_iter:
            return psgd.powerSGD_hook(state, bucket)
        ks = torch_ref.mix64_int(args.seed ^ torch_ref.mix64_int(state.iter + 1))
        draws = [torch.tensor(torch_ref.init_normal(ks, n + ".powersgd_q", 0, m * r)).view(1, m, r)
                 for n, m, r in compressed_names(state, bucket)]
        randn = torch.randn

        def dp_randn(*shape, **kw):
            q = draws.pop(0)
            if tuple(shape) != tuple(q.shape):
                sys.exit(f"torch_powersgd: the hook drew {list(shape)}, dp's Q is {list(q.shape)}")
            return q
        torch.randn = dp_randn
        try:
            fut = psgd.powerSGD_hook(state, bucket)
        finally:
            torch.randn = randn
        if draws:
            sys.exit(f"torch_powersgd: {len(draws)} of dp's Qs not drawn by the hook")
        return fut

    if not args.warm_start:
        return cold_hook

    def hook(state, bucket):
        idx = bucket.index()
        if state.iter >= state.start_powerSGD_iter and idx not in state.q_memory_dict:
            qs = compressed_names(state, bucket)
            n_of = {nm: shp[0] for nm, shp in zip(weights_names, shapes)}
            state.p_memory_dict[idx] = torch.empty(sum(n_of[nm] * r for nm, _, r in qs))
            state.q_memory_dict[idx] = torch.tensor(np.concatenate(
                [torch_ref.init_normal(args.seed, nm + ".powersgd_q", 0, m * r)
                 for nm, m, r in qs]).astype(np.float32))
        return psgd.powerSGD_hook(state, bucket)

    return hook


def worker(rank, args, store, data):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=args.world)
    weights = torch_ref.read_safetensors(args.init)
    names = args.layers.split(",")
    if args.uncompressed:
        whole = {tuple(weights[n + ".w"].shape) for n in args.uncompressed.split(",")}
        if len(whole) != len(args.uncompressed.split(",")) or any(
                tuple(weights[n + ".w"].shape) in whole for n in names
                if n not in args.uncompressed.split(",")):
            sys.exit("torch_powersgd: --uncompressed weights need shapes of their own")
        should = psgd._should_compress

        def should_compress(n, m, r, rate):
            if (n, m) in whole:
                return False, n * m, (n + m) * r
            return should(n, m, r, rate)

        psgd._should_compress = should_compress
    model = MLP(names, weights)
    ddp = DDP(model, bucket_cap_mb=25)
    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                               start_powerSGD_iter=args.start,
                               min_compression_rate=args.min_rate, use_error_feedback=True,
                               warm_start=args.warm_start, orthogonalization_epsilon=0)
    ddp.register_comm_hook(state, hook_with_dp_q(args, [n + ".w" for n in names],
                                                 [weights[n + ".w"].shape for n in names]))
    x_all, y_all = data
    x_all, y_all = torch.tensor(x_all), torch.tensor(y_all, dtype=torch.int64)
    sampler = torch_ref.Sampler(args.seed, x_all.shape[0], args.global_batch)
    params = list(model.parameters())
    named = [(f"{n}.{k}", model.params[2 * i + j]) for i, n in enumerate(names)
             for j, k in enumerate("wb")]
    opt = torch.optim.AdamW(torch_ref.param_groups(args, named), lr=args.lr,
                            betas=(args.beta1, args.beta2), eps=args.eps,
                            weight_decay=args.weight_decay)
    out = open(args.out, "w") if rank == 0 else None
    for step in range(args.steps):
        idx = torch.from_numpy(sampler.batch(step))[rank::args.world]
        loss = F.cross_entropy(ddp(x_all[idx]), y_all[idx])
        opt.zero_grad(set_to_none=False)
        loss.backward()  # the hook's all_reduces: gradients averaged over the ranks
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        for group in opt.param_groups:
            group["lr"] = torch_ref.group_lr(torch_ref.lr_at(args, step), 1.0)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if out:
            print(f"{step} {mean.item() / args.world:.9g}", file=out, flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init", required=True, help="safetensors file of dp's initial weights")
    ap.add_argument("--layers", default="fc1,fc2,fc3,head")
    ap.add_argument("--data", default="idx")
    ap.add_argument("--images", default=torch_ref.FMNIST + "train-images-idx3-ubyte.gz")
    ap.add_argument("--labels", default=torch_ref.FMNIST + "train-labels-idx1-ubyte.gz")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rank", type=int, default=4, help="matrix_approximation_rank")
    ap.add_argument("--start", type=int, default=10, help="start_powerSGD_iter")
    ap.add_argument("--min-rate", type=float, default=1.0, help="min_compression_rate")
    ap.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                    help="warm_start=False: a fresh Q every compressed step (dp's draw)")
    ap.add_argument("--uncompressed", default="", help="layers whose weights are not compressed")
    torch_ref.add_train_args(ap, 0.01)
    args = ap.parse_args()
    args.synth_n, args.synth_dim, args.synth_classes = 4096, 784, 10
    data = torch_ref.load_data(args)
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(worker, args=(args, os.path.join(d, "store"), data), nprocs=args.world,
                           join=True, start_method="fork")


if __name__ == "__main__":
    main()
