"""rollpack's replay targets through Megatron-core's own routing code, on a
GPU (issue 22). Exit 0: every check passed; 77: skipped (no CUDA, or no
Megatron-LM checkout); 1: a check failed.

Drives, over every rank (dp=1, cp=2, tp=2 with sequence parallel, pp=2) of
two steps served by a real rollpackd (a model with one MTP layer; samples
with and without MTP routing, tests/test_megatron_replay.py's StepFixture):

1. Megatron's RouterReplay + topk_routing_with_score_function
   (megatron/core/transformer/moe/moe_utils.py; softmax, and sigmoid as
   DeepSeek-V3 routes), each rank in 1F1B order:
   forward with REPLAY_FORWARD under activation checkpointing (Megatron's
   tensor_parallel.checkpoint when it runs here, else torch's reentrant
   one), recompute backward with REPLAY_BACKWARD, then RECORD read back with
   rollpack.replay.recorded_routing;
2. the same through a real TopKRouter built with moe_enable_routing_replay
   (gating weight = identity, so the router's logits are the test's), if
   TopKRouter builds in this environment (no Transformer Engine needed);
3. static buffers: targets written into [max_rows, layers, K] buffers by
   rollpack.static_targets (one per micro-batch in flight) and installed as
   views (Megatron's set_static_buffer + set_target_indices); without that
   module, Megatron's own RouterReplay.set_global_static_buffers with the
   micro-batch's targets copied in;
4. R2 (docs/recompute.md): a third step's ranks RECORD through Megatron's
   RouterReplay and upload what it recorded; the routing is committed and
   replayed by Megatron's RouterReplay in a step of another topology
   (test_megatron_replay.r2_round_trip).

Megatron-LM is not part of this repository. Get the pinned commit's
megatron/core (Python only; no build, no Transformer Engine):

    git clone https://github.com/NVIDIA/Megatron-LM && cd Megatron-LM
    git checkout d98e8a64ddf34856e74b24714e3bedb2f5a39553
    # or, from a bare mirror: git --git-dir=<mirror> archive <commit> megatron/core | tar -x -C DIR

then, in client/python, with rollpackd and librollpack_trainer.so built:

    ROLLPACK_MEGATRON_PATH=<dir holding megatron/> ROLLPACKD=../../build/bin/rollpackd \\
        python3 tests/gpu_megatron.py [--json out.json]

megatron.core needs packaging, einops and numpy next to a recent torch
(2.11 tested; Debian's 1.13 cannot import it). Tested at the pinned commit
on an H100: docs/integrations.md, "Tested against Megatron-core".
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

PINNED_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
SKIP = 77

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _skip(why):
    print("SKIP: %s" % why)
    sys.exit(SKIP)


def _megatron_commit(path):
    stamp = os.path.join(path, "MEGATRON_COMMIT")
    if os.path.exists(stamp):
        with open(stamp) as f:
            return f.read().strip()
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _init_single_process_group():
    import torch
    if not torch.distributed.is_initialized():
        store = tempfile.NamedTemporaryFile(prefix="rollpack-gloo-", delete=False).name
        os.unlink(store)
        torch.distributed.init_process_group("gloo", init_method="file://" + store, rank=0,
                                             world_size=1)
    return torch.distributed.group.WORLD


def _megatron_checkpoint(report, device):
    """Megatron's activation checkpointing (tensor_parallel.checkpoint), if
    it runs in a single process here; else torch's reentrant checkpoint."""
    import torch
    from tests.test_megatron_replay import torch_checkpoint
    try:
        from megatron.core import tensor_parallel

        def ckpt(fn, x):
            return tensor_parallel.checkpoint(fn, False, x)
        x = torch.randn(4, 3, device=device, requires_grad=True)
        calls = []

        def fn(z):
            calls.append(1)
            return z * 2
        ckpt(fn, x).sum().backward()
        if len(calls) != 2 or not torch.equal(x.grad, torch.full_like(x, 2)):
            raise RuntimeError("recomputed %d times, grad %s" % (len(calls) - 1, x.grad))
        report["checkpoint"] = "megatron.core.tensor_parallel.checkpoint"
        return ckpt
    except Exception as e:  # noqa: BLE001 - any failure: fall back, say why
        report["checkpoint"] = "torch.utils.checkpoint (reentrant): Megatron's failed: %r" % e
        return torch_checkpoint


