"""The GPU part of train_step.py: Megatron-core model, rollout, rollpack, the
training step and its checks. Imported only once megatron.core imports."""

import functools
import itertools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from megatron.core.transformer.transformer_config import TransformerConfig

import local_spec_inputs as lsi
import rollpack
from rollpack.recompute import RoutingUploader
from rollpack.replay import install_replay_targets, routing_agreement
from rollpack.trainer import TrainerClient
from train_step import PINNED_COMMIT, sequences

POOL = "megatron-example"
STEP = "train"
R2_STEP = "train-r2"


# -- Megatron: process groups and the model ----------------------------------

class SequenceParallelTorchNorm:
    """torch.nn.LayerNorm where the local spec's WrappedTorchNorm refuses
    sequence parallelism: a LayerNorm is per token, so it runs on a rank's
    slice of the sequence as is; its parameters are marked
    ``sequence_parallel`` so that Megatron's finalize_model_grads (the DDP
    wrapper of a full training loop) all-reduces their gradients over TP,
    as for apex's FusedLayerNorm."""

    def __new__(cls, config, hidden_size, eps=1e-5, **unused):
        norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        for p in norm.parameters():
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))
        norm.returns_residual = False
        return norm


def block_spec(cfg):
    """The local spec (dense layer 0, MoE after), with the LayerNorms
    swapped for SequenceParallelTorchNorm under sequence parallelism."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    spec = get_gpt_decoder_block_spec(cfg, False)
    if cfg.sequence_parallel:
        if spec.layer_norm is WrappedTorchNorm:
            spec.layer_norm = SequenceParallelTorchNorm
        for layer in spec.layer_specs:
            for name in ("input_layernorm", "pre_mlp_layernorm", "pre_cross_attn_layernorm"):
                if getattr(layer.submodules, name, None) is WrappedTorchNorm:
                    setattr(layer.submodules, name, SequenceParallelTorchNorm)
    return spec


def setup(args):
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp,
                                 pipeline_model_parallel_size=args.pp,
                                 expert_model_parallel_size=args.ep,
                                 expert_tensor_parallel_size=1)
    torch.manual_seed(args.seed)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    cfg = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=4,
        ffn_hidden_size=2 * args.hidden, num_moe_experts=args.experts,
        moe_router_topk=args.topk, moe_layer_freq=[0] + [1] * (args.layers - 1),
        moe_ffn_hidden_size=args.hidden, moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0, moe_token_dispatcher_type="alltoall",
        moe_enable_routing_replay=True, moe_router_dtype="fp32",
        tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
        expert_model_parallel_size=args.ep, expert_tensor_parallel_size=1,
        sequence_parallel=args.sequence_parallel, pipeline_dtype=torch.float32,
        params_dtype=torch.float32, variable_seq_lengths=True, hidden_dropout=0.0,
        attention_dropout=0.0, add_bias_linear=False, init_method_std=0.02)
    RouterReplay.global_router_replay_instances.clear()
    model = GPTModel(config=cfg,
                     transformer_layer_spec=block_spec(cfg),
                     vocab_size=args.vocab, max_sequence_length=args.max_tokens_per_rank,
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage(),
                     position_embedding_type="learned_absolute").cuda()
    routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
    instances = list(RouterReplay.global_router_replay_instances)
    if [r.router_replay for r in routers] != instances:
        raise RuntimeError("TopKRouters and RouterReplay instances are not in the same order")
    layers = [r.layer_number - 1 for r in routers]  # Megatron's layer_number is 1-based
    return model, routers, instances, layers


class Capture:
    """Forward hooks on the routers: the ids each one used (its routing map's
    K experts), one [rows, K] per forward, while ``on``."""

    def __init__(self, routers, k):
        self.on, self.ids = False, [[] for _ in routers]
        for i, r in enumerate(routers):
            r.register_forward_hook(functools.partial(self._hook, i, k))

    def _hook(self, i, k, module, inputs, output):
        if self.on:
            self.ids[i].append(output[1].float().topk(k, dim=1).indices)

    def start(self):
        self.ids, self.on = [[] for _ in self.ids], True

    def stop(self):
        self.on = False
        return self.ids


def set_live(instances):
    for inst in instances:
        inst.clear_router_replay_action()
        inst.clear_indices()


# -- rollout: the model records its own routing ------------------------------

def rollout(args, model, instances, layers):
    """{seq index: (tokens, experts [n, local layers, K] or None, logprobs [n]
    or None)} of this rank's stage."""
    first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    sp, tp = args.sequence_parallel, args.tp
    fb = get_forward_backward_func()
    out = {}
    model.eval()
    for i, toks in enumerate(sequences(args)):
        n = len(toks)
        padded = -(-n // tp) * tp if sp else n
        ids = torch.zeros(padded, dtype=torch.int64, device="cuda")
        ids[:n] = torch.from_numpy(toks).cuda()
        cu = torch.tensor([0, n], device="cuda")
        cup = torch.tensor([0, padded], device="cuda")
        x = {"input_ids": ids.view(1, -1) if first else None,
             "position_ids": lsi.position_ids(cup) if first else None,
             "attention_mask": lsi.block_causal_mask(cup),
             "labels": lsi.next_token_labels(ids, cu, cup) if last else None}

        def loss_func(output):
            lp = lsi.token_logprobs(-output.reshape(-1).float(), cup)
            return output.sum() * 0.0, {"logprobs": lp.detach()}

        def forward_step(data_iterator, m):
            b = next(data_iterator)
            return (m(b["input_ids"], b["position_ids"], b["attention_mask"], labels=b["labels"]),
                    loss_func)

        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        with torch.no_grad():
            store = fb(forward_step_func=forward_step, data_iterator=iter([x]), model=[model],
                       num_microbatches=1, seq_length=padded, micro_batch_size=1,
                       forward_only=True)
        recs = []
        for inst in instances:
            rec = inst.get_recorded_indices()
            if sp:
                parts = [torch.empty_like(rec) for _ in range(tp)]
                dist.all_gather(parts, rec.contiguous(), group=ps.get_tensor_model_parallel_group())
                rec = torch.cat(parts)
            recs.append(rec[:n].cpu().numpy())
        experts = np.stack(recs, axis=1) if recs else None
        lp = store[0]["logprobs"][:n].cpu().numpy() if last else None
        out[i] = (toks, experts, lp)
    set_live(instances)
    return out, layers


def merge_rollout(args, gathered):
    """rank 0: Samples from every stage's records (DP 0, TP 0 ranks)."""
    seqs = sequences(args)
    by_layer, lps = {}, {}
    for rec, layers in gathered:
        if rec is None:
            continue
        for i, (_, experts, lp) in rec.items():
            for j, layer in enumerate(layers):
                by_layer[(i, layer)] = experts[:, j, :]
            if lp is not None:
                lps[i] = lp
    samples = []
    for i, toks in enumerate(seqs):
        ex = np.stack([by_layer[(i, l)] for l in args.moe_layers], axis=1).astype(np.int16)
        loss_mask = np.ones(len(toks), np.float32)
        loss_mask[0] = 0.0  # nothing predicts a sequence's first token
        samples.append(rollpack.Sample("seq-%d" % i, toks, ex, 0, token_fields={
            "logprobs": lps[i].astype(np.float32), "loss_mask": loss_mask}))
    return samples


# -- rollpack: daemon, samples, step -----------------------------------------

class Daemon:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="rollpackd-megatron-")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--port-file", port_file],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            if os.path.exists(port_file) and open(port_file).read().strip():
                self.address = "127.0.0.1:%d" % int(open(port_file).read())
                return
            time.sleep(0.05)
        raise RuntimeError("rollpackd did not start (rc %s), log in %s"
                           % (self.proc.poll(), self.dir))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


