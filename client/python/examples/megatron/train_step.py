"""One RL training step of a small Megatron-core MoE GPTModel fed by rollpack
(issue 40), for any world size under torchrun. README.md here says how to
run it; exit 0 = every check passed, 77 = skipped (no CUDA, no megatron),
1 = a check failed.

1. Rollout: the model itself (the same weights on every rank) runs a
   forward of each sequence with Megatron's RouterReplay RECORD; each
   stage's recorded ids (sequence-parallel slices gathered over TP) and the
   last stage's per-token log-probabilities become rollpack Samples, which
   rank 0 puts into a rollpackd it started ($ROLLPACKD or --rollpackd).
2. Training: rank 0 creates a step for the training topology; every rank
   iterates TrainerClient for its (dp, 0, tp, pp), turns each THD
   micro-batch into the local spec's inputs (local_spec_inputs.py), installs
   the replay targets with rollpack.replay.install_replay_targets
   (REPLAY_FORWARD) and runs get_forward_backward_func with a PPO-style loss.
3. Checks (JSON on rank 0): routing agreement of what each router used
   against the rollout's routing per MoE layer and rank (1.0 when
   replaying, also after a weight perturbation; below 1.0 without replay
   after it), and the training forward's log-probabilities against the
   rollout's with unchanged weights; step time with delivery through
   TrainerClient against the same step with the micro-batches already on
   the GPU.
"""

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # client/python

SKIP = 77
PINNED_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def parse_args(argv, world_size):
    """Arguments checked against the world size; raises SystemExit(2) with
    the reason (argparse's error) when the topology cannot be built."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--cp", type=int, default=1,
                    help="only 1: context parallelism needs Transformer Engine (README.md)")
    ap.add_argument("--sequence-parallel", action="store_true",
                    help="Megatron's sequence parallelism (needs --tp > 1)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers; layer 0 is dense")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--num-seqs", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=17)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument("--max-tokens-per-rank", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--perturb", type=float, default=0.05,
                    help="relative size of the noise added to the router weights")
    ap.add_argument("--repeats", type=int, default=3, help="timed steps of each kind")
    ap.add_argument("--logprob-atol", type=float, default=1e-4)
    ap.add_argument("--rollpackd", default=os.environ.get("ROLLPACKD"))
    ap.add_argument("--json", help="rank 0 writes the report here")
    a = ap.parse_args(argv)
    for name in ("tp", "pp", "ep", "cp", "layers", "experts", "topk", "num_seqs", "repeats"):
        if getattr(a, name) < 1:
            ap.error("--%s must be >= 1, got %d" % (name.replace("_", "-"), getattr(a, name)))
    if a.cp != 1:
        ap.error("--cp %d: context parallelism needs Transformer Engine's attention; the local "
                 "spec has none (README.md says how it would run)" % a.cp)
    if world_size % (a.tp * a.pp):
        ap.error("world size %d is not a multiple of tp*pp = %d" % (world_size, a.tp * a.pp))
    if world_size % (a.ep * a.pp):
        ap.error("world size %d is not a multiple of ep*pp = %d (expert tensor parallel 1)"
                 % (world_size, a.ep * a.pp))
    if a.sequence_parallel and a.tp == 1:
        ap.error("--sequence-parallel needs --tp > 1")
    if a.layers % a.pp or a.layers < 2:
        ap.error("--layers %d: at least 2 (a dense first layer and a MoE layer), a multiple "
                 "of --pp %d" % (a.layers, a.pp))
    if a.experts % a.ep or not 1 <= a.topk <= a.experts:
        ap.error("--experts %d must be a multiple of --ep %d and >= --topk %d"
                 % (a.experts, a.ep, a.topk))
    if a.vocab % a.tp or a.hidden % 4:
        ap.error("--vocab must be a multiple of --tp, --hidden of 4 (heads)")
    if not 2 <= a.min_len <= a.max_len or a.max_len > a.max_tokens_per_rank:
        ap.error("need 2 <= --min-len <= --max-len <= --max-tokens-per-rank")
    a.dp = world_size // (a.tp * a.pp)
    a.moe_layers = list(range(1, a.layers))
    return a


def sequences(args):
    """The rollout's prompts+completions: varied lengths, fixed seed."""
    import numpy as np
    rng = np.random.default_rng(args.seed)
    return [rng.integers(1, args.vocab, size=int(rng.integers(args.min_len, args.max_len + 1)))
            .astype(np.int32) for _ in range(args.num_seqs)]


def main(argv=None):
    import torch
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = parse_args(argv, world)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return SKIP
    try:
        importlib.import_module("megatron.core.parallel_state")
    except ImportError as e:
        print("SKIP: megatron.core does not import (%s): put megatron/core of %s on PYTHONPATH"
              % (e, PINNED_COMMIT))
        return SKIP
    if not args.rollpackd:
        print("--rollpackd or $ROLLPACKD: the rollpackd binary rank 0 starts", file=sys.stderr)
        return 2
    from megatron_step import run
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