def _functional_stack(RouterReplay, Action, topk_routing, device, score_function="softmax"):
    from tests.test_megatron_replay import K, Stack

    def make():
        rr = RouterReplay()

        def route(z):
            return topk_routing(z, K, use_pre_softmax=False, score_function=score_function,
                                router_replay=rr)
        return rr, route
    return Stack(RouterReplay, Action, make, device)


def _topk_router_stack(RouterReplay, Action, report, device):
    """A Stack of real TopKRouters, or None (with the reason in report)."""
    import torch
    from tests.test_megatron_replay import E, K, N, Stack
    try:
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.transformer.moe.router import TopKRouter
        from megatron.core.transformer.transformer_config import TransformerConfig
        world = _init_single_process_group()
        pgs = ProcessGroupCollection(tp=world, cp=world, tp_cp=world, tp_dp_cp=world)
        config = TransformerConfig(
            num_layers=N, hidden_size=E, num_attention_heads=4, num_moe_experts=E,
            moe_router_topk=K, moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
            moe_enable_routing_replay=True, moe_router_dtype="fp32", params_dtype=torch.float32,
            add_bias_linear=False, use_cpu_initialization=True)

        def make():
            router = TopKRouter(config=config, pg_collection=pgs).to(device)
            with torch.no_grad():
                router.weight.copy_(torch.eye(E))  # logits = the input, exactly

            def route(z):
                probs, rmap = router(z.view(z.shape[0], 1, E))
                return probs, rmap
            return router.router_replay, route
        RouterReplay.global_router_replay_instances.clear()
        rr, route = make()
        z = torch.randn(8, E, device=device)
        _, rmap = route(z)
        live = torch.zeros_like(rmap).scatter(1, torch.topk(z, K, dim=1).indices, True)
        if rr is None or not torch.equal(rmap, live):
            raise RuntimeError("TopKRouter smoke test: router_replay %r, live routing %s"
                               % (rr, "differs" if rr is not None else "?"))
        report["topk_router"] = "built (no Transformer Engine)"
        return Stack(RouterReplay, Action, make, device)
    except Exception as e:  # noqa: BLE001 - reported, and the other parts still run
        report["topk_router"] = "not built: %r" % e
        traceback.print_exc()
        return None