def push_and_create(args, address, samples):
    spec = rollpack.ModelSpec(POOL, num_layers=args.layers, moe_layers=args.moe_layers,
                              num_experts=args.experts, topk=args.topk)
    with rollpack.Producer(address, POOL) as p:
        p.register_model(spec)
        p.put(samples)
    topo = dict(dp=args.dp, cp=1, tp=args.tp, pp=args.pp,
                max_tokens_per_rank=args.max_tokens_per_rank)
    if args.tp > 1:
        topo["sequence_parallel"] = args.sequence_parallel
    # reuse_samples: the samples stay for the R2 step after this one.
    with rollpack.Controller(address) as c:
        info = c.create_step(STEP, POOL, topology=topo, num_samples=len(samples),
                             reuse_samples=True)
    return info.num_microbatches, topo


def commit_r2(address, topo, sample_ids):
    """R2 (docs/recompute.md): the routing every rank uploaded becomes the
    samples' recompute routing; a step over the same samples replays it."""
    with rollpack.Controller(address) as c:
        done = c.commit_routing(STEP)
        c.release(STEP)
        c.create_step(R2_STEP, POOL, topology=topo,
                      sample_ids=sample_ids, replay_source="recompute")
    return int(done.samples)


# -- training -----------------------------------------------------------------