def _global_static_installer(num_buffers, max_rows, layers, device):
    """Without rollpack.static_targets: Megatron's own
    set_global_static_buffers over a buffer the micro-batch's targets are
    copied into, each instance's target a view of its layer."""
    import torch
    from rollpack.replay import install_replay_targets
    from tests.test_megatron_replay import K
    ring = [torch.zeros((max_rows, layers, K), dtype=torch.int64, device=device)
            for _ in range(num_buffers)]

    def install(mb, replay_cls, action, mtp):
        buf = ring[mb.index % num_buffers]
        rows = mb.replay_indices.shape[1]
        buf[:rows].copy_(mb.replay_indices.permute(1, 0, 2))
        n = len(mb.replay_layers)
        instances = list(replay_cls.global_router_replay_instances)
        for l, inst in enumerate(instances[:n]):
            inst.set_static_buffer(buf[:, l, :])
        return install_replay_targets([buf[:rows, l, :] for l in range(n)], replay_cls,
                                      action=action, **mtp)
    return install


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a dry run of this script's plumbing (CI never runs it)")
    args = ap.parse_args()

    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        _skip("no CUDA device")
    device = torch.device(args.device)
    path = os.environ.get("ROLLPACK_MEGATRON_PATH")
    if not path or not os.path.isdir(os.path.join(path, "megatron", "core")):
        _skip("ROLLPACK_MEGATRON_PATH (a directory holding megatron/core at %s) is unset or "
              "has no megatron/core" % PINNED_COMMIT)
    sys.path.insert(0, path)
    report = {"megatron_path": path, "megatron_commit": _megatron_commit(path),
              "pinned_commit": PINNED_COMMIT, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "checks": {}}
    # Import errors are failures: the checkout is there, so it must load.
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function
    from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction

    from rollpack import _capi, trainer
    from tests import test_megatron_replay as t
    _capi.abi_version()
    fx = t.StepFixture().start()
    failures = []
    try:
        ckpt = _megatron_checkpoint(report, device)
        stacks = [("RouterReplay + topk_routing_with_score_function",
                   _functional_stack(RouterReplay, RouterReplayAction,
                                     topk_routing_with_score_function, device)),
                  ("RouterReplay + topk_routing_with_score_function(sigmoid)",
                   _functional_stack(RouterReplay, RouterReplayAction,
                                     topk_routing_with_score_function, device, "sigmoid"))]
        router_stack = _topk_router_stack(RouterReplay, RouterReplayAction, report, device)
        if router_stack is not None:
            stacks.append(("TopKRouter(moe_enable_routing_replay)", router_stack))
        try:
            from rollpack.static_targets import install_static_buffer  # noqa: F401
            have_static = _capi.has_static_targets()
        except ImportError:
            have_static = False
        report["static_buffers"] = ("rollpack.static_targets (write_replay_targets + "
                                    "install_static_buffer)" if have_static else
                                    "Megatron set_static_buffer views, targets copied in")
        for name in ("mtp", "live"):
            case = fx.cases[name]
            for rank in fx.ranks():
                mbs = list(trainer.TrainerClient(
                    fx.daemon.address, name, rank,
                    torch.cuda.current_device() if args.device == "cuda" else "cpu"))
                layers = len(case.layers_of_stage(rank[3]))
                max_rows = t.MAX_TOKENS // t.TOPO["tp"]
                in_flight = t.TOPO["pp"] - rank[3]
                runs = [(label, stack, None) for label, stack in stacks]
                if have_static:
                    install = t.static_ring_installer(in_flight, max_rows, layers, device)
                else:
                    install = _global_static_installer(in_flight, max_rows, layers, device)
                runs.append(("static buffers, " + stacks[0][0], stacks[0][1], install))
                for label, stack, inst in runs:
                    key = "%s | %s" % (name, label)
                    try:
                        start = time.perf_counter()
                        counts = t.drive_rank(stack, case, rank, mbs, install=inst,
                                              checkpoint=ckpt, seed=sum(rank))
                        if args.device == "cuda":
                            torch.cuda.synchronize()
                        agg = report["checks"].setdefault(key, {"ranks": 0, "seconds": 0.0})
                        agg["ranks"] += 1
                        agg["seconds"] += time.perf_counter() - start
                        for k, v in counts.items():
                            agg[k] = agg.get(k, 0) + v
                    except Exception as e:  # noqa: BLE001 - collect every failure
                        failures.append("%s rank %s: %r" % (key, rank, e))
                        traceback.print_exc()
                    finally:
                        if hasattr(RouterReplay, "clear_global_static_buffers"):
                            RouterReplay.clear_global_static_buffers()
        # R2: Megatron's RECORD on every rank, uploaded, committed, replayed
        # by Megatron's RouterReplay in another topology (docs/recompute.md).
        try:
            start = time.perf_counter()
            counts = t.r2_round_trip(
                fx, lambda: stacks[0][1], trainer,
                torch.cuda.current_device() if args.device == "cuda" else "cpu",
                checkpoint=ckpt)
            counts["seconds"] = time.perf_counter() - start
            report["checks"]["r2 | " + stacks[0][0]] = counts
        except Exception as e:  # noqa: BLE001
            failures.append("r2 round trip: %r" % (e,))
            traceback.print_exc()
    finally:
        fx.cleanup()
    report["failures"] = failures
    for key, agg in sorted(report["checks"].items()):
        print("%-75s %s" % (key, json.dumps(agg, sort_keys=True)))
    for k in ("megatron_commit", "torch", "device", "checkpoint", "topk_router", "static_buffers"):
        print("%s: %s" % (k, report.get(k)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    # Every rank of both steps, for every stack that was built.
    ranks = sum(1 for _ in t.StepFixture.ranks())
    labels = [label for label, _ in stacks] + ["static buffers, " + stacks[0][0]]
    short = ["%s | %s" % (name, label) for name in ("mtp", "live") for label in labels
             if report["checks"].get("%s | %s" % (name, label), {}).get("ranks") != ranks]
    if failures or short:
        print("FAILED: %d failures; incomplete: %s" % (len(failures), short))
        for f in failures:
            print("  " + f)
        return 1
    print("OK: every rank, every check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