class Trainer:
    def __init__(self, args, model, routers, instances, address):
        self.args, self.model, self.instances, self.address = args, model, instances, address
        self.first, self.last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        self.rank = (ps.get_data_parallel_rank(), 0, ps.get_tensor_model_parallel_rank(),
                     ps.get_pipeline_model_parallel_rank())
        self.capture = Capture(routers, args.topk)
        self.fb = get_forward_backward_func()
        self.replay, self.record, self.step_id = True, False, STEP
        self.seen = []  # (micro-batch, inputs) in forward order
        self.recorded = []  # RECORD: [rows, local layers, K] per micro-batch, in forward order

    def client(self):
        return TrainerClient(self.address, self.step_id, self.rank,
                             device=torch.cuda.current_device(), all_fields=self.last)

    def _take_records(self):
        # RECORD keeps one micro-batch's ids per router: read them before the
        # next micro-batch's forward overwrites them.
        self.recorded.append(torch.stack(
            [inst.get_recorded_indices() for inst in self.instances], dim=1).clone())

    def _loss(self, x, output):
        lp = lsi.token_logprobs(-output.reshape(-1).float(), x["cu_seqlens_padded"])
        mask, old = x["loss_mask"], x["old_logprobs"]
        ratio = torch.exp(lp - old)
        loss = -(ratio * mask).sum() / mask.sum().clamp(min=1)
        diff = ((lp - old).abs() * mask).max()
        return loss, {"max_abs_logprob_diff": diff.detach(), "tokens": mask.sum().detach()}

    def _forward_step(self, data_iterator, model):
        mb = next(data_iterator)
        if self.record and self.seen:
            self._take_records()
        x = lsi.model_inputs(mb, tp_size=self.args.tp,
                             sequence_parallel=self.args.sequence_parallel,
                             first_stage=self.first, last_stage=self.last)
        if self.replay:
            install_replay_targets(x["replay_targets"], RouterReplay,
                                   action=RouterReplayAction.REPLAY_FORWARD)
        elif self.record:
            RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        self.seen.append((mb, x))
        out = model(x["input_ids"], x["position_ids"], x["attention_mask"], labels=x["labels"])
        return out, functools.partial(self._loss, x)

    def step(self, mbs=None, *, replay=True, forward_only=False, record=False):
        """One forward-backward over the step's micro-batches: from a new
        TrainerClient (mbs None) or from micro-batches already on the GPU.
        Returns (seconds, loss dicts, agreement per local layer)."""
        self.replay, self.record, self.seen, self.recorded = replay, record, [], []
        set_live(self.instances)
        self.model.zero_grad()
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        client = self.client() if mbs is None else None
        try:
            it = iter(mbs) if mbs is not None else iter(client)
            head = next(it)
            self.capture.start()
            store = self.fb(forward_step_func=self._forward_step, data_iterator=itertools.chain(
                [head], it), model=[self.model], num_microbatches=head.num_microbatches,
                seq_length=self.args.max_tokens_per_rank, micro_batch_size=1,
                forward_only=forward_only)
            if record:
                self._take_records()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        finally:
            if client is not None:
                client.close()
        dist.barrier()
        ids = self.capture.stop()
        set_live(self.instances)
        return seconds, store, self._agreement(ids)

    def _agreement(self, ids):
        out = []
        for l, per_mb in enumerate(ids):
            counted = differ = 0
            if len(per_mb) != len(self.seen):
                raise RuntimeError("router %d ran %d forwards for %d micro-batches"
                                   % (l, len(per_mb), len(self.seen)))
            for live, (mb, x) in zip(per_mb, self.seen):
                a = routing_agreement(live, x["replay_targets"][l], mask=mb.replay_mask)
                counted += int(a.rows_counted.sum())
                differ += int(a.rows_differ.sum())
            out.append({"rows": counted, "agreement": 1.0 - differ / counted if counted else None})
        return out

    def perturb_routers(self, routers, scale):
        """The drift an RL step makes: noise on every router's weight, the
        same on every rank (router weights are replicated)."""
        with torch.no_grad():
            for r in routers:
                g = torch.Generator(device="cpu").manual_seed(self.args.seed + r.layer_number)
                noise = torch.randn(r.weight.shape, generator=g).to(r.weight)
                r.weight.add_(noise * (scale * float(r.weight.std())))


def run(args):
    model, routers, instances, layers = setup(args)
    rank = dist.get_rank()
    report = {"megatron_commit": os.environ.get("MEGATRON_COMMIT", PINNED_COMMIT),
              "torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "world_size": dist.get_world_size(),
              "topology": {"dp": args.dp, "tp": args.tp, "pp": args.pp, "ep": args.ep,
                           "sequence_parallel": args.sequence_parallel},
              "model": {"layers": args.layers, "moe_layers": args.moe_layers,
                        "experts": args.experts, "topk": args.topk, "hidden": args.hidden,
                        "vocab": args.vocab, "sequences": args.num_seqs}}
    rec, _ = rollout(args, model, instances, layers)
    keep = ps.get_data_parallel_rank() == 0 and ps.get_tensor_model_parallel_rank() == 0
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (rec if keep else None, layers))
    daemon, addr = None, [None, None]
    if rank == 0:
        daemon = Daemon(args.rollpackd)
        samples = merge_rollout(args, gathered)
        num_mb, topo = push_and_create(args, daemon.address, samples)
        addr = [daemon.address, num_mb]
        report["rollout_tokens"] = int(sum(len(s.tokens) for s in samples))
        report["step_microbatches"] = num_mb
    dist.broadcast_object_list(addr, src=0)
    tr = Trainer(args, model, routers, instances, addr[0])
    mine = {"rank": rank, "coords": list(tr.rank), "moe_layers": layers}
    try:
        model.train()
        t, store, agr = tr.step()  # replay, weights as in the rollout
        mbs = [mb for mb, _ in tr.seen]
        mine["replay"] = agr
        mine["microbatches"] = len(mbs)
        if tr.last:
            mine["max_abs_logprob_diff"] = max(float(d["max_abs_logprob_diff"]) for d in store)
            mine["loss_tokens"] = int(sum(float(d["tokens"]) for d in store))
        delivered, cached = [], []
        for _ in range(args.repeats):
            delivered.append(tr.step()[0])
            cached.append(tr.step(mbs)[0])
        mine["step_seconds"] = {"first": t, "delivery_median": statistics.median(delivered),
                                "on_gpu_median": statistics.median(cached),
                                "delivery": delivered, "on_gpu": cached}
        mine["live_unchanged"] = tr.step(mbs, replay=False, forward_only=True)[2]
        tr.perturb_routers(routers, args.perturb)
        mine["live_perturbed"] = tr.step(mbs, replay=False, forward_only=True)[2]
        _, store, mine["replay_perturbed"] = tr.step(mbs, forward_only=True)
        if tr.last:
            mine["perturbed_max_abs_logprob_diff"] = max(
                float(d["max_abs_logprob_diff"]) for d in store)
        # R2: the recompute (old-policy) forward with the perturbed weights
        # records its routing, every rank uploads it, rank 0 commits it and
        # creates a step over the same samples that delivers it.
        tr.step(mbs, replay=False, forward_only=True, record=True)
        with RoutingUploader(addr[0], STEP, tr.rank) as up:
            for mb, ids in zip(mbs, tr.recorded):
                up.upload(mb, ids)
        dist.barrier()
        if rank == 0:
            report["r2_committed_samples"] = commit_r2(addr[0], topo,
                                                       sorted(s.sample_id for s in samples))
        dist.barrier()
        tr.step_id = R2_STEP
        mine["r2_live"] = tr.step(replay=False, forward_only=True)[2]
        mine["r2_replay"] = tr.step(forward_only=True)[2]
    finally:
        ranks = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        if daemon is not None:
            daemon.stop()
    ok = True
    if rank == 0:
        report["ranks"] = ranks
        checks = report["checks"] = {}

        def overall(r, key):
            rows = sum(x["rows"] for x in r[key])
            same = sum(x["rows"] * x["agreement"] for x in r[key] if x["rows"])
            return same / rows if rows else None
        checks["replay_agreement_is_1"] = all(
            x["agreement"] == 1.0 for r in ranks
            for key in ("replay", "replay_perturbed", "r2_replay")
            for x in r[key] if x["rows"])
        checks["live_after_perturbation_below_1"] = all(
            overall(r, "live_perturbed") is None or overall(r, "live_perturbed") < 1.0
            for r in ranks)
        checks["r2_live_matches_recompute"] = all(
            x["agreement"] == 1.0 for r in ranks for x in r["r2_live"] if x["rows"])
        diffs = [r["max_abs_logprob_diff"] for r in ranks if "max_abs_logprob_diff" in r]
        checks["logprobs_equal_rollout"] = bool(diffs) and max(diffs) <= args.logprob_atol
        checks["logprob_atol"] = args.logprob_atol
        ok = all(v for k, v in checks.items() if k != "logprob_atol")
        report["ok"] = ok
        text = json.dumps(report, indent=1, sort_keys=True)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text)
    flag = [ok]
    dist.broadcast_object_list(flag, src=0)
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0 if flag[0] else 1
